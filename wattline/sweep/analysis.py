"""A sweep's answer from its runs' figures: each point's mean, bound and spread; the ranking
by energy per unit; the Pareto front against throughput; the best settings for an SLA; and
whether each advantage is real. Pure: no I/O, no clock.

**The significance rule.** An advantage of point A over point B (B's figure minus A's) is
*real* only when it exceeds both

- the measurement bound of the difference (:func:`wattline.accounting.uncertainty.change_bound`,
  as ``wattline compare`` gives it: model terms add, measurement terms in root-sum-square), and
- the run-to-run spread: twice the two points' ranges of repeats (max - min) added, each
  range taken at least as wide as the median range of the sweep's points and as
  :data:`MIN_SPREAD` of the point's mean;

and each point has at least :data:`MIN_RUNS` runs. Otherwise it is "within uncertainty".
The bound covers what the meters may be off; only the repeats show how much the workload
itself moves between runs (start-up jitter against a fixed unit count), which the bound
rightly does not hold. A range of three runs can be small by chance (two identical settings
whose runs happen to cluster apart), hence the floors and the factor two: three runs alone
cannot tell a spread of a few tenths of a percent from none.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from wattline.accounting.uncertainty import Side, change_bound
from wattline.reports.economics import J_PER_KWH, MILLION, instances_for_sla
from wattline.sweep.grid import Point

#: Runs a point needs before any of its differences can be called real.
MIN_RUNS = 3
#: How many of the two points' ranges an advantage must exceed.
SPREAD_FACTOR = 2.0
#: The narrowest range of runs believed, relative to the mean: two runs of one job differ
#: by a few tenths of a percent (start-up jitter against a fixed unit count; issue #32), so
#: a narrower range of three runs is luck, not a property of the setting.
MIN_SPREAD = 0.005


@dataclass(frozen=True)
class RunFigures:
    """One run (job) of a point, as its report gives it."""

    point: Point
    run: int
    job_id: str
    status: int  #: the command's exit status
    j_per_unit: float | None = None
    throughput_per_s: float | None = None
    throughput_per_instance_h: float | None = None
    mean_power_w: float | None = None
    power_per_instance_w: float | None = None
    side: Side | None = None  #: relative measurement and model bounds of its energy
    estimate_fraction: float = 0.0
    saturated: bool = True
    problem: str = ""  #: why it gives no figures (failed, no units, no energy data)
    #: median of the latencies the workload reported in the saturated window (seconds), if any
    latency_s: float | None = None

    @property
    def usable(self) -> bool:
        return self.status == 0 and not self.problem and self.j_per_unit is not None and self.j_per_unit > 0


@dataclass(frozen=True)
class Value:
    """A figure of one point over its runs: mean, relative range, bound."""

    mean: float
    values: tuple[float, ...]
    side: Side | None  #: None: no measurement bound applies (counts, cost)

    @property
    def range(self) -> float:
        return max(self.values) - min(self.values)


@dataclass(frozen=True)
class Advantage:
    """A point's lead over the next one on a figure (lower is better)."""

    over: Point
    pct: float  #: how much more the next one's figure is, percent of this one's
    bound_pp: float | None  #: the measurement bound of that difference, percentage points
    spread_pp: float | None  #: the run-to-run spread it must exceed, percentage points
    real: bool
    why: str  #: "real", or what it is within


@dataclass
class PointResult:
    """One point of the grid and its runs."""

    point: Point
    runs: list[RunFigures]
    j_per_unit: Value | None = None
    throughput_per_s: Value | None = None
    mean_power_w: Value | None = None
    latency_s: Value | None = None  #: when every run reported latencies
    sla_energy_kwh_per_million: Value | None = None
    sla_cost_per_million: Value | None = None
    sla_instances: tuple[int, int] | None = None  #: fewest, most instances over its runs
    pareto: bool = False
    advantage: Advantage | None = None  #: on energy per unit, over the next point in the ranking

    @property
    def usable(self) -> list[RunFigures]:
        return [r for r in self.runs if r.usable]


