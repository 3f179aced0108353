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
  its end: the period from its last reading runs to its end (``ends``), and where the periods
  already sent reached past the end (the end was learned late), they are sent again cut at
  the end, each in place of the one it replaces (:attr:`CpuPeriod.replaces`).

Between two readings each job's CPU time is taken to have run at one pace over its stretch
(from its last reading, or its open, to this reading, or its end), and the other processes'
(every process's less the jobs') at one pace over the host's interval. So where another job
started or ended inside a job's stretch, the host's pace changed there: the job's period is
cut at that instant, each part with its own CPU time and the host's (:attr:`CpuPeriod.part`),
and a job's share of each part is exact where the paces held. A job whose reading fails has
no period until it is read twice again: that stretch is unmeasured (the report estimates it
and bounds the estimate). A period is sent steady (its job's processes ran throughout it, or
started and ended at its edges) unless its holder says they came or went inside it
(``changed``: a unit seen started or stopped at this look): the report bounds such an edge.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wattline.agent.usage.cgroup_cpu import CPU_DEVICE, CPU_METRIC
from wattline.agent.usage.process_use import use_fields

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


#: Most parts a job's period of one reading is cut into (the rest are one part).
MAX_PARTS = 16
#: USE places of the CPU-time periods: (reading's number, part) -> a place of its own, above a
#: holder's device periods' (1 << 30 + 2 ** 30) and below its close (2 ** 32 - 2).
CPU_AT, CPU_READINGS = 1 << 31, 1 << 24


def cpu_place(reading: int, part: int) -> int:
    """The event_seq place of part ``part`` of a job's CPU-time period of reading ``reading``."""
    return CPU_AT + (reading % CPU_READINGS) * MAX_PARTS + min(part, MAX_PARTS - 1)


@dataclass(frozen=True, slots=True)
class CpuPeriod:
    """A job's CPU time over ``(start_ns, end_ns]`` against every process's (ns)."""

    start_ns: int
    end_ns: int
    job_ns: float
    host_ns: float
    #: Its place among the parts of the job's period of one reading (cut where another job
    #: started or ended).
    part: int = 0
    #: Sent in place of part ``part`` of the job's previous reading (it reached past the job's end).
    replaces: bool = False
    #: The job's processes ran throughout it (else they may have come or gone inside it).
    steady: bool = True

    def fields(self) -> dict[str, Any]:
        """The USE event's fields: the job's and the host's mean use, percent of one CPU."""
        span = self.end_ns - self.start_ns
        return use_fields(CPU_DEVICE, span, self.job_ns * 100.0, self.host_ns * 100.0, CPU_METRIC, None, self.steady)


@dataclass(frozen=True, slots=True)
class _Stretch:
    """A job's CPU time over ``(start_ns, end_ns]``, taken at one pace."""

    start_ns: int
    end_ns: int
    cpu_ns: float

    @property
    def pace(self) -> float:
        return self.cpu_ns / (self.end_ns - self.start_ns) if self.end_ns > self.start_ns else 0.0

    def inside(self, a: int, b: int) -> float:
        """Its CPU time within ``(a, b]``."""
        return self.pace * max(0, min(b, self.end_ns) - max(a, self.start_ns))


@dataclass(frozen=True, slots=True)
class _Reading:
    """What one reading knew: the other processes' pace and every job's stretch."""

    others_pace: float
    stretches: Mapping[str, _Stretch]

    def periods(self, job: str, replaces: bool = False, steady: bool = True) -> list[CpuPeriod]:
        """The job's stretch cut where another job's starts or ends, each part with the host's
        CPU time there (the others' pace and every job running there at its own)."""
        mine = self.stretches[job]
        cuts = {mine.start_ns, mine.end_ns}
        for other in self.stretches.values():
            cuts |= {t for t in (other.start_ns, other.end_ns) if mine.start_ns < t < mine.end_ns}
        edges = sorted(cuts)
        if len(edges) > MAX_PARTS + 1:
            edges = [*edges[:MAX_PARTS], edges[-1]]
        out = []
        for part, (a, b) in enumerate(itertools.pairwise(edges)):
            job_ns = mine.inside(a, b)
            host_ns = self.others_pace * (b - a) + sum(s.inside(a, b) for s in self.stretches.values())
            out.append(CpuPeriod(a, b, job_ns, max(host_ns, job_ns), part, replaces, steady))
        return out


