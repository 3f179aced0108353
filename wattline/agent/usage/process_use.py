"""Each job's use of each device, summed from per-process use: one tally for every holder
that knows which job a process is in (a wrapper's process tree, the pod watcher's and the
Slurm watcher's cgroups).

:meth:`UseTallies.sample` asks the per-process sources once (NVML, neuron-monitor: how much
of each device each process used since the previous ask, :class:`.sources.use.DeviceUse`)
and adds, for each job and device, the integrals over the time since the previous ask of
the job's processes' use and of every process's. A job counts on a device where one of its
processes ran or used it, and where it claims the device (then a measured 0 while only
others use it). A process in no job counts to nobody: in the device's use, in no job's.
The devices whose per-process use could be read make the ``scope`` (a close's ``use_scope``).
The holder sends each job's means over its use period as USE events (:func:`use_fields`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from wattline.agent.sources.use import DeviceUse

#: Longest time between two asks that still counts (longer: the process list then is no
#: picture of the time since, so that stretch is left out).
MAX_GAP_NS = 60 * 10**9


class UseSource(Protocol):
    """A source that can say how much of each device each process used."""

    def process_use(self, since_us: int | None = None) -> list[DeviceUse]: ...


def use_sources(sources: Iterable[Any]) -> list[UseSource]:
    """The sources among ``sources`` that give per-process use."""
    return [s for s in sources if callable(getattr(s, "process_use", None))]


@dataclass
class Tally:
    """A job's use of one device over a period: integrals of use x time, in %·ns."""

    metric: str
    mine: float = 0.0
    total: float = 0.0
    covered_ns: int = 0  #: the time the asks that counted for the job covered
    #: The processes holding the device at the last ask that counted (any job's or none's).
    running: frozenset[int] = frozenset()


