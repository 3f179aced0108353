"""A device split by jobs' recorded use when their holders' periods overlap, checked against
a device whose use is constructed process by process.

Each scenario lists the processes (job, SM percent, start, end), the times each job's holder
asks, and the power per percent of use. From those alone the test derives what the holder
would record (each ask's period: the mean use of the job's processes and of every process
that is still listed at the ask, as NVML drops an exited process's samples), the device's
energy in 0.1 s samples, and the truth: each job's processes' use times the power, instant
by instant. The split under test sees only the recorded periods and the samples.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from wattline import wire
from wattline.accounting.attribution import ChannelEnergy, JobWindow, split_shared
from wattline.accounting.use_split import UseInterval, UseTimeline
from wattline.accounting.window_energy import Interval
from wattline.agent.sources.use import DeviceUse
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.jobs.wrappers import usage
from wattline.quality import Quality

S = 10**9
W_PER_PCT = 5.0  # W per percent of use
KEY = "gpu:GPU-x"


@dataclass(frozen=True)
class Proc:
    job: str | None  # None: a process of no job
    pct: float
    start: float
    end: float
    pid: int = 1  # one process's use may change: one Proc per stretch, the same pid


def _exited(procs: Sequence[Proc], p: Proc, t: float) -> bool:
    return max(q.end for q in procs if (q.job, q.pid) == (p.job, p.pid)) < t


def _overlap(p: Proc, lo: float, hi: float) -> float:
    return max(0.0, min(p.end, hi) - max(p.start, lo))


def recorded(
    procs: Sequence[Proc], job: str, times: Sequence[float], vanish: bool = True, every: float = 1.0
) -> UseTimeline:
    """What ``job``'s holder records with periods between ``times`` (s), asking every
    ``every`` s inside them as the wrapper does: each ask adds the use since the previous one
    of the processes it lists (an exited process is in no ask after its exit when
    ``vanish``, as NVML drops its samples); a period's means are the sums over its length."""
    out = []
    for lo, hi in itertools.pairwise(times):
        cuts = [lo + every * i for i in range(1, math.ceil((hi - lo) / every - 1e-9))] + [hi]
        mine = total = 0.0
        for a, b in itertools.pairwise([lo, *cuts]):
            listed = [p for p in procs if not (vanish and _exited(procs, p, b))]
            mine += math.fsum(p.pct * _overlap(p, a, b) for p in listed if p.job == job)
            total += math.fsum(p.pct * _overlap(p, a, b) for p in listed)
        out.append(UseInterval(round(lo * S), round(hi * S), mine / (hi - lo), max(total, mine) / (hi - lo), "sm"))
    return UseTimeline(out)


def device(procs: Sequence[Proc], start: float, end: float, idle_w: float = 0.0) -> ChannelEnergy:
    """The GPU's energy in 0.1 s samples over [start, end): idle plus W_PER_PCT per percent."""
    samples = []
    for i in range(round((end - start) * 10)):
        lo, hi = start + i / 10, start + (i + 1) / 10
        joules = idle_w * (hi - lo) + W_PER_PCT * math.fsum(p.pct * _overlap(p, lo, hi) for p in procs)
        samples.append(Interval(round(lo * S), round(hi * S), joules))
    return ChannelEnergy("h", "gpu", "GPU-x", Quality.COUNTER, samples)


def truth_j(procs: Sequence[Proc], job: str | None, lo: float, hi: float) -> float:
    return W_PER_PCT * math.fsum(p.pct * _overlap(p, lo, hi) for p in procs if p.job == job)


def window(job: str, start: float, end: float, uses: UseTimeline) -> JobWindow:
    return JobWindow(job, "h", round(start * S), round(end * S), uses={KEY: uses})


#: A at 60 % over [0, 4] s, B at 20 % over [0.5, 4.5] s, each process exiting at its end.
STAGGERED = [Proc("a", 60, 0.0, 4.0), Proc("b", 20, 0.5, 4.5)]


def asks(start: float, end: float, period: float) -> list[float]:
    n = math.ceil((end - start) / period - 1e-9)
    return [start + period * i for i in range(n)] + [end]


