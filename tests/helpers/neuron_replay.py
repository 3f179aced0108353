#!/usr/bin/env python3
"""Stand-in for ``neuron-monitor``: replays a recorded ndjson stream, one report per line.

Usage (like the real tool, plus replay flags)::

    neuron_replay.py -c monitor.conf.json [--file STREAM] [--period S] [--once]
                     [--inject malformed|truncated|error|stderr-flood|exit-after=N ...]
                     [--log FILE] [--ignore-sigterm]

- ``-c`` is required and must be a neuron-monitor config (``period``, ``neuron_runtimes``
  with ``tag_filter`` and ``metrics``, ``system_metrics``); an invalid one exits 2 with a
  message on stderr, as a bad config would.
- The period is ``--period`` (or ``NEURON_REPLAY_PERIOD``), else the config's ``period``
  ("1s", "50ms"). The file is ``--file`` (or ``NEURON_REPLAY_FILE``), else the recorded
  trn1.2xlarge stream next to this script. It loops forever unless ``--once``.
- ``--inject`` (repeatable; also ``NEURON_REPLAY_INJECT``, comma-separated), after the
  first report of each pass: ``malformed`` a line that is not JSON, ``truncated`` the next
  report cut in half, ``error`` a copy of it with top-level and runtime ``error`` set,
  ``exit-after=N`` exit with status 3 after N reports (stderr says why); and, before the
  first report, ``stderr-flood`` 1 MiB of stderr lines (blocks unless the reader drains it).
- ``--log FILE`` (or ``NEURON_REPLAY_LOG``) appends "start <pid> <monotonic>" per run.
- ``--pid-map FILE`` (or ``NEURON_REPLAY_PID_MAP``): read again before each report, lines
  "<recorded pid> <live pid>"; a runtime of the recording with that pid (and its
  ``neuron_runtime_tag``, when it is the pid) is reported under the live pid, so tests can
  make a recorded runtime the process of a job they started.

Every line is flushed; SIGTERM exits at once with status 143 (``--ignore-sigterm``: ignored,
so only SIGKILL stops it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

HERE = Path(__file__).resolve().parent
DEFAULT_FILE = HERE.parent / "fixtures" / "neuron" / "trn1.2xlarge_wandb_stream.ndjson"


def _fail(msg: str) -> NoReturn:
    sys.stderr.write(f"neuron-monitor: {msg}\n")
    sys.stderr.flush()
    sys.exit(2)


def _period(value: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*", value)
    if not m:
        _fail(f"bad period {value!r}")
    return float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)


def _check_config(path: str) -> dict[str, Any]:
    try:
        conf = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        _fail(f"cannot read config {path}: {exc}")
    if not isinstance(conf, dict) or not isinstance(conf.get("period"), str):
        _fail("config: 'period' missing")
    runtimes = conf.get("neuron_runtimes")
    if not isinstance(runtimes, list) or not runtimes:
        _fail("config: 'neuron_runtimes' missing")
    for rt in runtimes:
        if not isinstance(rt.get("tag_filter"), str) or not all("type" in m for m in rt.get("metrics", [])):
            _fail("config: bad neuron_runtimes entry")
    if not all(isinstance(m, dict) and "type" in m for m in conf.get("system_metrics", [])):
        _fail("config: bad system_metrics")
    _period(conf["period"])
    checked: dict[str, Any] = conf
    return checked


def _map_pids(line: str, path: str) -> str:
    """``line`` with its runtimes' recorded pids replaced as the pid-map file says."""
    try:
        pairs = [p.split() for p in Path(path).read_text().splitlines()]
        mapping = {int(p[0]): int(p[1]) for p in pairs if len(p) == 2}
        obj = json.loads(line)
    except (OSError, ValueError):
        return line  # no map yet, or not a report: as recorded
    for rt in obj.get("neuron_runtime_data", []) if isinstance(obj, dict) else []:
        live = mapping.get(rt.get("pid"))
        if live is not None:
            if rt.get("neuron_runtime_tag") == str(rt["pid"]):
                rt["neuron_runtime_tag"] = str(live)
            rt["pid"] = live
    return json.dumps(obj, separators=(",", ":"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config-file", required=True)
    ap.add_argument("--file", default=os.environ.get("NEURON_REPLAY_FILE", str(DEFAULT_FILE)))
    ap.add_argument("--period", type=float, default=None)
    ap.add_argument("--once", action="store_true")
    ap.add_argument("--inject", action="append", default=[])
    ap.add_argument("--log", default=os.environ.get("NEURON_REPLAY_LOG"))
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--pid-map", default=os.environ.get("NEURON_REPLAY_PID_MAP"))
    args = ap.parse_args()

    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_sigterm else (lambda *_: os._exit(143)))
    conf = _check_config(args.config_file)
    period = args.period
    if period is None and os.environ.get("NEURON_REPLAY_PERIOD"):
        period = float(os.environ["NEURON_REPLAY_PERIOD"])
    if period is None:
        period = _period(conf["period"])
    injects = [*args.inject, *filter(None, os.environ.get("NEURON_REPLAY_INJECT", "").split(","))]
    exit_after = next((int(i.split("=", 1)[1]) for i in injects if i.startswith("exit-after=")), None)
    if args.log:
        with open(args.log, "a") as f:
            f.write(f"start {os.getpid()} {time.monotonic():.6f}\n")

    if "stderr-flood" in injects:
        for n in range(16384):
            sys.stderr.write(f"neuron-monitor: debug line {n:05d} {'x' * 40}\n")
        sys.stderr.write("neuron-monitor: flood done\n")
        sys.stderr.flush()
    reports = [line for line in Path(args.file).read_text().splitlines() if line.strip()]
    sent = 0

    def emit(line: str) -> None:
        if args.pid_map:
            line = _map_pids(line, args.pid_map)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        time.sleep(period)

    while True:
        for i, line in enumerate(reports):
            emit(line)
            sent += 1
            if exit_after is not None and sent >= exit_after:
                sys.stderr.write(f"neuron-monitor: simulated failure after {sent} reports\n")
                sys.stderr.flush()
                return 3
            if i == 0:
                nxt = reports[1 % len(reports)]
                if "malformed" in injects:
                    emit("this is not json {")
                if "truncated" in injects:
                    emit(nxt[: len(nxt) // 2])
                if "error" in injects:
                    obj = json.loads(nxt)
                    obj["error"] = "injected top-level error"
                    for rt in obj.get("neuron_runtime_data", []):
                        rt["error"] = "injected runtime error"
                    emit(json.dumps(obj, separators=(",", ":")))
        if args.once:
            return 0


if __name__ == "__main__":
    sys.exit(main())
