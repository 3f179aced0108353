"""Fault injection with real processes on loopback: nothing lost, nothing counted twice.

The last test kills both collectors in the middle of a ``wattline run`` and restarts them
after it ended: the command's exit status comes back promptly, and its job events reach the
store through the host's outbox (delivered by the agent), with the job's energy right.

A ``wattline agent`` process (RAPL on a sysfs tree whose counters this test advances at a
known power, 10 Hz, disk spool) streams to two ``wattline collector`` processes while the
test SIGKILLs and restarts the collectors, stops and restarts the store, and SIGKILLs
and restarts the agent itself.

The truth: every record the agent ever wrote to its spool (``spool_ledger``). Afterwards the
store must hold exactly those samples: the same keys (device, interval end), the same
joules, no extra point, none missing. Independently, each agent stream must tile its
timeline with no gap and its joules must add up to its last ``cumulative_j``.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from influxd_peer import influxd_config
from procs import CLI, Proc, clean_env, start_collector
from servers import Daemon, Influxd, find_binary, free_port
from spool_ledger import Key, Ledger
from store_rows import energy_rows, job_event_rows
from sysfs_trees import PowerAdvancer, Zone, powercap_tree

from wattline.stores.sqlite.store import SqliteStore

HOST = "fault-host"
POWER_W = {"intel-rapl:0": 50.0, "intel-rapl:0:1": 6.5}
DEVICES = {"intel-rapl:0": "package-0", "intel-rapl:0:1": "package-0/dram"}
START_UJ = 10**11


def powered_host(tmp_path: Path) -> PowerAdvancer:
    """The host's RAPL tree (package-0 and its dram at START_UJ) in tmp_path/host, advanced at POWER_W."""
    tree = powercap_tree(
        tmp_path / "host", [Zone("intel-rapl:0", "package-0", START_UJ), Zone("intel-rapl:0:1", "dram", START_UJ)]
    )
    return PowerAdvancer(tree, POWER_W, START_UJ)


@dataclass
class Outages:
    """Wall-clock lengths of each kind of outage, for the report."""

    spans: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    _open: dict[str, float] = field(default_factory=dict)

    def down(self, what: str) -> None:
        """Collectors and influxd count until serving again; the agent until restarted (+ ~1.3 s start-up)."""
        self._open[what] = time.monotonic()

    def up(self, what: str) -> None:
        self.spans[what].append(time.monotonic() - self._open.pop(what))

    def text(self) -> str:
        return ", ".join(f"{k} {len(v)}x ({' + '.join(f'{s:.1f}' for s in v)} s)" for k, v in self.spans.items())


class OwnInfluxd:
    """An influxd of this test only, restartable on the same port with the same data."""

    def __init__(self, root: Path) -> None:
        self.binary = find_binary("INFLUXD", "influxd", "influxdb")
        self.root = root
        self.port, rpc = free_port(), free_port()
        self.config = root / "influxdb.conf"
        self.config.write_text(influxd_config(root, self.port, rpc))
        self.url = f"http://127.0.0.1:{self.port}"
        self.daemon = self.start()

    def start(self) -> Daemon:
        daemon = Daemon([self.binary, "-config", str(self.config)], self.root / "influxd.log", self.url)
        if not daemon.wait_ready("/ping"):
            pytest.fail(f"influxd did not start:\n{daemon.log_tail()}", pytrace=False)
        self.daemon = daemon
        return daemon

    def query(self, influxql: str, db: str) -> list[dict[str, Any]]:
        return Influxd(self.daemon).query(influxql, db)


@pytest.fixture
def own_influxd(tmp_path: Path) -> Iterator[OwnInfluxd]:
    root = tmp_path / "influxd"
    root.mkdir()
    server = OwnInfluxd(root)
    try:
        yield server
    finally:
        server.daemon.stop()