@pytest.mark.parametrize("vanish", [True, False])
@pytest.mark.parametrize("period", [1.0, 5.0])
def test_staggered_periods_give_each_job_its_own_use(period: float, vanish: bool) -> None:
    """A's periods start 0.5 s before B's: a period ratio (A's first: 60 of 70 % at 1 s, 60
    of 77.5 % at 5 s) overstates A's part where B ran, and B's last period, asked after A's
    process exited, reads 20 of 20 % (or 50 of 50 % where NVML kept the exited process's
    samples: ``vanish`` False). Split by rate, each job gets its processes' energy
    exactly: A 1200 J, B 400 J, nothing unattributed (the two used the GPU alone)."""
    uses = {j: recorded(STAGGERED, j, asks(s, e, period), vanish) for j, s, e in (("a", 0.0, 4.0), ("b", 0.5, 4.5))}
    att = split_shared([device(STAGGERED, 0.0, 4.5)], [window("a", 0, 4, uses["a"]), window("b", 0.5, 4.5, uses["b"])])
    got = att.by_job()
    assert got["a"] == pytest.approx(truth_j(STAGGERED, "a", 0, 4.5), rel=1e-9)
    assert got["b"] == pytest.approx(truth_j(STAGGERED, "b", 0, 4.5), rel=1e-9)
    assert att.unattributed_j() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("period", [1.0, 5.0])
def test_a_jobs_figure_at_its_end_is_its_figure_later(period: float) -> None:
    """Read at A's end (4 s), B is running and its holder has recorded only the periods
    that ended by then (none at a 5 s period); A's figure is then what it is once B's are
    all in: the truth, both times."""
    a_uses = recorded(STAGGERED, "a", asks(0.0, 4.0, period))
    b_asks = asks(0.5, 4.5, period)
    b_early = recorded(STAGGERED, "b", [t for t in b_asks if t <= 4.0])
    b_all = recorded(STAGGERED, "b", b_asks)
    early = split_shared([device(STAGGERED, 0.0, 4.0)], [window("a", 0, 4, a_uses), window("b", 0.5, 4.0, b_early)])
    later = split_shared([device(STAGGERED, 0.0, 4.5)], [window("a", 0, 4, a_uses), window("b", 0.5, 4.5, b_all)])
    truth = truth_j(STAGGERED, "a", 0, 4)
    assert early.by_job()["a"] == pytest.approx(truth, rel=1e-9)
    assert later.by_job()["a"] == pytest.approx(truth, rel=1e-9)


def test_another_process_idle_power_and_use_that_changes_inside_a_period() -> None:
    """A process of no job at 10 % throughout (it outlives the jobs), 50 W idle, and A's use
    that steps from 60 to 30 % at 1.7 s, inside its second period. Each instant's power goes
    by use: a job's truth is the integral of power x its use / the device's use. Split by
    rate with A's period means, only the period where A's use changed is off, by what its
    mean makes of it; the process of no job is never charged to a job."""
    procs = [Proc("a", 60, 0.0, 1.7), Proc("a", 30, 1.7, 3.0), Proc("b", 20, 1.0, 4.0), Proc(None, 10, -1.0, 9.0)]
    idle_w = 50.0
    uses = {"a": recorded(procs, "a", [0, 1, 2, 3]), "b": recorded(procs, "b", [1, 2, 3, 4])}
    att = split_shared([device(procs, 0.0, 4.0, idle_w)], [window("a", 0, 3, uses["a"]), window("b", 1, 4, uses["b"])])

    def truth(job: str | None) -> float:
        """Power x the job's part of the use, integrated in 1 ms steps (the use is constant on each)."""
        total = 0.0
        for i in range(4000):
            t = (i + 0.5) / 1000
            running = [p for p in procs if p.start <= t < p.end]
            use = math.fsum(p.pct for p in running)
            mine = math.fsum(p.pct for p in running if p.job == job)
            total += (idle_w + W_PER_PCT * use) * mine / use / 1000
        return total

    # The one period where a mean stands for two rates, (1, 2] s: A's 51 % for 60 % over
    # 0.7 s (500 W: the device at 90 %) then 30 % over 0.3 s (350 W, at 60 %). Every job
    # and the process of no job get their mean's part of 81 % there (A 51, B 20, the
    # other 10: all three periods agree), not 60/90 then 30/60 and so on: off the truth by
    # exactly that much, and exact everywhere else.
    def off(mean: float, first: float, then: float) -> float:
        return 500 * 0.7 * (mean / 81 - first / 90) + 350 * 0.3 * (mean / 81 - then / 60)

    got = att.by_job()
    assert got["a"] == pytest.approx(truth("a") + off(51, 60, 30), rel=1e-9)
    assert got["b"] == pytest.approx(truth("b") + off(20, 20, 20), rel=1e-9)
    assert att.unattributed_j() == pytest.approx(truth(None) + off(10, 10, 10), rel=1e-9)


