"""``wattline run``: start a command inside a job window on this host.

The command gets ``$WATTLINE_JOB_ID`` and ``$WATTLINE_EVENTS`` (see
:mod:`wattline.workloads.events`); the Python API joins the job through them. Signals
are forwarded (Ctrl-C included, without doubling what the terminal already sent to
the child), and the command's exit status is recorded and returned. While the command
runs, a heartbeat renews the job's lease (:mod:`.heartbeat`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from wattline.agent.settings import AgentSettings
from wattline.workloads.embedded import embedded_session
from wattline.workloads.events import (
    ENV_EVENTS,
    ENV_JOB_ID,
    SATURATED,
    EventBuilder,
    EventsFileReader,
    JobSpec,
    UnitAccumulator,
)
from wattline.workloads.heartbeat import Heartbeat
from wattline.workloads.session import CollectorSink, EventSink
from wattline.workloads.usage import JobUse

log = logging.getLogger(__name__)

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


@dataclass
class RunRequest:
    """What to run and how to tag it."""

    command: list[str]
    spec: JobSpec
    saturated_after_s: float | None = None
    units_from_stdout: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def devices_from_env(env: Mapping[str, str]) -> list[str]:
    """Devices a job holds by default: CUDA_VISIBLE_DEVICES GPUs, NEURON_RT_VISIBLE_CORES cores."""
    devices: list[str] = []
    cuda = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if cuda and cuda not in {"-1", "none", "NoDevFiles"}:
        devices += [f"gpu:{d.strip()}" for d in cuda.split(",") if d.strip()]
    cores = env.get("NEURON_RT_VISIBLE_CORES", "").strip()
    for part in filter(None, (p.strip() for p in cores.split(","))):
        if "-" in part:
            lo, hi = part.split("-", 1)
            devices += [f"neuroncore:{i}" for i in range(int(lo), int(hi) + 1)]
        else:
            devices.append(f"neuroncore:{part}")
    return devices


def parse_devices(text: str) -> list[str]:
    """``--devices 0,1`` / ``gpu:GPU-uuid`` / ``neuroncore:0-3`` into device claims."""
    devices: list[str] = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        kind, sep, ident = item.partition(":")
        if not sep:
            kind, ident = ("gpu", item)
        if kind not in {"gpu", "neuroncore", "neuron"}:
            raise ValueError(f"--devices: unknown device kind {kind!r} in {item!r} (gpu, neuroncore, neuron)")
        if kind == "neuroncore" and "-" in ident:
            lo, hi = ident.split("-", 1)
            devices += [f"neuroncore:{i}" for i in range(int(lo), int(hi) + 1)]
        else:
            devices.append(f"{kind}:{ident}")
    return devices


def resolve_gpu_claims(claims: list[str], root: Path = Path("/")) -> list[str]:
    """Turn ``gpu:<index>`` claims into ``gpu:<UUID>``, the device id samples carry.

    Indexes are NVML's (PCI bus order, as ``nvidia-smi`` shows them; set
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA agrees). Without NVML the claims stay as given
    and the report charges no GPU to them.
    """
    if not any(c.startswith("gpu:") and c[4:].isdigit() for c in claims):
        return claims
    from wattline.agent.sources.base import SourceUnavailable
    from wattline.agent.sources.nvml import NvmlSource

    source = NvmlSource(root)
    try:
        by_index = {dict(ch.info).get("index", ""): ch.device for ch in source.discover()}
    except SourceUnavailable as exc:
        log.warning("cannot map GPU indexes to UUIDs (%s): job devices stay %s", exc, ",".join(claims))
        return claims
    finally:
        source.close()
    return [f"gpu:{by_index[c[4:]]}" if c.startswith("gpu:") and c[4:] in by_index else c for c in claims]


def exit_status(returncode: int) -> int:
    """Shell convention: 128+N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class JobRunner:
    """Runs one command in a job window and feeds its events to ``sink``."""

    def __init__(
        self, request: RunRequest, sink: EventSink, use: Callable[[EventBuilder, int], JobUse] | None = None
    ) -> None:
        self.request = request
        self.sink = sink
        self.use = use  #: builds the recorder of the job's device use, rooted at the command's pid
        self.builder = EventBuilder(request.spec)
        self.units = UnitAccumulator(self.builder, sink.send)
        self.pattern = re.compile(request.units_from_stdout) if request.units_from_stdout else None
        self.open_ns = 0
        self.close_ns = 0
        self.saturation_marked = False

    def run(self) -> int:
        """Run the command to completion; returns its exit status (shell convention)."""
        workdir = Path(tempfile.mkdtemp(prefix="wattline-job-"))
        events_path = workdir / "events"
        events_path.touch(mode=0o600)
        env = {**os.environ, **self.request.env, ENV_JOB_ID: self.request.spec.job_id, ENV_EVENTS: str(events_path)}
        reader = EventsFileReader(events_path, self.units.add, self._phase)
        opened = self.builder.open()
        self.open_ns = opened.time_ns
        self.sink.send([opened])
        try:
            child = subprocess.Popen(
                self.request.command,
                env=env,
                stdout=subprocess.PIPE if self.pattern else None,
                text=True if self.pattern else None,
                bufsize=1 if self.pattern else -1,
            )
        except OSError as exc:
            self.sink.send([self.builder.close(127)])
            shutil.rmtree(workdir, ignore_errors=True)
            raise FileNotFoundError(f"cannot start {self.request.command[0]!r}: {exc.strerror}") from None
        heartbeat = Heartbeat(self.builder, self.sink.send).start()
        use = self.use(self.builder, child.pid).start() if self.use is not None else None
        previous = {sig: signal.signal(sig, self._forwarder(child)) for sig in FORWARDED}
        pump = None
        if self.pattern is not None and child.stdout is not None:
            pump = threading.Thread(target=self._pump_stdout, args=(child.stdout,), daemon=True)
            pump.start()
        try:
            while True:
                try:
                    returncode = child.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    reader.poll()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            heartbeat.stop()
            if use is not None:
                use.stop()
        if pump is not None:
            pump.join(timeout=5)
        reader.poll()
        self.units.flush()
        self.close_ns = time.time_ns()
        self._saturated_after()
        status = exit_status(returncode)
        scope = use.scope if use is not None else ()
        self.sink.send([self.builder.close(status, self.close_ns, scope)])
        shutil.rmtree(workdir, ignore_errors=True)
        return status

    def _phase(self, name: str, time_ns: int | None) -> None:
        self.units.flush()
        if name == SATURATED:
            self.saturation_marked = True
        self.sink.send([self.builder.phase(name, time_ns)])

    def _saturated_after(self) -> None:
        after = self.request.saturated_after_s
        if after is None or self.saturation_marked:
            return
        at = self.open_ns + int(after * 1e9)
        if at < self.close_ns:
            self.sink.send([self.builder.phase(SATURATED, at)])

    def _pump_stdout(self, stream: IO[str]) -> None:
        assert self.pattern is not None
        for line in stream:
            sys.stdout.write(line)
            sys.stdout.flush()
            match = self.pattern.search(line)
            if match is None:
                continue
            try:
                self.units.add(float(match.group(1)) if match.groups() else 1.0)
            except (TypeError, ValueError):  # not a count, or not finite and >= 0: the line counts nothing
                continue

    @staticmethod
    def _forwarder(child: subprocess.Popen[str] | subprocess.Popen[bytes]) -> Callable[[int, FrameType | None], None]:
        def forward(signum: int, _frame: FrameType | None) -> None:
            if signum == signal.SIGINT and _terminal_delivered():
                return  # the terminal already sent Ctrl-C to the child's process group
            if child.poll() is None:
                child.send_signal(signum)

        return forward


def _terminal_delivered() -> bool:
    """True when we are the foreground process group of a terminal (Ctrl-C hit us both)."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


def run_job(
    request: RunRequest,
    settings: AgentSettings,
    doc: Mapping[str, Any] | None = None,
    collectors: list[str] | None = None,
    store_url: str | None = None,
    on_kept: Callable[[str], None] | None = None,
) -> int:
    """Run ``request`` under a job window; returns the command's exit status.

    With ``collectors``, job events go there (a host agent samples, with the same TLS /
    token settings as the agent), through the host's outbox: when no collector
    acknowledges them within a few seconds of the command's end, ``on_kept`` gets one
    line saying where they wait. Otherwise this process samples the host itself into the
    local store ``store_url``.
    """
    sink: EventSink
    if collectors:
        settings.collectors = list(collectors)
        sink = CollectorSink(settings.validate(), on_kept=on_kept)
    else:
        sink = embedded_session(store_url, settings, doc)
    discovery = getattr(sink, "discovery", None)

    def use(builder: EventBuilder, pid: int) -> JobUse:
        return JobUse(builder, sink.send, [pid], discovery=discovery, settings=settings, doc=doc)

    try:
        return JobRunner(request, sink, use).run()
    finally:
        sink.close()
