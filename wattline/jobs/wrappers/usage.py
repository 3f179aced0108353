"""Record a job's use of each accelerator it runs on, and of the host's CPU (KIND_USE job events).

While a job runs, its wrapper (``wattline run``, or the Job API when it opens its own
job) asks the per-process sources every second how much of each device every process used
since the previous ask (NVML per-process utilization samples, neuron-monitor per-runtime
NeuronCore utilization; :class:`wattline.agent.sources.use.DeviceUse`), sums that over the
job's processes (:class:`.processes.ProcessTree`) and, every ``period_s``, sends one USE
event per device the job's processes ran on or used: ``job_use`` (the job's processes) and
``device_use`` (every process), same unit, their means over
``(time_ns - use_period_ns, time_ns]``. Each period it also sends the job's CPU time against
the host's (device ``cpu:host``, :mod:`wattline.agent.usage.cpu_use`; the process tree's from
``/proc/PID/stat``, :class:`.processes.TreeCpu`), from the job's open to the command's end,
as the pod and Slurm watchers do for theirs: the ``cpu-time`` share rule splits host-wide
energy by it.

Why the wrapper and not the agent: the wrapper knows the job's processes (they are its
descendants, in its pid namespace) and its events already reach the store exactly once
(the outbox, or the local store), so the job's share becomes job data bounded by jobs x
devices x periods, and no sample carries a pid label. The agent would have to learn every
job's pids and ship per-process series. The cost: each wrapper opens NVML (and, for Neuron
without embedded sampling, a neuron-monitor of its own).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from wattline import wire
from wattline.agent.usage.cpu_use import CpuPeriod, CpuTally, host_cpu_ns
from wattline.agent.usage.process_use import Tally, UseSource, UseTallies, use_fields, use_sources
from wattline.jobs.events import EventBuilder
from wattline.jobs.wrappers.processes import ProcessTree, TreeCpu

log = logging.getLogger(__name__)

#: Seconds between two measurements of a job's device use (env WATTLINE_USE_PERIOD_S).
USE_PERIOD_S = 5.0
ENV_USE_PERIOD = "WATTLINE_USE_PERIOD_S"


def use_period_s() -> float:
    """``$WATTLINE_USE_PERIOD_S`` when set to a positive number, else :data:`USE_PERIOD_S`."""
    try:
        value = float(os.environ.get(ENV_USE_PERIOD, ""))
    except ValueError:
        return USE_PERIOD_S
    return value if value > 0 else USE_PERIOD_S


class UseRecorder:
    """Sends the job's USE events from a daemon thread until :meth:`stop`.

    It asks the sources every ``sample_s`` (at most 1 s: a process's use since the
    previous ask is lost if it exits before the next one, as its samples go with it) and
    sends one event per device every ``period_s`` with the use integrated over the period,
    or sooner, at the previous ask, when the processes holding a device changed (the job's or
    another's started or ended): a period's mean stands for all of it when the device is
    split between jobs, so a steady period holds one set of processes, and the ask in which
    they changed is an unsteady period of its own (the split's bound covers it).
    """

    def __init__(
        self,
        builder: EventBuilder,
        send: Callable[[list[wire.pb.JobEvent]], None],
        tree: ProcessTree,
        sources: Callable[[], Sequence[UseSource]],
        period_s: float | None = None,
        sample_s: float = 1.0,
        cpu: Callable[[], int] | None = None,
    ) -> None:
        """``cpu``: the job's processes' CPU time so far (ns), read at each period's end; None:
        no CPU-time events."""
        self.builder = builder
        self.send = send
        self.tree = tree
        self.sources = sources
        self.period_s = use_period_s() if period_s is None else period_s
        self.sample_s = min(sample_s, self.period_s)
        #: Devices ("gpu:<UUID>") the job's processes ran on or used, so far.
        self.devices: set[str] = set()
        self.sent = 0
        self._period_ns = 0  #: start of the current period
        #: The processes holding each device the job used, at the last ask that read it.
        self._running: dict[str, frozenset[int]] = {}
        self._use = UseTallies()
        self.cpu = cpu
        self._cpu = CpuTally()
        self._final_cpu: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wattline-use", daemon=True)

    def start(self, open_ns: int | None = None) -> UseRecorder:
        """Measure from now until :meth:`stop`; never blocks the job (sources open in the thread).
        ``open_ns``: the job's open, before its processes started: their CPU time counts from
        there (from 0); without it, from now (what they had used before is not the job's)."""
        self._period_ns = self._use.last_ns = now = time.time_ns()
        if self.cpu is not None:
            self._cpu.read(now, host_cpu_ns(), {})
            if open_ns is not None:
                self._cpu.start("", open_ns, 0.0, open_ns)
            else:
                self._cpu.start("", now, self.cpu(), now)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take the last partial period of each device and the processes' CPU time so far (their
        last, for :meth:`finish`); no device's USE event after this returns."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.sample()
        self._flush_devices()
        self._final_cpu = self.cpu() if self.cpu is not None else None

    def finish(self, end_ns: int) -> None:
        """The last CPU-time period, to the job's close at ``end_ns``: the processes' CPU time
        as :meth:`stop` read it (they have ended, or what they do after is not the job's)."""
        if self._final_cpu is not None:
            self._send_cpu(self._cpu.read(end_ns, host_cpu_ns(), {"": self._final_cpu}, ends={"": end_ns}))
            self._final_cpu = None

    def _run(self) -> None:
        # The first ask reads each source from the job's start (UseTallies: a source not
        # read before), so what the drivers hold from before the job is not counted.
        self.sample()
        while not self._stop.wait(self.sample_s):
            self.sample()
            if time.time_ns() - self._period_ns >= self.period_s * 1e9:
                self.flush()

    @property
    def scope(self) -> set[str]:
        """Devices whose per-process use could be read, used by the job or not."""
        return self._use.scope

    def sample(self) -> None:
        """Ask the sources once and add each device's use since the previous ask to the
        period; where this ask found other processes holding a device the job used than the
        ask before (one started or ended, the job's included), the period ends at the previous
        ask and the time since is sent as an unsteady period of its own."""
        pids = self.tree.refresh()
        if self.cpu is not None:  # a read a second keeps track of the processes that come and go
            self.cpu()
        before = {key: replace(t) for key, t in self._use.jobs.get("", {}).items()}
        asked_ns = self._use.last_ns
        # The devices it used stay the job's (a measured 0 once its processes left them), so
        # the ask after they exit still finds the change and covers the stretch to their exit.
        claims = {"": frozenset(self.devices)}
        for error in self._use.sample(self.sources(), lambda pid: "" if pid in pids else None, time.time_ns(), claims):
            log.warning("job %s: %s", self.builder.spec.job_id, error)
        now = self._use.jobs.get("", {})
        self.devices.update(now)
        added = {key: _less(t, before.get(key)) for key, t in now.items()}
        added = {key: t for key, t in added.items() if t.covered_ns > 0}
        changed = any(self._running.get(key) != t.running for key, t in added.items())
        self._running.update((key, t.running) for key, t in added.items())
        if changed:
            self._send(self._period_ns, asked_ns, before, steady=True)
            self._send(asked_ns, self._use.last_ns, added, steady=False)
            self._use.take("")
            self._period_ns = self._use.last_ns

    def flush(self) -> None:
        """One USE event per device the job ran on or used in the period now ending, and one of
        its CPU time."""
        self._flush_devices()
        if self.cpu is not None:
            self._send_cpu(self._cpu.read(time.time_ns(), host_cpu_ns(), {"": self.cpu()}))

    def _flush_devices(self) -> None:
        start, end = self._period_ns, self._use.last_ns
        self._period_ns = end
        self._send(start, end, self._use.take(""), steady=True)

    def _send_cpu(self, periods: dict[str, list[CpuPeriod]]) -> None:
        if parts := periods.get(""):
            self._deliver([self.builder.make(wire.pb.JobEvent.KIND_USE, p.end_ns, **p.fields()) for p in parts])

    def _send(self, start: int, end: int, tallies: dict[str, Tally], steady: bool) -> None:
        if end <= start or not tallies:
            return
        self._deliver([
            self.builder.make(
                wire.pb.JobEvent.KIND_USE, end, **use_fields(key, end - start, t.mine, t.total, t.metric, None, steady)
            )
            for key, t in sorted(tallies.items())
        ])  # fmt: skip

    def _deliver(self, events: list[wire.pb.JobEvent]) -> None:
        try:
            self.send(events)
            self.sent += len(events)
        except Exception as exc:  # never stop the job
            log.warning("job %s: use events not sent: %s", self.builder.spec.job_id, exc)


def _less(t: Tally, b: Tally | None) -> Tally:
    """What the last ask added to a tally."""
    if b is None:
        return t
    return Tally(t.metric, t.mine - b.mine, t.total - b.total, t.covered_ns - b.covered_ns, t.running)


#: Sources that can give per-process use.
USE_SOURCE_NAMES = ("nvml", "neuron")


class JobUse:
    """A :class:`UseRecorder` for one job and the sources it reads: the embedded session's
    own (``discovery``, when it samples this host) or ones opened here (closed by :meth:`stop`)."""

    def __init__(
        self,
        builder: EventBuilder,
        send: Callable[[list[wire.pb.JobEvent]], None],
        roots: Iterable[int],
        *,
        discovery: Any = None,
        settings: Any = None,
        doc: Any = None,
    ) -> None:
        self._owned: list[Any] | None = None
        self._args = (settings, doc)
        self._lock = threading.Lock()
        self._discovery = discovery
        tree = ProcessTree(roots)
        self.recorder = UseRecorder(builder, send, tree, self._sources, cpu=TreeCpu(tree).read)

    def _sources(self) -> list[UseSource]:
        """The embedded session's sources, else ours, opened at the first call (in the recorder's thread)."""
        if self._discovery is not None:
            return use_sources(self._discovery.sources)
        with self._lock:
            if self._owned is None:
                self._owned = _open_sources(*self._args)
            return use_sources(self._owned)

    def start(self, open_ns: int | None = None) -> JobUse:
        """See :meth:`UseRecorder.start`."""
        self.recorder.start(open_ns)
        return self

    @property
    def scope(self) -> set[str]:
        """Devices whose per-process use was read (for the close event's ``use_scope``)."""
        return self.recorder.scope

    def finish(self, end_ns: int) -> None:
        """See :meth:`UseRecorder.finish`."""
        self.recorder.finish(end_ns)

    def stop(self) -> None:
        """See :meth:`UseRecorder.stop`; the sources opened here are closed."""
        try:
            self.recorder.stop()
        finally:
            with self._lock:
                for source in self._owned or ():
                    source.close()
                self._owned = []


def _open_sources(settings: Any, doc: Any) -> list[Any]:
    """Discover the per-process sources this host has (none is fine: no USE events)."""
    from wattline.agent import registry
    from wattline.agent.settings import AgentSettings

    settings = settings or AgentSettings()
    names = [n for n in settings.sources if n in USE_SOURCE_NAMES]
    try:
        statuses = registry.discover(names, settings.sysfs_root, doc)
    except Exception as exc:  # never stop the job for its use figures
        log.warning("per-process use unavailable: %s", exc)
        return []
    return [s.source for s in statuses if s.source is not None]