class Rig:
    """The agent and two collectors, with the truth machinery around them."""

    def __init__(self, tmp_path: Path, store_args: list[str]) -> None:
        self.tmp = tmp_path
        self.store_args = store_args
        self.counters = powered_host(tmp_path)
        self.tree = self.counters.root
        self.spool = tmp_path / "spool"
        self.spool.mkdir(mode=0o700)
        self.outbox = tmp_path / "outbox"  # job events of `wattline run` that no collector took yet
        self.ledger = Ledger(self.spool, tmp_path / "ledger", HOST)
        self.ports = [free_port(), free_port()]
        self.collectors: list[Proc] = [self.collector(i) for i in range(2)]
        self.outages = Outages()
        self.agent_starts = 0
        self.agent_killed = 0.0
        self.agent = self.start_agent()

    def collector(self, i: int) -> Proc:
        log = self.tmp / f"collector-{i}.log"
        return start_collector(self.ports[i], self.store_args, log)

    def start_agent(self) -> Proc:
        self.agent_starts += 1
        return Proc(
            ["agent", "--host-id", HOST, "--sysfs-root", str(self.tree), "--source", "rapl", "--interval", "0.1",
             "--batch-interval", "0.2", "--push-timeout", "2", "--failback", "2", "--spool-dir", str(self.spool),
             "--outbox-dir", str(self.outbox),
             *(f"--collector=127.0.0.1:{p}" for p in self.ports)],
            self.tmp / "agent.log",
        )  # fmt: skip

    def kill_collector(self, i: int) -> None:
        self.collectors[i].kill9()
        self.outages.down(f"collector-{i}")

    def restart_collector(self, i: int) -> None:
        self.collectors[i] = self.collector(i)
        self.outages.up(f"collector-{i}")

    def kill_agent(self) -> None:
        self.agent.kill9()
        self.agent_killed = time.monotonic()
        self.outages.down("agent (kill to restart)")

    def restart_agent(self) -> None:
        time.sleep(max(0.0, self.agent_killed + 0.5 - time.monotonic()))  # down for 0.5 s at least
        self.agent = self.start_agent()
        self.outages.up("agent (kill to restart)")

    def replayed(self) -> int:
        """Samples the restarted agents found unacknowledged in the spool (from their logs)."""
        pattern = re.compile(r"(\d+) batches \((\d+) samples\) of \d+ earlier streams left unacknowledged")
        return sum(int(m.group(2)) for m in pattern.finditer(self.agent.log()))

    def finish(self) -> None:
        """Graceful agent stop (it flushes its spool), then the collectors."""
        deadline = time.monotonic() + 60  # a loaded CI box: the last start may still be importing
        while self.agent.log().count(" sampling every ") < self.agent_starts and time.monotonic() < deadline:
            time.sleep(0.05)
        status = self.agent.terminate(timeout_s=30)
        log = self.agent.log()
        assert status == 0, log[-3000:]
        for proc in self.collectors:
            assert proc.terminate() == 0, proc.log()[-3000:]
        self.counters.close()
        self.ledger.close()
        for text in [log, *(p.log() for p in self.collectors)]:
            assert "Traceback" not in text, text[-5000:]
        assert "0 dropped, 0 batches left" in log.splitlines()[-1], log[-2000:]

    def close(self) -> None:
        self.counters.close()
        self.ledger.stop.set()
        for proc in [self.agent, *self.collectors]:
            proc.kill9()


def at(t0: float, t: float) -> None:
    """Sleep until ``t`` seconds after ``t0``."""
    time.sleep(max(0.0, t0 + t - time.monotonic()))


def check(rig: Rig, stored: dict[Key, tuple[str, int, float, float]], label: str) -> dict[str, int | float]:
    """Compare the store to the ledger, check each stream's tiling; print and return the figures."""
    produced = rig.ledger.samples()
    lost = sorted(set(produced) - set(stored))
    extra = sorted(set(stored) - set(produced))
    differ = [k for k in set(produced) & set(stored) if produced[k] != stored[k]]
    streams: dict[tuple[str, str], list[tuple[int, int, float, float]]] = defaultdict(list)
    for (device, end), (stream, start, energy, cumulative) in stored.items():
        streams[(stream, device)].append((start, end, energy, cumulative))
    gaps = 0
    counter_error = 0.0
    for (_stream, device), rows in streams.items():
        rows.sort(key=lambda r: r[1])
        gaps += sum(1 for a, b in itertools.pairwise(rows) if b[0] != a[1])
        assert math.fsum(r[2] for r in rows) == pytest.approx(rows[-1][3], rel=1e-9, abs=1e-9)
        # The counters' truth: the zone's power over the stream's span (one 10 ms write of slack each end).
        watts = POWER_W["intel-rapl:0" if device == "package-0" else "intel-rapl:0:1"]
        span_s = (rows[-1][1] - rows[0][0]) / 1e9
        counter_error = max(counter_error, abs(rows[-1][3] - watts * span_s) / (watts * span_s))
    figures: dict[str, int | float] = {
        "produced": len(produced),
        "stored": len(stored),
        "lost": len(lost),
        "duplicated": len(extra),
        "different": len(differ),
        "streams": len({s for s, _ in streams}),
        "gaps": gaps,
        "energy_produced_j": round(math.fsum(v[2] for v in produced.values()), 6),
        "energy_stored_j": round(math.fsum(v[2] for v in stored.values()), 6),
    }
    print(
        f"\n[{label}] samples produced {figures['produced']}, stored {figures['stored']}, lost {len(lost)}, "
        f"duplicated {len(extra)}, different {len(differ)}; energy produced {figures['energy_produced_j']} J, "
        f"stored {figures['energy_stored_j']} J; {figures['streams']} agent streams ({rig.agent_starts} starts), "
        f"gaps within streams {gaps}, worst stream vs counter truth {counter_error:.2%}; "
        f"replayed from the spool after restarts {rig.replayed()}; outages: {rig.outages.text()}"
    )
    assert produced, "the agent produced nothing"
    assert lost == [], f"lost {len(lost)}: {lost[:5]}"
    assert extra == [], f"stored but never produced {len(extra)}: {extra[:5]}"
    assert differ == [], differ[:5]
    assert gaps == 0
    assert figures["streams"] == rig.agent_starts
    assert counter_error < 0.05
    return figures