@dataclass
class Choice:
    """The best point on one figure, and its lead over the runner-up."""

    figure: str
    point: PointResult
    advantage: Advantage | None


@dataclass
class SweepAnswer:
    """The ranking (by energy per unit), the points without figures, and the choices."""

    ranked: list[PointResult]
    failed: list[PointResult]
    choices: list[Choice] = field(default_factory=list)


def _worst_side(runs: Sequence[RunFigures]) -> Side | None:
    """The widest relative bounds among the runs (the mean is no better bounded than its worst run)."""
    sides = [r.side for r in runs]
    if not sides or any(s is None for s in sides):
        return None
    return Side(max(s.measurement for s in sides if s), max(s.model for s in sides if s))


def _value(runs: Sequence[RunFigures], get: Callable[[RunFigures], float | None], bounded: bool) -> Value | None:
    values = [v for v in (get(r) for r in runs) if v is not None]
    if not values or len(values) != len(runs):
        return None
    return Value(statistics.fmean(values), tuple(values), _worst_side(runs) if bounded else None)


def _sla_figures(run: RunFigures, sla: float, price: float | None) -> tuple[int, float, float | None] | None:
    """(instances, kWh per million units at the SLA, USD per million at the SLA) as ``compare``
    counts them: the instances needed, rounded up, each drawing the run's power."""
    n = instances_for_sla(sla, run.throughput_per_instance_h)
    if n is None or run.power_per_instance_w is None:
        return None
    kwh = n * run.power_per_instance_w * 3600.0 * MILLION / sla / J_PER_KWH
    return n, kwh, None if price is None else n * price * MILLION / sla


def advantage(best: Value, nxt: Value, over: Point, floor_rel: float, runs: int) -> Advantage:
    """``best``'s lead over ``nxt`` (the significance rule of this module)."""
    pct = 100.0 * (nxt.mean / best.mean - 1.0) if best.mean > 0 else 0.0
    bound = change_bound(nxt.mean / best.mean, best.side, nxt.side) if best.mean > 0 else None
    if best.side is None and nxt.side is None:
        bound = 0.0  # an exact figure (instances, cost): only the repeats move it
    floor_rel = max(floor_rel, MIN_SPREAD)
    spread_abs = SPREAD_FACTOR * (max(best.range, floor_rel * best.mean) + max(nxt.range, floor_rel * nxt.mean))
    spread = 100.0 * spread_abs / best.mean if best.mean > 0 else None
    if runs < MIN_RUNS:
        return Advantage(over, pct, bound, None, False, f"within uncertainty (fewer than {MIN_RUNS} runs each)")
    if pct <= 0:
        return Advantage(over, pct, bound, spread, False, "within uncertainty (a tie)")
    if bound is None:
        return Advantage(over, pct, bound, spread, False, "within uncertainty (no bound)")
    if pct <= bound:
        return Advantage(over, pct, bound, spread, False, f"within uncertainty (bound ± {bound:.2g} pp)")
    if spread is None or pct <= spread:
        return Advantage(over, pct, bound, spread, False, f"within uncertainty (spread of runs ± {spread or 0:.2g} pp)")
    return Advantage(over, pct, bound, spread, True, "real")


def _floor(values: Sequence[Value | None]) -> float:
    """The sweep's median relative range of a figure: no point's spread is taken below it."""
    rels = [v.range / v.mean for v in values if v is not None and v.mean > 0 and len(v.values) > 1]
    return statistics.median(rels) if rels else 0.0


def _costs(p: PointResult, latency: bool) -> list[tuple[float, float]]:
    """The point's figures to minimise (energy per unit, throughput negated, latency), each with
    the spread of its runs (at least MIN_SPREAD of it): how far apart two such figures may be
    and still be the same."""
    assert p.j_per_unit is not None and p.throughput_per_s is not None
    figures = [p.j_per_unit, p.throughput_per_s, *([p.latency_s] if latency and p.latency_s is not None else [])]
    signs = [1.0, -1.0, 1.0]
    return [(sign * v.mean, max(v.range, MIN_SPREAD * abs(v.mean))) for sign, v in zip(signs, figures, strict=False)]


