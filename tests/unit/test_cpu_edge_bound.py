"""The bound of a host's energy split by CPU time in a period where a job's processes appeared
or went (an *edge*, :func:`wattline.accounting.use_split.mark_edges`).

A holder reads each job's CPU time and the host's when it looks, so in such a period the
split sees only the counts: the job's ``k x tau`` CPU-seconds against the host's
``k x tau + o x T`` (``k`` cores for ``tau`` of the period's ``T``, the other processes at
``o``), whatever part of the period ``tau`` was. The truth, built here sample by sample, is
the job's share ``k / (k + o)`` of each sample's energy while it ran, so it depends on where
in the period it ran when the power varies. For every placement of ``tau`` in the period
(brute force, on the samples' grid) the figure must lie within its ``split`` term of the truth.

Width: the counts say nothing of where, nor of ``tau`` itself, so the term spans the job's part
from none of the period to its share of all of it (its weights beside the period): half-width
``max(r, s - r) E`` (``r``: the period's ratio ``k f / (k f + o)``, ``s = k / (k + o)``, ``f = tau /
T``, ``E`` the period's energy, all from what the test built). At a constant power every
placement gives one truth, ``f s E``, so the error is ``(r - f s) E`` and the term is wider by
``F = max(r, s - r) / (r - f s)``: the price of not knowing ``f``, largest where the error is
small (a job small beside the others, or there nearly all the period). A power concentrated in
part of the period only spreads the placements' truths, so their farthest is no nearer and the
term no more than F times it either.
"""

from __future__ import annotations

import pytest

from wattline.accounting.attribution import ChannelEnergy, JobWindow, UseInterval, UseTimeline, split_shared
from wattline.accounting.window_energy import Interval
from wattline.quality import Quality

S = 10**9
T = 1.0  #: a period, s
STEP = 0.05  #: a sample, s (the placements' grid)
N = round(T / STEP)


def power(period: int, i: int, concentrated: bool) -> float:
    """W in sample ``i`` of ``period`` (1: before, 2: the edge, 3: after): 40 W, or in the edge
    period 76 W in its first half and 4 W in its second."""
    if concentrated and period == 2:
        return 76.0 if i < N // 2 else 4.0
    return 40.0


def scenario(k: float, o: float, f: float, stop: bool, concentrated: bool, first: bool) -> tuple[float, float, float]:
    """Periods 0..4 of the job's CPU time, the host's samples over 1..3 (before, the edge, after):
    the job's processes start in period 2 (or stop, ``stop``), using ``k`` cores for ``f`` of it.
    ``first``: the job's window opens at the edge period (closes at its end, ``stop``): no period
    of it on that side. Returns the job's figure, its split term, and the truths of every
    placement (min, max)."""
    tau = round(f * N)
    channel = ChannelEnergy(
        "h", "cpu_package", "package-0", Quality.COUNTER,
        [Interval(round((p * T + i * STEP) * S), round((p * T + (i + 1) * STEP) * S), power(p, i, concentrated) * STEP)
         for p in (1, 2, 3) for i in range(N)],
    )  # fmt: skip
    job_cpu = [k, k, k * f, 0.0, 0.0] if stop else [0.0, 0.0, k * f, k, k]  # mean cores per period
    periods = [
        UseInterval(round(p * T * S), round((p + 1) * T * S), 100 * job_cpu[p], 100 * (job_cpu[p] + o), "cpu-time")
        for p in range(5)
    ]
    span = ((0, 3) if stop else (2, 5)) if first else (0, 5)
    window = JobWindow(
        "J", "h", round(span[0] * T * S), round(span[1] * T * S), uses={"cpu:host": UseTimeline(periods[slice(*span)])}
    )
    got = next(s for s in split_shared([channel], [window], "cpu-time").shares if s.job_id == "J")
    share = k / (k + o)
    steady = sum(power(1 if stop else 3, i, concentrated) * STEP * share for i in range(N))

    def truth(at: int) -> float:
        """The job's energy with its processes in samples ``at .. at + tau`` of the edge period."""
        return steady + sum(power(2, i, concentrated) * STEP * share for i in range(at, at + tau))

    # a start edge's processes run to the period's end, a stop edge's from its start; every place
    truths = [truth(at) for at in range(N - tau + 1)]
    return got.energy_j, got.split_bound_j, min(truths), max(truths)


CASES = [(3.0, 1.0, 0.5), (3.0, 1.0, 0.25), (1.0, 3.0, 0.5), (2.0, 2.0, 0.75), (1.0, 1.0, 0.1)]


@pytest.mark.parametrize("first", [False, True], ids=["beside-periods", "first-or-last"])
@pytest.mark.parametrize("stop", [False, True], ids=["start", "stop"])
@pytest.mark.parametrize(("k", "o", "f"), CASES)
def test_every_placement_lies_within_the_split_term(k: float, o: float, f: float, stop: bool, first: bool) -> None:
    s, r = k / (k + o), k * f / (k * f + o)
    factor = max(r, s - r) / (r - f * s)
    for concentrated in (False, True):
        energy, term, low, high = scenario(k, o, f, stop, concentrated, first)
        e = sum(power(2, i, concentrated) * STEP for i in range(N))  # the edge period's energy
        farthest = max(energy - low, high - energy)
        assert energy - term <= low + 1e-9 and high <= energy + term + 1e-9, (energy, term, low, high)
        assert term <= max(r, s - r) * e * (1 + 1e-9), (term, e)  # between none and its share of all
        assert term <= factor * farthest * (1 + 1e-9), (term, farthest, factor)
        if not concentrated:
            assert high - low == pytest.approx(0.0, abs=1e-9)
            assert farthest == pytest.approx((r - f * s) * e, rel=1e-9)


@pytest.mark.parametrize("sent_steady", [False, True])
def test_a_job_through_all_its_periods_has_a_term_only_at_edges_it_was_not_sure_of(sent_steady: bool) -> None:
    """The same job running through three periods: its middle period is no edge, and the figure
    is exact. Its first and last carry a term (for all the counts say its processes may have
    come late or gone early) unless its holder sent them steady (it knew they ran throughout:
    a pod's periods run from its containers' start to their end)."""
    channel = ChannelEnergy(
        "h", "cpu_package", "package-0", Quality.COUNTER,
        [Interval(round(i * STEP * S), round((i + 1) * STEP * S), 40.0 * STEP) for i in range(3 * N)],
    )  # fmt: skip
    periods = [
        UseInterval(round(p * T * S), round((p + 1) * T * S), 300.0, 400.0, "cpu-time", sent_steady) for p in range(3)
    ]
    window = JobWindow("J", "h", 0, round(3 * T * S), uses={"cpu:host": UseTimeline(periods)})
    got = next(s for s in split_shared([channel], [window], "cpu-time").shares if s.job_id == "J")
    assert got.energy_j == pytest.approx(40.0 * 3 * T * 0.75, rel=1e-9)
    # the first and last periods: between none (others there) and 0.75: 0.75 x 40 J each
    assert got.split_bound_j == pytest.approx(0.0 if sent_steady else 2 * 0.75 * 40.0 * T, rel=1e-9)