def test_a_process_of_no_job_that_exits_is_sized_by_the_periods_that_saw_it() -> None:
    """A at 30 % over [0, 4] s, B at 10 % over [0.7, 4.7] s, a process of no job at 50 %
    from 0 s until it exits at 2.8 s; A's holder asks on the second, B's 0.7 s after. A's
    period (2, 3] is asked after the exit: NVML dropped the process's samples, so it reads no
    use of it; B's (1.7, 2.7], asked before, reads all of it. Over (2, 2.7] the process of no
    job is the one that period saw: each job gets its processes' energy there. Only after
    B's ask at 2.7 s does no period see the process: its 25 J there (5 W x 50 % x 0.1 s) are
    what a job can be charged of it, so each figure and the unattributed energy lie within
    that of their truths. (Taking the smaller of the two periods' estimates would charge A
    150 J and B 50 J of the process's energy.)"""
    procs = [Proc("a", 30, 0.0, 4.0), Proc("b", 10, 0.7, 4.7), Proc(None, 50, 0.0, 2.8)]
    uses = {"a": recorded(procs, "a", asks(0.0, 4.0, 1.0)), "b": recorded(procs, "b", asks(0.7, 4.7, 1.0))}
    att = split_shared([device(procs, 0.0, 4.7)], [window("a", 0, 4, uses["a"]), window("b", 0.7, 4.7, uses["b"])])
    last_seen = 2.7  # the last ask before the exit, of either holder
    unseen = truth_j(procs, None, last_seen, 2.8) + 1e-9  # (and rounding)
    got = att.by_job()
    for job in ("a", "b"):
        assert abs(got[job] - truth_j(procs, job, 0, 4.7)) <= unseen, (job, got[job])
    assert abs(att.unattributed_j() - truth_j(procs, None, 0, 4.7)) <= unseen


def test_a_job_alone_gets_its_period_ratio_whatever_the_use_did_inside_it() -> None:
    """One job, one 1 s period: A at 60 % then 20 % from 0.3 s, a process of no job at 40 %
    from 0.5 s. With power following use, A's period ratio is exact for the period as a
    whole: 5 W x (60 x 0.3 + 20 x 0.7) = 160 J."""
    procs = [Proc("a", 60, 0.0, 0.3), Proc("a", 20, 0.3, 1.0), Proc(None, 40, 0.5, 5.0)]
    att = split_shared([device(procs, 0.0, 1.0)], [window("a", 0, 1, recorded(procs, "a", [0, 1]))])
    assert att.by_job()["a"] == pytest.approx(160.0, rel=1e-9)
    assert att.unattributed_j() == pytest.approx(truth_j(procs, None, 0, 1), rel=1e-9)


def test_a_running_job_is_charged_only_where_its_periods_cover_it() -> None:
    """Read at 3 s, B (running from 1 s) has one period, (1, 2] s; its next is still to come.
    B is charged its part of (1, 2] only, while A's part of (2, 3] is sized with B at the rate
    of its last period: A gets its truth either way; (2, 3]'s B part waits, unattributed."""
    procs = [Proc("a", 60, 0.0, 4.0), Proc("b", 20, 1.0, 4.0)]
    a_uses = recorded(procs, "a", [0, 1, 2, 3])
    att = split_shared(
        [device(procs, 0.0, 3.0)], [window("a", 0, 3, a_uses), window("b", 1, 3, recorded(procs, "b", [1, 2]))]
    )
    assert att.by_job()["a"] == pytest.approx(truth_j(procs, "a", 0, 3), rel=1e-9)
    assert att.by_job()["b"] == pytest.approx(truth_j(procs, "b", 1, 2), rel=1e-9)
    assert att.unattributed_j() == pytest.approx(truth_j(procs, "b", 2, 3), rel=1e-9)


def test_periods_that_reach_before_the_jobs_windows_still_add_up() -> None:
    """One holder (the pod watcher) asks for both jobs at once; its first period began 0.2 s
    before it saw them start, at 0.5 s, and they ran alone on the GPU: every joule of their
    windows is theirs (the stretch before is no job's), each its part, none unattributed."""
    procs = [Proc("a", 30, 0.5, 3.0), Proc("b", 10, 0.5, 3.0)]
    times = [0.3, 1.3, 2.3, 3.0]
    att = split_shared(
        [device(procs, 0.5, 3.0)],
        [window("a", 0.5, 3, recorded(procs, "a", times)), window("b", 0.5, 3, recorded(procs, "b", times))],
    )
    assert att.by_job()["a"] == pytest.approx(truth_j(procs, "a", 0, 3), rel=1e-9)
    assert att.by_job()["b"] == pytest.approx(truth_j(procs, "b", 0, 3), rel=1e-9)
    assert att.unattributed_j() == pytest.approx(0.0, abs=1e-9)