def _beats(q: list[tuple[float, float]], p: list[tuple[float, float]]) -> bool:
    """Q dominates P: no worse on any figure beyond the two spreads, better on one beyond them
    (two settings whose figures differ by noise never push each other off the front)."""
    apart = [(a, b, max(sa, sb)) for (a, sa), (b, sb) in zip(q, p, strict=True)]
    return all(a <= b + tol for a, b, tol in apart) and any(a < b - tol for a, b, tol in apart)


def _pareto(ranked: Sequence[PointResult]) -> None:
    """Mark the points no other beats on energy per unit (lower), throughput (higher) and, where
    every point has one, latency (lower): a setting that buys its energy with latency stays on
    the front for whom latency counts."""
    latency = all(p.latency_s is not None for p in ranked)
    costs = {id(p): _costs(p, latency) for p in ranked}
    for p in ranked:
        p.pareto = not any(q is not p and _beats(costs[id(q)], costs[id(p)]) for q in ranked)


def _choose(
    name: str, pts: Sequence[PointResult], get: Callable[[PointResult], Value | None], runs: int
) -> Choice | None:
    """The point lowest on ``get``, with its lead over the runner-up."""
    have = sorted((p for p in pts if get(p) is not None), key=lambda p: get(p).mean)  # type: ignore[union-attr]
    if not have:
        return None
    lead = None
    if len(have) > 1:
        floor = _floor([get(p) for p in have])
        lead = advantage(get(have[0]), get(have[1]), have[1].point, floor, runs)  # type: ignore[arg-type]
    return Choice(name, have[0], lead)


def analyse(runs: Sequence[RunFigures], grid: Sequence[Point], sla: float | None, price: float | None) -> SweepAnswer:
    """The sweep's answer from every run of every point in ``grid``."""
    results = [PointResult(p, [r for r in runs if r.point == p]) for p in grid]
    for p in results:
        ok = p.usable
        if not ok:
            continue
        p.j_per_unit = _value(ok, lambda r: r.j_per_unit, bounded=True)
        p.throughput_per_s = _value(ok, lambda r: r.throughput_per_s, bounded=False)
        p.mean_power_w = _value(ok, lambda r: r.mean_power_w, bounded=True)
        p.latency_s = _value(ok, lambda r: r.latency_s, bounded=False)
        if sla is not None:
            per_run = [_sla_figures(r, sla, price) for r in ok]
            if all(f is not None for f in per_run):
                figs = [f for f in per_run if f is not None]
                p.sla_instances = (min(f[0] for f in figs), max(f[0] for f in figs))
                p.sla_energy_kwh_per_million = Value(
                    statistics.fmean(f[1] for f in figs), tuple(f[1] for f in figs), _worst_side(ok)
                )
                if price is not None:
                    costs = tuple(float(f[2] or 0.0) for f in figs)
                    p.sla_cost_per_million = Value(statistics.fmean(costs), costs, None)
    ranked = sorted(
        (p for p in results if p.j_per_unit is not None and p.throughput_per_s is not None),
        key=lambda p: p.j_per_unit.mean,  # type: ignore[union-attr]
    )
    failed = [p for p in results if p not in ranked]
    runs_each = min((len(p.usable) for p in ranked), default=0)
    floor = _floor([p.j_per_unit for p in ranked])
    for best, nxt in itertools.pairwise(ranked):
        assert best.j_per_unit is not None and nxt.j_per_unit is not None
        best.advantage = advantage(best.j_per_unit, nxt.j_per_unit, nxt.point, floor, runs_each)
    _pareto(ranked)
    answer = SweepAnswer(ranked, failed)
    wanted: list[tuple[str, Callable[[PointResult], Value | None]]] = [("energy per unit", lambda p: p.j_per_unit)]
    if sla is not None:
        wanted.append(("energy at the SLA", lambda p: p.sla_energy_kwh_per_million))
        if price is not None:
            wanted.append(("cost at the SLA", lambda p: p.sla_cost_per_million))
    for name, get in wanted:
        choice = _choose(name, ranked, get, runs_each)
        if choice is not None:
            answer.choices.append(choice)
    return answer
