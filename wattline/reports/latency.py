"""A service's latency over the report's span (the whole run, a window asked, an interval of
``--every``): per latency histogram its server exposes (per model where it has several), p50 and
p99 of the requests observed in the span, with the interval the buckets allow.

The holder stores each bucket's observations as they grow (:mod:`wattline.jobs.wrappers.served`),
each event covering the time since the bucket's previous one. A span's bucket counts are those
events' observations apportioned to it by overlap, as units are; the interpolated quantile is
Prometheus' histogram_quantile on them (:func:`wattline.served_metrics.quantile`). The true
quantile lies within a bucket: between the bound below it (exclusive; 0 for the first) and its
own ``le``; in the +Inf bucket it is only known to exceed the last finite bound (``high`` None).
Where an event's span crosses an edge of the window, its observations may all lie inside or all
outside (as :func:`~.window_view.intervals_bound` takes units): ``low`` is the lowest bucket's
lower bound and ``high`` the highest bucket's upper bound over every such choice.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from wattline.jobs.jobs_view import JobView, UnitSeries
from wattline.reports.window_view import Window
from wattline.served_metrics import LatencyTotals, quantile

#: The quantiles reported.
QUANTILES = (0.5, 0.99)
#: The ``le`` of a histogram's ``_sum`` series (seconds), beside its buckets' bounds.
SUM_LE = "sum"


@dataclass(frozen=True)
class Quantile:
    """One quantile of the span's observations: ``value`` as histogram_quantile interpolates
    it; the true quantile is above ``low`` and at most ``high`` (None: above the last finite
    bound, in the +Inf bucket, whose ``value`` is that bound)."""

    q: float
    value: float
    low: float
    high: float | None


@dataclass(frozen=True)
class Latency:
    """One latency series (a histogram, by its ``by`` labels) over the span, in seconds."""

    name: str
    labels: dict[str, str]
    #: Observations in the span (its count's increase), apportioned at its edges ...
    observations: float
    #: ... and how far that may be off (observations done where at its edges is not known).
    observations_bound: float
    mean_s: float | None  #: the sum's increase over the count's (None without observations)
    quantiles: list[Quantile]


@dataclass
class _Bucket:
    """One ``le`` series in the span: observations apportioned, within, and on its edges."""

    apportioned: float = 0.0
    certain: float = 0.0  #: of events wholly inside the span
    uncertain: float = 0.0  #: of events across an edge: all inside or all outside at worst
    bound: float = 0.0  #: how far ``apportioned`` may be off

    def add(self, start_ns: int, end_ns: int, units: float, window: Window | None) -> None:
        if window is None or end_ns <= start_ns:
            inside = 1.0 if window is None or window.from_ns < end_ns <= window.to_ns else 0.0
        else:
            inside = max(0, min(end_ns, window.to_ns) - max(start_ns, window.from_ns)) / (end_ns - start_ns)
        self.apportioned += inside * units
        if inside == 1.0:
            self.certain += units
        elif inside > 0.0:
            self.uncertain += units
            self.bound += max(inside, 1.0 - inside) * units


def latencies(job: JobView, window: Window | None) -> list[Latency]:
    """Every latency series of ``job`` (its view before any clipping) over ``window`` (None:
    every event), sorted by name and labels; a series without observations in it is left out."""
    grouped: dict[UnitSeries, dict[str, _Bucket]] = {}
    for (name, pairs), intervals in job.latency_intervals.items():
        le = dict(pairs)["le"]
        bucket = grouped.setdefault((name, tuple(p for p in pairs if p[0] != "le")), {}).setdefault(le, _Bucket())
        for start_ns, end_ns, units in intervals:
            bucket.add(start_ns, end_ns, units, window)
    out = [_latency(name, dict(labels), buckets) for (name, labels), buckets in sorted(grouped.items())]
    return [x for x in out if x is not None]


def _latency(name: str, labels: dict[str, str], buckets: dict[str, _Bucket]) -> Latency | None:
    total = buckets.get(SUM_LE, _Bucket())
    ordered = sorted(((le, b) for text, b in buckets.items() if (le := _bound(text)) is not None), key=lambda x: x[0])
    if not ordered or ordered[-1][0] != math.inf:
        return None
    count = ordered[-1][1]
    if count.certain + count.uncertain <= 0:
        return None
    bounds = [le for le, _ in ordered]
    totals = LatencyTotals(
        name, labels, tuple((le, b.apportioned) for le, b in ordered), total.apportioned, count.apportioned
    )
    quantiles = []
    for q in QUANTILES:
        value = quantile(q, totals)
        if value is None:
            return None
        low_at, high_at = _bucket_range(q, [b for _, b in ordered])
        low = bounds[low_at - 1] if low_at else 0.0  # a latency is never below 0
        high = None if high_at == len(bounds) - 1 else bounds[high_at]
        quantiles.append(Quantile(q, value, low, high))
    mean = total.apportioned / count.apportioned if count.apportioned > 0 and SUM_LE in buckets else None
    return Latency(name, labels, count.apportioned, count.bound, mean, quantiles)


def _bound(le: str) -> float | None:
    """A bucket's bound from its ``le`` label; None for the sum's, or a value no holder writes."""
    try:
        return None if le == SUM_LE else float(le)
    except ValueError:
        return None


def _bucket_range(q: float, cumulative: list[_Bucket]) -> tuple[int, int]:
    """The lowest and the highest bucket the ``q`` quantile may lie in, whichever way the edge
    events' observations fall. Its bucket is the first whose cumulative count reaches ``q`` of
    all. It is at or below bucket i for some choice when it is with the edge observations at or
    below i in and those above out; above i for some choice when it is with those at or below
    out and those above in. (An observation's events span the same readings in every bucket it
    counts in: each nonzero event covers the time since the previous reading.)"""
    n, u = cumulative[-1].certain, cumulative[-1].uncertain
    last = len(cumulative) - 1
    low = next((i for i, b in enumerate(cumulative) if b.certain + b.uncertain >= q * (n + b.uncertain)), last)
    high = next((i for i, b in enumerate(cumulative) if b.certain >= q * (n + u - b.uncertain)), last)
    return low, max(low, high)


def latency_json(series: Iterable[Latency]) -> list[dict[str, Any]]:
    """The report JSON's ``latency`` (and each interval's): one object per series."""
    return [dataclasses.asdict(x) for x in series]