# -- the wrapper's periods: one steady stretch each ------------------------------------


class _Tree:
    """The job's process tree: one process, pid 10."""

    def refresh(self) -> frozenset[int]:
        return frozenset({10})


class _Driver:
    """A per-process source that answers, at each ask, the use since the previous one from a
    schedule (pid -> use, per ask): the processes listed hold the device."""

    def __init__(self, schedule: list[dict[int, float]]) -> None:
        self.schedule, self.asks = schedule, 0

    def process_use(self, since_us: int | None = None) -> list[DeviceUse]:
        use = self.schedule[min(self.asks, len(self.schedule) - 1)]
        self.asks += 1
        return [DeviceUse("gpu", "GPU-x", "sm", frozenset(use), dict(use))]


def _wrapper_events(
    schedule: list[dict[int, float]], monkeypatch: pytest.MonkeyPatch
) -> list[tuple[float, float, float, float, bool]]:
    """The USE events (start s, end s, job_use, device_use, steady) of a wrapper of a job whose
    process is pid 10, asking once a second (5 s periods) from 0 s through ``schedule``."""
    clock = [0]
    monkeypatch.setattr(usage.time, "time_ns", lambda: clock[0])
    sent: list[wire.pb.JobEvent] = []
    driver = _Driver(schedule)
    rec = usage.UseRecorder(EventBuilder(JobSpec("j", "j")), sent.extend, _Tree(), lambda: [driver], period_s=5.0)  # type: ignore[arg-type]
    rec._period_ns = rec._use.last_ns = 0  # what start() sets, without its thread: asks below
    for second in range(len(schedule)):
        clock[0] = second * S
        rec.sample()
        if clock[0] - rec._period_ns >= 5 * S:
            rec.flush()
    rec.flush()
    return [(e.time_ns / S - e.use_period_ns / S, e.time_ns / S, e.job_use, e.device_use, e.use_steady) for e in sent]


def test_a_wrappers_period_ends_where_the_processes_on_the_device_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process of no job (pid 99) at 20 % throughout; the job's process comes onto the GPU
    in (1, 2] s at 60 %, another job's (pid 77) in (4, 5] at 20 %, and the job's exits in
    (7, 8]. Each ask that found other processes than the one before is a period of its own,
    unsteady; between them, steady periods of one set of processes each: (2, 4] at 60 of
    80 %, (5, 7] at 60 of 100 %. The exited process left no sample for (7, 8] (NVML drops
    them): it counts at half its last use there, 30 of 70 %, and the job's part after it is a
    measured 0 (the device stays the job's)."""
    other, job, second_job = {99: 20.0}, {10: 60.0}, {77: 20.0}
    schedule = [other, other, other | job, other | job, other | job] + [other | job | second_job] * 3
    events = _wrapper_events(schedule + [other | second_job] * 3, monkeypatch)
    assert events == [
        (1.0, 2.0, 60.0, 80.0, False),
        (2.0, 4.0, 60.0, 80.0, True),
        (4.0, 5.0, 60.0, 100.0, False),
        (5.0, 7.0, 60.0, 100.0, True),
        (7.0, 8.0, 30.0, 70.0, False),
        (8.0, 10.0, 0.0, 40.0, True),
    ]


def test_a_wrappers_period_holds_use_that_changes_while_the_processes_stay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Use that wavers or steps (NVML's samples come at their own pace: an ask may find none
    of a running process's) keeps 5 s steady periods while the same processes hold the
    device; the first ask that found them is unsteady (they started somewhere in it)."""
    use = [55.0, 64.0, 0.0, 62.0, 55.0, 64.0, 58.0, 20.0, 20.0, 64.0, 60.0]
    events = _wrapper_events([{10: u, 99: 20.0} for u in use], monkeypatch)
    assert [(a, b, steady) for a, b, _, _, steady in events] == [(0.0, 1.0, False), (1.0, 6.0, True), (6.0, 10.0, True)]
    assert events[1][2] == pytest.approx(math.fsum(use[2:7]) / 5)