def run_schedule(rig: Rig, steps: list[tuple[float, Callable[[], None]]]) -> None:
    t0 = time.monotonic()
    for t, action in steps:
        at(t0, t)
        action()


def test_faults_influxdb(tmp_path: Path, own_influxd: OwnInfluxd) -> None:
    db = "faults"
    rig = Rig(tmp_path, ["--store", own_influxd.url, "--influx-api", "v1", "--influx-database", db])
    outages = rig.outages

    def influx_down() -> None:
        own_influxd.daemon.stop()
        outages.down("influxd")

    def influx_up() -> None:
        own_influxd.start()
        outages.up("influxd")

    try:
        run_schedule(
            rig,
            [
                (2.5, lambda: rig.kill_collector(0)),  # the preferred one, mid-stream
                (4.0, lambda: rig.restart_collector(0)),  # serving ~1.5 s later; the agent fails back
                (6.5, influx_down),  # storage gone: both collectors answer UNAVAILABLE
                (9.5, influx_up),
                (11.0, rig.kill_agent),
                (12.0, rig.restart_agent),  # replays what the dead process left
                (14.5, lambda: rig.kill_collector(1)),
                (14.6, lambda: rig.kill_collector(0)),  # no collector at all...
                (15.5, rig.kill_agent),  # ...and the agent dies with a spool full of unacknowledged batches
                (16.0, rig.restart_agent),
                (17.0, lambda: rig.restart_collector(1)),
                (18.5, lambda: rig.restart_collector(0)),
                (20.5, rig.kill_agent),
                (21.0, rig.restart_agent),
                (24.0, lambda: None),
            ],
        )
        rig.finish()
    finally:
        rig.close()
    rows = own_influxd.query(
        f"SELECT energy_j, start_ns, cumulative_j, stream FROM energy WHERE host = '{HOST}' GROUP BY device", db
    )
    stored = {
        (r["device"], int(r["time"])): (r["stream"], int(r["start_ns"]), r["energy_j"], r["cumulative_j"]) for r in rows
    }
    assert len(stored) == len(rows)
    check(rig, stored, "InfluxDB 1.x")


def test_faults_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "wattline.db"
    rig = Rig(tmp_path, ["--store", f"sqlite:///{db}"])
    try:
        run_schedule(
            rig,
            [
                (2.0, lambda: rig.kill_collector(0)),
                (3.0, rig.kill_agent),
                (3.5, rig.restart_agent),
                (4.0, lambda: rig.restart_collector(0)),
                (7.0, lambda: rig.kill_collector(1)),
                (7.1, lambda: rig.kill_collector(0)),
                (8.0, rig.kill_agent),
                (8.5, rig.restart_agent),
                (9.5, lambda: rig.restart_collector(0)),
                (11.0, lambda: rig.restart_collector(1)),
                (14.0, lambda: None),
            ],
        )
        rig.finish()
    finally:
        rig.close()
    with SqliteStore(db) as store:
        rows = energy_rows(store, host=HOST)
    stored = {(r["device"], r["time_ns"]): (r["stream"], r["start_ns"], r["energy_j"], r["cumulative_j"]) for r in rows}
    assert len(stored) == len(rows)
    check(rig, stored, "SQLite")


