"""Each job's CPU time against the host's, as ``cpu:host`` USE periods: one tally for every
holder that reads a job's cumulative CPU time (a pod's or a Slurm job's cgroup, a wrapped
command's process tree) and every process's (the host's).

A holder reads, at instants of its own, each open job's CPU time so far and the host's;
:meth:`CpuTally.read` turns two readings into a period per job, the fields of its USE event
(the ``cpu-time`` share rule splits host-wide energy by them). What the holders used to lose
is the job's edges:

* a job whose counter started at 0 with it (a new cgroup, a command just started), or was
  read before its window opened (a pending pod), is known from its open
  (:meth:`CpuTally.start`): its first period runs from its open, not from its first reading;
* a job whose processes ended (its containers, its command) has its counter frozen since
  its end: the period from its last reading runs to its end (``ends``), and where a period
  already sent reached past the end (the end was learned late), that period is sent again
  cut at the end, in place of the first (:attr:`CpuPeriod.replaces`).

Where a job's stretch covers only part of the host's reading interval, the host's CPU time
over the stretch is the job's own (it lies in the stretch) plus the other processes' at their
mean rate over the interval. A job whose reading fails has no period until it is read twice
again: that stretch is unmeasured (the report estimates it and bounds the estimate).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from wattline.agent.cgroup_cpu import CPU_DEVICE, CPU_METRIC
from wattline.agent.process_use import use_fields

#: Nanoseconds per clock tick of /proc's CPU times (USER_HZ).
NS_PER_TICK = 10**9 // os.sysconf("SC_CLK_TCK")


def host_cpu_ns(proc: Path = Path("/proc")) -> int | None:
    """Every process's CPU time since boot (ns) from ``proc/stat``: user, nice, system, irq and
    softirq (guest is inside user; idle, iowait and steal are no process's); None if unreadable."""
    try:
        with (proc / "stat").open("rb") as fh:
            fields = fh.readline().split()
        if fields[0] != b"cpu":
            return None
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    except (OSError, ValueError, IndexError):
        return None
    return (user + nice + system + irq + softirq) * NS_PER_TICK


@dataclass(frozen=True, slots=True)
class CpuPeriod:
    """A job's CPU time over ``(start_ns, end_ns]`` against every process's (ns)."""

    start_ns: int
    end_ns: int
    job_ns: float
    host_ns: float
    #: Sent in place of the job's previous period (it reached past the job's end).
    replaces: bool = False

    def fields(self) -> dict[str, Any]:
        """The USE event's fields: the job's and the host's mean use, percent of one CPU."""
        span = self.end_ns - self.start_ns
        return use_fields(CPU_DEVICE, span, self.job_ns * 100.0, self.host_ns * 100.0, CPU_METRIC)


@dataclass(frozen=True, slots=True)
class _Host:
    """One interval of the host's readings: ``(start_ns, end_ns]`` and its CPU time."""

    start_ns: int
    end_ns: int
    cpu_ns: float

    def over(self, start_ns: int, end_ns: int, job_ns: float) -> float:
        """The host's CPU time over a job's stretch ``(start_ns, end_ns]`` holding ``job_ns`` of
        its own: that, and the other processes' at their mean rate over this interval."""
        length, span = self.end_ns - self.start_ns, end_ns - start_ns
        if length <= 0 or span <= 0:
            return job_ns
        inside = max(0, min(end_ns, self.end_ns) - max(start_ns, self.start_ns))
        others = max(0.0, self.cpu_ns - job_ns * inside / span)
        return job_ns + others * span / length


@dataclass(slots=True)
class _Job:
    at_ns: int  #: when its counter was last read (or known)
    cpu_ns: float  #: its CPU time then
    open_ns: int  #: no period starts before it
    last: tuple[CpuPeriod, _Host] | None = None  #: its last period, and the host interval it was read in


class CpuTally:
    """Each job's last reading and the host's; see the module doc."""

    def __init__(self) -> None:
        self._host: tuple[int, float | None] | None = None  #: (time, CPU time) of the last reading
        self._jobs: dict[str, _Job] = {}

    def start(self, job: str, at_ns: int, cpu_ns: float = 0.0, open_ns: int = 0) -> None:
        """The job's counter read ``cpu_ns`` at ``at_ns`` (0 when it started with the job);
        its periods start no earlier than ``open_ns`` (its window's start)."""
        self._jobs[job] = _Job(at_ns, cpu_ns, open_ns)

    def opened(self, job: str, open_ns: int) -> None:
        """The job's window opened at ``open_ns`` (read while pending: no period starts before)."""
        if job in self._jobs:
            self._jobs[job].open_ns = open_ns

    def known(self, job: str) -> bool:
        """Whether the job has a reading a next one makes a period with."""
        return job in self._jobs

    def read(
        self,
        now_ns: int,
        host_ns: float | None,
        jobs: Mapping[str, float | None],
        ends: Mapping[str, int] | None = None,
        gaps: Collection[str] = (),
    ) -> dict[str, CpuPeriod]:
        """Each job's period since its last reading, from this reading of ``jobs`` (job -> its CPU
        time so far, None where it could not be read) and of the host (None: not accounted: the
        jobs' own are the host's). ``ends``: jobs whose processes ended then (their counter has
        not moved since); they are forgotten after this. ``gaps``: jobs whose CPU time since
        their last reading is not known (this reading starts them afresh). Jobs not in ``jobs``
        are forgotten."""
        ends = ends or {}
        found: dict[str, tuple[_Job, float, int]] = {}
        first = self._host is None and host_ns is not None  # no host interval yet: baselines only
        for job, value in jobs.items():
            before = self._jobs.get(job)
            if value is None or before is None or job in gaps or first:
                if value is not None:
                    self._jobs[job] = _Job(now_ns, value, before.open_ns if before else 0)
                else:
                    self._jobs.pop(job, None)
                continue
            found[job] = (before, max(0.0, value - before.cpu_ns), ends.get(job, now_ns))
            self._jobs[job] = _Job(now_ns, value, before.open_ns, before.last)
        for gone in set(self._jobs) - set(jobs):
            del self._jobs[gone]
        since = min((max(b.at_ns, b.open_ns) for b, _, _ in found.values()), default=now_ns)
        host = self._interval(now_ns, host_ns, sum(delta for _, delta, _ in found.values()), since)
        self._host = (now_ns, host_ns)
        out: dict[str, CpuPeriod] = {}
        for job, (before, delta, end_ns) in found.items():
            period = self._period(before, delta, end_ns, host)
            if period is not None:
                out[job] = period
                self._jobs[job].last = (period, host)
        for job in ends:
            self._jobs.pop(job, None)
        return out

    def end(self, job: str, end_ns: int, cpu_ns: float | None, now_ns: int, host_ns: float | None) -> CpuPeriod | None:
        """The last period of one job whose processes ended at ``end_ns``, its counter read
        ``cpu_ns`` since (at ``now_ns``, with the host's ``host_ns``), apart from the others'
        readings (the host's is not kept); None where it cannot be known. The job is forgotten."""
        before = self._jobs.pop(job, None)
        if before is None or cpu_ns is None:
            return None
        delta = max(0.0, cpu_ns - before.cpu_ns)
        return self._period(before, delta, end_ns, self._interval(now_ns, host_ns, delta, before.at_ns))

    def _interval(self, now_ns: int, host_ns: float | None, jobs_ns: float, since_ns: int) -> _Host:
        """The host interval from the last reading (the first: from ``since_ns``) to this one;
        where the host's counter was not read at both ends (or went back), the jobs' CPU time
        is all of it."""
        last = self._host
        start = last[0] if last is not None else since_ns
        if host_ns is None or last is None or last[1] is None or host_ns < last[1]:
            return _Host(start, now_ns, jobs_ns)
        return _Host(start, now_ns, max(host_ns - last[1], jobs_ns))

    @staticmethod
    def _period(before: _Job, delta: float, end_ns: int, host: _Host) -> CpuPeriod | None:
        start = max(before.at_ns, before.open_ns)
        if end_ns > start:
            return CpuPeriod(start, end_ns, delta, host.over(start, end_ns, delta))
        # It ended before its last reading: its last period reached past its end. Cut there
        # (the counter has not moved since the end, so that period's CPU time lies before it).
        if before.last is None or delta > 0:
            return None
        last, last_host = before.last
        if not last.start_ns < end_ns < last.end_ns:
            return None
        return replace(last, end_ns=end_ns, host_ns=last_host.over(last.start_ns, end_ns, last.job_ns), replaces=True)
