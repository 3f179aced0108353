"""Host-wide energy split by CPU time where a job's CPU time was not read (issue #42): its part
is estimated and bounded, never a silent equal split.

Truths are constructed: a host channel at ``POWER_W``; each job's and the other processes'
CPUs over time; the USE periods a holder would send from them (the job's CPU time and the
host's over each period). Where a job's use is hidden from the split (no USE event, as when
its holder could not read it), its true part is still known to the test, and the figure must
lie within its bound of it, the bound no wider than what the jobs that were read left.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from wattline.accounting.attribution import (
    ChannelEnergy,
    JobWindow,
    UseInterval,
    UseTimeline,
    split_shared,
)
from wattline.accounting.window_energy import Interval
from wattline.quality import Quality

S = 10**9
POWER_W = 100.0
LENGTH_S = 20


def channel() -> ChannelEnergy:
    return ChannelEnergy("h", "cpu_package", "package-0", Quality.COUNTER,
                         [Interval(i * S, (i + 1) * S, POWER_W) for i in range(LENGTH_S)])  # fmt: skip


def periods(cpus: list[float], others: list[float], every_s: int = 5, hide: set[int] | None = None) -> UseTimeline:
    """A job's ``cpu:host`` periods every ``every_s`` from its CPUs each second against the
    host's (all jobs' and the others'); periods starting at a second in ``hide`` are not sent."""
    out = []
    for start in range(0, LENGTH_S, every_s):
        span = range(start, start + every_s)
        mine = sum(cpus[t] for t in span) / every_s
        host = sum(others[t] for t in span) / every_s
        if start not in (hide or set()):
            out.append(UseInterval(start * S, (start + every_s) * S, 100 * mine, 100 * host, "cpu-time"))
    return UseTimeline(out)


def truth_j(cpus: list[float], host: list[float]) -> float:
    return math.fsum(POWER_W * c / h for c, h in zip(cpus, host, strict=True))


def shares(jobs: list[JobWindow]) -> dict[str | None, tuple[float, float, float]]:
    """Per job: (energy, its estimated part, that part's bound)."""
    att = split_shared([channel()], jobs, "cpu-time")
    return {s.job_id: (s.energy_j, s.estimated_j, s.estimate_bound_j) for s in att.shares}


@pytest.mark.parametrize("b_cpus", [0.0, 0.5, 2.0, 3.0])
def test_a_job_whose_cpu_time_was_never_read_is_estimated_within_its_bound(b_cpus: float) -> None:
    """A (read) keeps 1 CPU busy, B (never read) ``b_cpus``, other processes 0.5: A gets its
    measured part exactly; B's estimate, whatever it truly used, lies within its bound of the
    truth, and the bound is no wider than what A left."""
    a, b = [1.0] * LENGTH_S, [b_cpus] * LENGTH_S
    host = [x + y + 0.5 for x, y in zip(a, b, strict=True)]
    jobs = [
        JobWindow("A", "h", 0, LENGTH_S * S, uses={"cpu:host": periods(a, host)}),
        JobWindow("B", "h", 0, LENGTH_S * S),
    ]
    got = shares(jobs)
    assert got["A"][0] == pytest.approx(truth_j(a, host), rel=1e-12) and got["A"][1:] == (0.0, 0.0)
    b_j, b_guessed, b_bound = got["B"]
    assert b_guessed == pytest.approx(b_j)
    assert abs(b_j - truth_j(b, host)) <= b_bound + 1e-9
    assert b_bound <= POWER_W * LENGTH_S - got["A"][0] + 1e-9  # no wider than what A left
    total = math.fsum(j for j, _, _ in got.values())
    assert total == pytest.approx(POWER_W * LENGTH_S, rel=1e-12)  # node = jobs + unattributed


@pytest.mark.parametrize("late_cpus", [0.2, 1.0, 2.0])
def test_a_stretch_whose_cpu_time_was_not_read_is_estimated_from_the_nearest_period(late_cpus: float) -> None:
    """A's CPU time was read except over (10, 15] (its holder lost it), where A actually used
    ``late_cpus`` instead of its 1 CPU: the estimate takes the nearest period's rate, the
    error is within the bound, and the read periods are exact."""
    a = [1.0] * 10 + [late_cpus] * 5 + [1.0] * 5
    b = [0.5] * LENGTH_S
    host = [x + y + 0.25 for x, y in zip(a, b, strict=True)]
    jobs = [
        JobWindow("A", "h", 0, LENGTH_S * S, uses={"cpu:host": periods(a, host, hide={10})}),
        JobWindow("B", "h", 0, LENGTH_S * S, uses={"cpu:host": periods(b, host)}),
    ]
    got = shares(jobs)
    a_j, guessed, bound = got["A"]
    stretch = truth_j(a[10:15], host[10:15])
    assert guessed > 0 and abs(a_j - truth_j(a, host)) <= bound + 1e-9
    assert abs(guessed - stretch) <= bound + 1e-9
    assert bound <= POWER_W * 5 - truth_j(b[10:15], host[10:15]) + 1e-9  # what B, read there, left
    assert got["B"][0] == pytest.approx(truth_j(b, host), rel=1e-9)  # B's own read part, exact
    if late_cpus == 1.0:
        assert a_j == pytest.approx(truth_j(a, host), rel=1e-9)  # the rate held: the estimate is right