#: One unit every 0.2 s for 6 s (each with its own time stamp), then exit status 3.
UNITS_30_THEN_3 = (
    "import os, sys, time\n"
    "for _ in range(30):\n"
    "    with open(os.environ['WATTLINE_EVENTS'], 'a') as f:\n"
    "        f.write(f'units 1 {time.time():.6f}\\n')\n"
    "    time.sleep(0.2)\n"
    "sys.exit(3)\n"
)


def test_faults_collector_down_during_a_run(tmp_path: Path) -> None:
    db = tmp_path / "wattline.db"
    rig = Rig(tmp_path, ["--store", f"sqlite:///{db}"])
    env = {**clean_env(), "WATTLINE_AGENT_OUTBOX_DIR": str(rig.outbox)}
    command = [
        *CLI,
        "run",
        "--host-id",
        HOST,
        "--job-id",
        "mid-run",
        *(f"--collector=127.0.0.1:{p}" for p in rig.ports),
    ]
    try:
        t0 = time.monotonic()
        while " sampling every " not in rig.agent.log():  # the agent covers the whole job window
            assert time.monotonic() - t0 < 60, rig.agent.log()[-3000:]
            time.sleep(0.05)
        wrapper = subprocess.Popen(
            [*command, "--", sys.executable, "-c", UNITS_30_THEN_3], env=env, stderr=subprocess.PIPE, text=True
        )

        def stored_units() -> float:
            with SqliteStore(db) as store:
                return sum(e["fields"].get("units", 0.0) for e in job_event_rows(store, "mid-run"))

        while stored_units() < 3:  # the run is under way and its first events are stored...
            assert time.monotonic() - t0 < 30, "the run's events never reached the store"
            time.sleep(0.1)
        rig.kill_collector(0)  # ...when every collector dies
        rig.kill_collector(1)
        _, err = wrapper.communicate(timeout=60)
        returned, returned_ns = time.monotonic(), time.time_ns()
        rig.restart_collector(0)
        rig.restart_collector(1)
        deadline = time.monotonic() + 30
        while [p for p in rig.outbox.iterdir() if p.name != "holders"]:  # the agent delivers the run's outbox
            assert time.monotonic() < deadline, rig.agent.log()[-3000:]
            time.sleep(0.1)
        rig.finish()
    finally:
        rig.close()
    print(f"\n[collector down during a run] wrapper returned {returned - t0:.1f} s after its start: {err.strip()}")
    assert wrapper.returncode == 3, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("wattline: collector unreachable"), err
    assert str(rig.outbox) in lines[0]
    with SqliteStore(db) as store:
        rows = energy_rows(store, host=HOST)
    stored = {(r["device"], r["time_ns"]): (r["stream"], r["start_ns"], r["energy_j"], r["cumulative_j"]) for r in rows}
    check(rig, stored, "SQLite, collector down during a run")
    # alone on its host, the job is charged the host: its events' delivery is under test, not its CPU time
    out = subprocess.run(
        [*CLI, "report", "mid-run", "--json", "--share-rule", "exclusive", "--store", f"sqlite:///{db}"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["job"]["closed"] and report["job"]["exit_code"] == 3
    assert report["units"]["total"] == 30
    listed = subprocess.run(
        [*CLI, "jobs", "--json", "--store", f"sqlite:///{db}"], capture_output=True, text=True, env=env
    )
    job = next(j for j in json.loads(listed.stdout) if j["id"] == "mid-run")
    after_end_s = (returned_ns - job["start_ns"]) / 1e9 - job["duration_s"]
    print(f"exit status returned {after_end_s:.1f} s after the command ended")
    assert after_end_s < 6  # a 3 s bounded flush (the old code: 30 s, then exit status 1)
    # The counters' truth: both zones at POWER_W over the job's window, as its stored open and close give it.
    energy = report["warmup"]["energy_j"] + report["measured"]["energy_j"]
    with SqliteStore(db) as stored_events:
        times = {e.event: e.time_ns for e in stored_events.job_events("mid-run") if e.event in ("open", "close")}
    truth = sum(POWER_W.values()) * (times["close"] - times["open"]) / 1e9
    print(f"job energy {energy:.2f} J, truth {truth:.2f} J ({energy / truth - 1:+.2%})")
    assert energy == pytest.approx(truth, rel=0.01)
