"""When a job saturates the hardware: the start of its saturated window.

The study measures energy and throughput only once a workload drives the hardware
to its limit; warm-up (compilation, ramp-up) is excluded from the figures but still
reported. :func:`detect_saturation` finds that point from what a job records. It is
a pure, deterministic function of its inputs; every threshold is a field of
:class:`SaturationParams`.

Order of precedence:

1. ``mark_ns`` (a "saturated" PHASE event, ``wattline mark``): method ``"manual"``.
2. ``saturated_after_ns`` (a fixed warm-up duration): method ``"after"``.
3. Detection from the data, below. Nothing found: ``saturated=False`` with a reason.

Detection.

* **Bins.** The job window ``[start_ns, end_ns)`` is cut into ``n`` equal bins,
  ``n = min(target_bins, floor(length / min_bin_s))``; fewer than ``min_bins`` bins
  means the job is too short to judge. The cumulative unit count is interpolated
  linearly between reported points (units are spread evenly between two reports;
  nothing is counted after the last report) and each bin's throughput is its
  unit increase divided by its width.
* **Wind-down.** Trailing bins below ``min_rate_fraction`` of the maximum bin rate
  (the job draining its queue, the last partial report) are dropped before the
  search, so a final drop neither hides the plateau nor moves it.
* **Throughput plateau.** The plateau starts at the first bin ``i`` for which, with
  ``R`` = median rate of bins ``i..end`` (the rest of the job):
  ``R >= min_rate_fraction * max rate``; bin ``i`` and all but ``window_outliers`` of
  the ``window_bins`` bins from ``i`` are within ``+-tol`` of ``R`` (``tol`` is
  ``tolerance``, widened on noisy data to ``noise_k`` x the rest's relative median
  absolute deviation, at most ``max_tolerance``); at least
  ``min_inside_fraction`` of the rest is within it too; the rest spans at least
  ``min_plateau_fraction`` of the job (and ``window_bins`` bins); and the rest is
  not still rising (its least-squares rise across the rest, relative to its mean, at
  most ``max(max_trend, 0.75 x tol)``). The point is the start of bin ``i``: for a ramp this
  is where throughput comes within ``tolerance`` of the plateau, for a step or a
  compile stall the first whole bin after it (so within one bin of the knee).
* **Utilization.** The accelerator is saturated from the first bin from which the
  binned utilization stays at or above ``utilization_threshold`` for the same
  minimum plateau length (a sample describes the interval that ends at its time).
* **Both available.** The later of the two points: saturation means the hardware
  is busy *and* the throughput is steady (a pegged accelerator still autotuning
  is not yet comparable; a steady throughput on an idle accelerator is not yet
  driven to the limit). Where only one of them is found it is used, and the
  reason says why the other was not.

Limits: with bin-to-bin jitter of +-20 % the last fifth of a linear ramp that never
levels off can pass for a noisy plateau (about one case in eight in simulation; none
at +-10 %); marking saturation from the workload (``mark_saturated``) or
``--saturated-after`` removes the doubt.

``plateau_rate`` is the median bin throughput (units/s) from the saturation point
to the end of the active part of the job, where a unit timeline exists.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from wattline.units import NS_PER_S

__all__ = [
    "Saturation",
    "SaturationParams",
    "cumulative_from_events",
    "detect_saturation",
    "grid_bins",
]


@dataclass(frozen=True, slots=True)
class SaturationParams:
    """Thresholds of :func:`detect_saturation`; the defaults suit jobs of a minute or more."""

    target_bins: int = 60  #: bins per job, unless that makes them shorter than min_bin_s
    min_bin_s: float = 1.0  #: shortest bin, seconds
    min_bins: int = 10  #: fewer bins than this: too short to judge
    window_bins: int = 5  #: bins from the candidate that must sit on the plateau
    window_outliers: int = 1  #: of which this many may stray (noise)
    tolerance: float = 0.10  #: +- band around the plateau rate, as a fraction
    min_rate_fraction: float = 0.5  #: plateau rate at least this fraction of the max bin rate
    min_plateau_fraction: float = 0.2  #: plateau spans at least this fraction of the job
    min_inside_fraction: float = 0.75  #: fraction of the rest of the job inside the band
    max_trend: float = 0.05  #: a rest rising by more than this (least squares, relative) is a ramp
    #: Noise adaptation: the band widens to ``noise_k`` x the rest's relative median
    #: absolute deviation (a busy shared host jitters more than 10 %), at most max_tolerance.
    noise_k: float = 3.0
    max_tolerance: float = 0.2
    utilization_threshold: float = 0.8  #: accelerator utilization (0..1) meaning busy

    def __post_init__(self) -> None:
        if self.target_bins < 1 or self.min_bins < 1 or self.window_bins < 1:
            raise ValueError("target_bins, min_bins and window_bins must be >= 1")
        if not 0 <= self.window_outliers < self.window_bins:
            raise ValueError("window_outliers must be in [0, window_bins)")
        if self.min_bin_s <= 0:
            raise ValueError("min_bin_s must be > 0")
        if self.noise_k < 0 or self.max_tolerance < self.tolerance:
            raise ValueError("noise_k must be >= 0 and max_tolerance >= tolerance")
        for name in ("tolerance", "max_tolerance", "min_rate_fraction", "min_plateau_fraction", "min_inside_fraction"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1]")
        if self.max_trend < 0:
            raise ValueError("max_trend must be >= 0")
        if not 0 < self.utilization_threshold <= 1:
            raise ValueError("utilization_threshold must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class Saturation:
    """Where a job's saturated window starts, and how that was decided."""

    saturated: bool
    at_ns: int | None  #: saturation point, ns since the epoch; None when not saturated
    method: str  #: "manual" | "after" | "throughput-plateau" | "utilization" | "none"
    plateau_rate: float | None  #: units/s at saturation, when a unit timeline exists
    reason: str  #: one line for reports