def test_a_job_alone_without_its_cpu_time_is_charged_the_host_and_says_it_may_be_none_of_it() -> None:
    got = shares([JobWindow("A", "h", 0, LENGTH_S * S)])
    energy, guessed, bound = got["A"]
    assert energy == guessed == bound == pytest.approx(POWER_W * LENGTH_S)


def test_jobs_none_of_which_was_read_split_equally_and_each_may_be_off_by_half() -> None:
    got = shares([JobWindow("A", "h", 0, LENGTH_S * S), JobWindow("B", "h", 0, LENGTH_S * S)])
    for job in ("A", "B"):
        assert got[job] == pytest.approx((POWER_W * LENGTH_S / 2,) * 3)


def test_jobs_all_read_have_no_estimate_and_a_lone_job_gets_its_cpu_share() -> None:
    a = [2.0] * LENGTH_S
    host = [3.0] * LENGTH_S
    got = shares([JobWindow("A", "h", 0, LENGTH_S * S, uses={"cpu:host": periods(a, host)})])
    assert got["A"] == pytest.approx((POWER_W * LENGTH_S * 2 / 3, 0.0, 0.0))
    assert got[None][0] == pytest.approx(POWER_W * LENGTH_S / 3)  # the other processes': no job's


@pytest.mark.parametrize("varying", [False, True])
def test_a_long_job_alone_is_split_at_merged_periods_within_the_coarse_bound(tmp_path: Path, varying: bool) -> None:
    """A job alone on its host for 2 h, its CPU time read every 5 s (1440 periods): its report
    takes one share per run of merged periods, reading the counters at their edges. Steady, the
    figure is exact and the ``coarse`` term 0; with a share that changes every period (and power
    that follows it), the truth (each period's energy x its share) lies within the term, and the
    term is no wider than the merged periods' energy x their shares' full range."""
    from cpu_events import cpu_use

    from wattline import wire
    from wattline.jobs.events import EventBuilder, JobSpec
    from wattline.reports.build import build_report
    from wattline.reports.host_energy import MAX_SHARES
    from wattline.reports.model import ReportSettings
    from wattline.stores.sqlite.store import SqliteStore

    t0, length, period = 1_767_225_600 * S, 7200, 5
    share_of = lambda n: (0.2 + 0.6 * ((n * 7) % 11) / 10) if varying else 0.5  # noqa: E731  a share per period
    power_of = lambda t: 50.0 + 100.0 * share_of(int(t // period)) if varying else 80.0  # noqa: E731
    store = SqliteStore(tmp_path / "w.db")
    batch = wire.Batch(stream_id="agent", seq=1, sent_ns=t0)
    batch.host.host_id = "h"
    cumulative = 0.0
    for i in range(-10, length + 10):
        joules = power_of(i) if 0 <= i < length else 80.0
        cumulative += joules
        batch.samples.add(source="rapl", component="cpu_package", device="package-0", quality=wire.QUALITY_COUNTER,
                          healthy=True, start_ns=t0 + i * S, end_ns=t0 + (i + 1) * S, energy_j=joules,
                          power_w=joules, cumulative_j=cumulative)  # fmt: skip
    builder = EventBuilder(JobSpec("long", "long"))
    events = [builder.open(t0), builder.close(0, t0 + length * S)]
    for n in range(length // period):
        a, b = t0 + n * period * S, t0 + (n + 1) * period * S
        events.append(cpu_use(builder, a, b, job_cpus=share_of(n), host_cpus=1.0))
    batch.job_events.extend(events)
    assert store.write(batch).rejected == 0
    truth = math.fsum(power_of(t) * share_of(int(t // period)) for t in range(length))
    report = build_report(store, "long", ReportSettings(share_rule="cpu-time"), now_ns=t0 + 10 * length * S)  # type: ignore[arg-type]
    got = report.warmup.energy_j + report.saturated_window.energy_j
    bound = report.warmup.bound + report.saturated_window.bound
    if not varying:
        assert got == pytest.approx(truth, rel=1e-9) and bound.coarse_j == 0.0
        return
    assert 0 < abs(got - truth) <= bound.total_j  # merged periods: not exact here, but bounded
    # no wider than each merged run's energy x its shares' full range (the runs as the report
    # merges them: MAX_SHARES at most, k consecutive periods each)
    k = -(-(length // period) // MAX_SHARES)
    runs = [range(n, n + k) for n in range(0, length // period, k)]
    widest = math.fsum(
        math.fsum(power_of(t) for n in run for t in range(n * period, (n + 1) * period))
        * (max(map(share_of, run)) - min(map(share_of, run)))
        for run in runs
    )
    assert bound.coarse_j <= widest, (bound.coarse_j, widest)
    store.close()