@dataclass(slots=True)
class _Job:
    at_ns: int  #: when its counter was last read (or known)
    cpu_ns: float  #: its CPU time then
    open_ns: int  #: no period starts before it
    last: _Reading | None = None  #: the reading that made its last periods


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
        changed: Collection[str] = (),
    ) -> dict[str, list[CpuPeriod]]:
        """Each job's period since its last reading, in parts, from this reading of ``jobs``
        (job -> its CPU time so far, None where it could not be read) and of the host (None:
        not accounted: the jobs' own are the host's). ``ends``: jobs whose processes ended then
        (their counter has not moved since); they are forgotten after this. ``gaps``: jobs
        whose CPU time since their last reading is not known (this reading starts them
        afresh). ``changed``: jobs whose processes came or went since their last reading (their
        periods are not steady). Jobs not in ``jobs`` are forgotten."""
        ends = ends or {}
        stretches: dict[str, _Stretch] = {}
        late: dict[str, tuple[_Job, int]] = {}
        first = self._host is None and host_ns is not None  # no host interval yet: baselines only
        for job, value in jobs.items():
            before = self._jobs.get(job)
            if value is None or before is None or job in gaps or first:
                if value is not None:
                    self._jobs[job] = _Job(now_ns, value, before.open_ns if before else 0)
                else:
                    self._jobs.pop(job, None)
                continue
            delta, start, end = (
                max(0.0, value - before.cpu_ns),
                max(before.at_ns, before.open_ns),
                ends.get(job, now_ns),
            )
            if end > start:
                stretches[job] = _Stretch(start, end, delta)
            elif delta == 0:  # it ended before its last reading: its last periods reached past its end
                late[job] = (before, end)
            self._jobs[job] = _Job(now_ns, value, before.open_ns, before.last)
        for gone in set(self._jobs) - set(jobs):
            del self._jobs[gone]
        reading = self._reading(now_ns, host_ns, stretches)
        out = {job: reading.periods(job, steady=job not in changed) for job in stretches}
        for job in stretches:
            self._jobs[job].last = reading
        for job, (before, end) in late.items():
            if before.last is not None and job in before.last.stretches:
                previous = before.last.stretches[job]
                cut = _Stretch(previous.start_ns, end, previous.cpu_ns)
                if previous.start_ns < end < previous.end_ns:  # its CPU time lies before its end
                    again = _Reading(before.last.others_pace, {**before.last.stretches, job: cut})
                    out[job] = again.periods(job, replaces=True)
        for job in ends:
            self._jobs.pop(job, None)
        return out

    def end(self, job: str, end_ns: int, cpu_ns: float | None, now_ns: int, host_ns: float | None) -> list[CpuPeriod]:
        """The last period of one job whose processes ended at ``end_ns``, its counter read
        ``cpu_ns`` since (at ``now_ns``, with the host's ``host_ns``), apart from the others'
        readings (the host's is not kept; the other jobs count as other processes); none where
        it cannot be known. The job is forgotten."""
        before = self._jobs.pop(job, None)
        start = max(before.at_ns, before.open_ns) if before is not None else 0
        if before is None or cpu_ns is None or end_ns <= start:
            return []
        kept = self._host
        reading = self._reading(now_ns, host_ns, {job: _Stretch(start, end_ns, max(0.0, cpu_ns - before.cpu_ns))})
        self._host = kept
        return reading.periods(job)

    def _reading(self, now_ns: int, host_ns: float | None, stretches: Mapping[str, _Stretch]) -> _Reading:
        """This reading: the other processes' pace over the host's interval since the last
        reading (none where the host's counter was not read at both ends, or went back: the
        jobs' CPU time is then all of it); kept as the next one's start."""
        last, self._host = self._host, (now_ns, host_ns)
        start = last[0] if last is not None else min((s.start_ns for s in stretches.values()), default=now_ns)
        if host_ns is None or last is None or last[1] is None or host_ns < last[1] or now_ns <= start:
            return _Reading(0.0, stretches)
        jobs = sum(s.inside(start, now_ns) for s in stretches.values())
        return _Reading(max(0.0, host_ns - last[1] - jobs) / (now_ns - start), stretches)