def cumulative_from_events(events: Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    """Unit events ``(time_ns, units_delta)`` to a cumulative timeline ``(time_ns, units)``.

    Events are ordered by time (stable for equal times); events at the same time merge.
    """
    out: list[tuple[int, float]] = []
    total = 0.0
    for t, delta in sorted(events, key=lambda e: e[0]):
        total += delta
        if out and out[-1][0] == t:
            out[-1] = (t, total)
        else:
            out.append((t, total))
    return out


def detect_saturation(
    start_ns: int,
    end_ns: int,
    *,
    units: Sequence[tuple[int, float]] | None = None,
    unit_events: Sequence[tuple[int, float]] | None = None,
    utilization: Sequence[tuple[int, float]] | None = None,
    mark_ns: int | None = None,
    saturated_after_ns: int | None = None,
    params: SaturationParams | None = None,
) -> Saturation:
    """Decide whether and when the job ``[start_ns, end_ns)`` saturated (see the module doc).

    ``units`` is the cumulative unit timeline ``(time_ns, units since the job start)``,
    ``unit_events`` the same as deltas (give one or the other); ``utilization`` the
    primary accelerator's ``(time_ns, 0..1)`` series.
    """
    p = params or SaturationParams()
    if units is not None and unit_events is not None:
        raise ValueError("give units or unit_events, not both")
    if saturated_after_ns is not None and saturated_after_ns < 0:
        raise ValueError("saturated_after_ns must be >= 0")
    timeline = cumulative_from_events(unit_events) if unit_events is not None else _clean_timeline(units)
    length = end_ns - start_ns
    if length <= 0:
        return _no("empty job window")

    grid = _grid(start_ns, end_ns, p)
    rates = _bin_rates(grid, timeline) if timeline else None

    if mark_ns is not None or saturated_after_ns is not None:
        if mark_ns is not None:
            at, method, what = mark_ns, "manual", "marked saturated"
        else:
            assert saturated_after_ns is not None
            at, method, what = (
                start_ns + saturated_after_ns,
                "after",
                f"saturated after {saturated_after_ns / NS_PER_S:g} s",
            )
        if at >= end_ns:
            return _no(f"{what} at or after the job end")
        at = max(at, start_ns)
        rate = _rate_from(grid, rates, at, p) if grid and rates else None
        return Saturation(True, at, method, rate, f"{what} ({(at - start_ns) / NS_PER_S:g} s into the job)")

    if grid is None:
        n = int(length / (p.min_bin_s * NS_PER_S))
        return _no(f"job too short: {length / NS_PER_S:g} s gives {n} bins of {p.min_bin_s:g} s (need {p.min_bins})")
    if not timeline and not utilization:
        return _no("no unit timeline and no utilization series")

    n = len(grid) - 1
    min_plateau = max(p.window_bins, math.ceil(p.min_plateau_fraction * n))
    plateau_bin: int | None = None
    why_not_plateau = "no unit timeline"
    if rates is not None:
        plateau_bin, why_not_plateau = _plateau(rates, min_plateau, p)
    util_bin: int | None = None
    why_not_util = "no utilization series"
    if utilization:
        util_bin, why_not_util = _utilization(grid, utilization, min_plateau, p)

    if plateau_bin is None and util_bin is None:
        return _no(f"{why_not_plateau}; {why_not_util}")
    if plateau_bin is not None and util_bin is not None:
        if util_bin > plateau_bin:
            i, method = util_bin, "utilization"
            reason = f"throughput plateau from bin {plateau_bin}, utilization >= {p.utilization_threshold:g} later"
        else:
            i, method = plateau_bin, "throughput-plateau"
            reason = f"utilization >= {p.utilization_threshold:g} from bin {util_bin}, throughput plateau later"
    elif plateau_bin is not None:
        i, method, reason = plateau_bin, "throughput-plateau", f"throughput plateau; {why_not_util}"
    else:
        assert util_bin is not None
        i, method, reason = util_bin, "utilization", f"utilization >= {p.utilization_threshold:g}; {why_not_plateau}"
    at = grid[i]
    rate = _rate_from(grid, rates, at, p) if rates else None
    return Saturation(True, at, method, rate, f"{reason} ({(at - start_ns) / NS_PER_S:g} s into the job, {n} bins)")


def _no(reason: str) -> Saturation:
    return Saturation(False, None, "none", None, reason)


def _clean_timeline(points: Sequence[tuple[int, float]] | None) -> list[tuple[int, float]]:
    """Sorted by time; of equal times the last point wins."""
    out: list[tuple[int, float]] = []
    for t, v in sorted(points or (), key=lambda q: q[0]):
        if out and out[-1][0] == t:
            out[-1] = (t, v)
        else:
            out.append((t, float(v)))
    return out


def grid_bins(start_ns: int, end_ns: int, p: SaturationParams) -> int:
    """How many bins detection cuts ``[start_ns, end_ns)`` into (edges ``start_ns + length * j // n``);
    0 when the job is too short for ``min_bins`` of them."""
    n = min(p.target_bins, int((end_ns - start_ns) / (p.min_bin_s * NS_PER_S)))
    return n if n >= p.min_bins else 0


def _grid(start_ns: int, end_ns: int, p: SaturationParams) -> list[int] | None:
    """Bin edges (n+1 integers), or None when the job is too short for min_bins bins."""
    n = grid_bins(start_ns, end_ns, p)
    if not n:
        return None
    return [start_ns + ((end_ns - start_ns) * j) // n for j in range(n + 1)]


def _cum_at(timeline: Sequence[tuple[int, float]], t: int) -> float:
    """Cumulative units at ``t``: linear between points, flat outside them."""
    lo, hi = 0, len(timeline) - 1
    if t <= timeline[lo][0]:
        return timeline[lo][1]
    if t >= timeline[hi][0]:
        return timeline[hi][1]
    while hi - lo > 1:  # invariant: timeline[lo].t < t < timeline[hi].t
        mid = (lo + hi) // 2
        if timeline[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (t0, v0), (t1, v1) = timeline[lo], timeline[hi]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def _bin_rates(grid: list[int] | None, timeline: Sequence[tuple[int, float]]) -> list[float] | None:
    """Units/s per bin; the count is 0 at the job start unless the timeline says otherwise."""
    if grid is None:
        return None
    if timeline[0][0] > grid[0]:
        timeline = [(grid[0], 0.0), *timeline]
    cums = [_cum_at(timeline, t) for t in grid]
    return [(cums[j + 1] - cums[j]) / ((grid[j + 1] - grid[j]) / NS_PER_S) for j in range(len(grid) - 1)]


def _active_end(rates: Sequence[float], p: SaturationParams) -> int:
    """Number of bins left after dropping the trailing wind-down."""
    floor = p.min_rate_fraction * max(rates)
    e = len(rates)
    while e > 0 and rates[e - 1] < floor:
        e -= 1
    return e


def _within(x: float, ref: float, tol: float) -> bool:
    return abs(x - ref) <= tol * ref


def _rise(rates: Sequence[float]) -> float:
    """Relative rise across ``rates`` by least squares: slope x span / mean (0 when flat)."""
    n = len(rates)
    mean = statistics.fmean(rates)
    if n < 2 or mean <= 0:
        return 0.0
    mid = (n - 1) / 2
    slope = sum((i - mid) * (r - mean) for i, r in enumerate(rates)) / sum((i - mid) ** 2 for i in range(n))
    return slope * (n - 1) / mean


def _tolerance(rest: Sequence[float], ref: float, p: SaturationParams) -> float:
    """The plateau band: ``tolerance``, widened on noisy data to ``noise_k`` x the relative
    median absolute deviation of the rest, capped at ``max_tolerance``."""
    if ref <= 0:
        return p.tolerance
    mad = statistics.median(abs(r - ref) for r in rest) / ref
    return min(max(p.tolerance, p.noise_k * mad), p.max_tolerance)


def _plateau(rates: Sequence[float], min_plateau: int, p: SaturationParams) -> tuple[int | None, str]:
    """First bin of the throughput plateau, or None and why not."""
    top = max(rates)
    if top <= 0:
        return None, "no units completed"
    e = _active_end(rates, p)
    for i in range(e):
        rest = rates[i:e]
        if len(rest) < min_plateau:
            break
        ref = statistics.median(rest)
        tol = _tolerance(rest, ref, p)
        if ref < p.min_rate_fraction * top or not _within(rates[i], ref, tol):
            continue
        window = rates[i : i + p.window_bins]
        if sum(not _within(r, ref, tol) for r in window) > p.window_outliers:
            continue
        if sum(_within(r, ref, tol) for r in rest) < p.min_inside_fraction * len(rest):
            continue
        if _rise(rest) > max(p.max_trend, 0.75 * tol):
            continue
        return i, ""
    return None, "throughput never reached a steady plateau (still ramping, too noisy, or too short)"


def _utilization(
    grid: Sequence[int], series: Sequence[tuple[int, float]], min_plateau: int, p: SaturationParams
) -> tuple[int | None, str]:
    """First bin from which binned utilization stays >= threshold for min_plateau bins."""
    pts = sorted(series, key=lambda q: q[0])
    n = len(grid) - 1
    values: list[float | None] = []
    k = 0
    for j in range(n):
        lo, hi = grid[j], grid[j + 1]
        while k < len(pts) and pts[k][0] <= lo:
            k += 1
        inside: list[float] = []
        m = k
        while m < len(pts) and pts[m][0] <= hi:
            inside.append(pts[m][1])
            m += 1
        if inside:
            values.append(sum(inside) / len(inside))
        else:  # no sample ends in this bin: the next one describes it
            values.append(pts[m][1] if m < len(pts) else None)
    run = 0
    for j, v in enumerate(values):
        run = run + 1 if v is not None and v >= p.utilization_threshold else 0
        if run >= min_plateau:
            return j - run + 1, ""
    return None, f"utilization never stayed >= {p.utilization_threshold:g} for {min_plateau} bins"


def _rate_from(grid: Sequence[int], rates: Sequence[float] | None, at: int, p: SaturationParams) -> float | None:
    """Median bin rate from the bin containing ``at`` to the end of the active part."""
    if not rates or max(rates) <= 0:
        return None
    i = 0
    while i + 1 < len(grid) - 1 and grid[i + 1] <= at:
        i += 1
    e = max(_active_end(rates, p), i + 1)
    return statistics.median(rates[i:e])