class UseTallies:
    """Every job's :class:`Tally` per device since it was last :meth:`take`-n (see the module doc)."""

    def __init__(self) -> None:
        self.scope: set[str] = set()  #: devices whose per-process use could be read
        self.jobs: dict[str, dict[str, Tally]] = {}  #: job -> device -> its use so far
        self.last_ns = 0  #: time of the previous ask (0: none yet)
        self._asked: dict[int, UseSource] = {}  #: the sources the previous ask read, by id()
        self._owners: dict[int, str | None] = {}  #: each process's job, while ``_owners_key`` holds
        self._owners_key: Hashable | None = None
        #: Per device, the processes the previous ask listed: their job and use then.
        self._last: dict[str, dict[int, tuple[str | None, float]]] = {}

    def sample(
        self,
        sources: Iterable[UseSource],
        job_of: Callable[[int], str | None],
        now_ns: int,
        claims: Mapping[str, Collection[str]] | None = None,
        owners: Hashable | None = None,
    ) -> list[str]:
        """Ask each source once and add each job's use since the previous ask (the first ask,
        or one after more than MAX_GAP_NS, only sets where the next one counts from). A
        source the previous ask did not read (a holder asks none while it has no job) is
        read from the previous ask's time (``since_us``; the Neuron source then has nothing
        to place in time: that period is unmeasured, not another's).
        ``job_of``: a process's job, None for none; ``claims``: job -> devices it holds.
        ``owners``: what ``job_of`` answers from (the open jobs and their cgroups): while it
        is the same, a process listed in the previous ask keeps the job found then (a
        process's cgroup is its own from its start), so a process of no job costs a lookup
        in a map, not a read of /proc. Returns one line per source that could not be read."""
        previous_ns, self.last_ns = self.last_ns, now_ns
        dt = now_ns - previous_ns
        counts = 0 < dt <= MAX_GAP_NS
        if owners is None or owners != self._owners_key:
            self._owners, self._owners_key = {}, owners
        errors, owner = [], _Memo(job_of, self._owners)
        asked, self._asked = self._asked, {}
        for source in sources:
            try:
                if counts and asked.get(id(source)) is not source:
                    # Not read at the previous ask (no job then, or new): what it holds from
                    # before that (NVML's last 100 samples, other processes' among them) is
                    # no picture of this period, so it is read from the period's start.
                    uses = source.process_use(since_us=previous_ns // 1000)
                else:
                    uses = source.process_use()
            except Exception as exc:  # per-process use is optional: the jobs go on without it
                errors.append(f"per-process use not read: {exc}")
                continue
            self._asked[id(source)] = source
            for du in uses:
                if not du.supported:
                    continue
                self.scope.add(du.key)
                if counts:
                    with_lost, lost = _with_lost(du, self._last.get(du.key, {}))
                    self.add(with_lost, _Known(lost, owner), dt, claims or {})
                # the jobs as this ask found them (none looked up where it counted nothing)
                self._last[du.key] = {
                    pid: (owner.known.get(pid), du.use.get(pid, 0.0)) for pid in du.running | du.use.keys()
                }
        if owners is not None:  # forget processes no longer listed: a pid may come back as another's
            self._owners = {pid: owner.known[pid] for pid in owner.asked}
        return errors

    def add(
        self, du: DeviceUse, job_of: Callable[[int], str | None], dt: int, claims: Mapping[str, Collection[str]]
    ) -> None:
        """Count ``du`` (one device's per-process use) as lasting ``dt`` ns."""
        mine = {job: 0.0 for job, devices in claims.items() if du.key in devices}
        for pid in sorted(set(du.use) | du.running):
            job = job_of(pid)
            if job is not None:
                mine[job] = mine.get(job, 0.0) + du.use.get(pid, 0.0)
        total = du.total if du.total is not None else math.fsum(du.use.values())
        for job, value in mine.items():
            tally = self.jobs.setdefault(job, {}).setdefault(du.key, Tally(du.metric))
            tally.mine += value * dt
            tally.total += max(total, value) * dt
            tally.covered_ns += dt
            tally.running = du.running

    def take(self, job: str) -> dict[str, Tally]:
        """The job's tallies so far (device -> tally), forgotten here."""
        return self.jobs.pop(job, {})

    def keep_only(self, jobs: Collection[str]) -> None:
        """Forget the tallies of jobs not in ``jobs`` (ended without a last period)."""
        for gone in set(self.jobs) - set(jobs):
            del self.jobs[gone]


def _with_lost(du: DeviceUse, last: Mapping[int, tuple[str | None, float]]) -> tuple[DeviceUse, dict[int, str | None]]:
    """``du`` with the use of the GPU processes that exited since the previous ask and left no
    sample (NVML drops an exited process's): half their use then, as each ran for between
    none and all of the time since; and their jobs (pid -> job), as the previous ask found them."""
    if du.component != "gpu" or du.total is not None:  # MIG: shares by a rule, nothing lost
        return du, {}
    gone = {pid: v for pid, v in last.items() if v[1] > 0 and pid not in du.running and pid not in du.use}
    if not gone:
        return du, {}
    use = du.use | {pid: rate / 2 for pid, (_, rate) in gone.items()}
    return replace(du, use=use), {pid: job for pid, (job, _) in gone.items()}


@dataclass(frozen=True, slots=True)
class _Known:
    """``job_of`` that knows the jobs of some processes already (exited ones)."""

    known: Mapping[int, str | None]
    job_of: Callable[[int], str | None]

    def __call__(self, pid: int) -> str | None:
        return self.known[pid] if pid in self.known else self.job_of(pid)


class _Memo:
    """``job_of`` asked once per process (a process may use several devices), ``known`` the
    answers so far, ``asked`` the processes asked of it."""

    def __init__(self, job_of: Callable[[int], str | None], known: dict[int, str | None]) -> None:
        self.job_of, self.known, self.asked = job_of, dict(known), set[int]()

    def __call__(self, pid: int) -> str | None:
        self.asked.add(pid)
        if pid not in self.known:
            self.known[pid] = self.job_of(pid)
        return self.known[pid]


def use_fields(
    device: str,
    span_ns: int,
    mine: float,
    total: float,
    metric: str,
    tallied_ns: int | None = None,
    steady: bool = False,
) -> dict[str, Any]:
    """A USE event's fields: the job's and every process's mean use of ``device`` over a period
    of ``span_ns`` ending at the event (``mine``, ``total``: their integrals, use x ns, over
    ``tallied_ns``, default the period; longer for a job that ended between two of its
    holder's reads of its processes, as the ask that last saw them reached past its end: the
    means are then over the time the asks covered, so never over 100 %). ``steady``: every
    ask in the period found the same processes holding the device."""
    over = max(span_ns, tallied_ns or 0)
    return {
        "use_device": device,
        "use_period_ns": span_ns,
        "job_use": mine / over,
        "device_use": max(total, mine) / over,
        "use_metric": metric,
        "use_steady": steady,
    }
