"""A window's energy from stored samples: pro rata by overlap, or from the running totals
at its edges.

A sample is an interval ``(start_ns, end_ns]`` with ``energy_j`` drawn at uniform power
inside it, so a window takes ``energy_j x overlap / length`` of a sample it only partly
covers. A zero-length sample counts in full in a window ``[t0, t1]`` when
``t0 < end_ns <= t1`` (points are keyed by interval end).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Interval:
    """One sample of one channel: energy over ``(start_ns, end_ns]``; ``bridged``: a stretch
    whose samples the store lacks, its energy from the stream's counter on both sides of it;
    ``gap_j``: the most a stretch without a good sample could have held (a report's ``gaps``
    bound there), handed out to the jobs that ran then like energy."""

    start_ns: int
    end_ns: int
    energy_j: float
    bridged: bool = False
    gap_j: float = 0.0

    def __post_init__(self) -> None:
        if self.end_ns < self.start_ns:
            raise ValueError(f"interval ends before it starts: {self.start_ns} > {self.end_ns}")


def overlap(start_ns: int, end_ns: int, t0_ns: int, t1_ns: int) -> tuple[int, int]:
    """(ns inside, length) of the sample ``(start_ns, end_ns]`` in the window ``[t0_ns, t1_ns]``,
    so that its part inside is ``inside / length``; an instant sample (no length) is
    ``(1, 1)`` when ``t0_ns < end_ns <= t1_ns``, else ``(0, 1)``. Every window, bin and
    bound takes a sample's part by this rule."""
    if end_ns <= start_ns:
        return (1 if t0_ns < end_ns <= t1_ns else 0), 1
    return max(min(end_ns, t1_ns) - max(start_ns, t0_ns), 0), end_ns - start_ns


def _overlap_energy(start_ns: int, end_ns: int, energy_j: float, t0_ns: int, t1_ns: int) -> float:
    if end_ns < start_ns:
        raise ValueError(f"sample ends before it starts: {start_ns} > {end_ns}")
    inside, length = overlap(start_ns, end_ns, t0_ns, t1_ns)
    if inside == 0:
        return 0.0
    return energy_j if inside == length else energy_j * inside / length


def window_energy(samples: Iterable[tuple[int, int, float] | Interval], t0_ns: int, t1_ns: int) -> float:
    """Energy in ``[t0_ns, t1_ns]`` of samples ``(start_ns, end_ns, energy_j)``, pro rata by overlap."""
    if t1_ns < t0_ns:
        raise ValueError(f"window ends before it starts: {t0_ns} > {t1_ns}")
    total = 0.0
    for s in samples:
        start, end, energy = (s.start_ns, s.end_ns, s.energy_j) if isinstance(s, Interval) else s
        total += _overlap_energy(start, end, energy, t0_ns, t1_ns)
    return total


@dataclass(frozen=True, slots=True)
class EdgeSample:
    """A sample with its running total in one agent stream (``Sample.cumulative_j``)."""

    start_ns: int
    end_ns: int
    energy_j: float
    cumulative_j: float  #: energy since the stream started, at end_ns
    stream: str  #: agent stream id; cumulative_j restarts with each stream


def find_edges(samples: Sequence[EdgeSample], t_ns: int) -> tuple[EdgeSample | None, EdgeSample | None]:
    """``(last sample ending at or before t, first sample ending after t)`` of samples sorted by end."""
    i = bisect.bisect_right([s.end_ns for s in samples], t_ns)
    return (samples[i - 1] if i > 0 else None), (samples[i] if i < len(samples) else None)


def _cum_candidates(before: EdgeSample | None, after: EdgeSample | None, t_ns: int) -> list[tuple[float, str]]:
    """Cumulative energy at ``t`` as (value, stream) pairs; two when ``t`` lies between streams.

    The cumulative is piecewise linear: inside a sample from ``cumulative_j - energy_j``
    at its start to ``cumulative_j`` at its end; across a gap within one stream from
    the previous end to the next start (energy of samples missing from the store is
    spread over the gap); flat before the first and after the last sample.
    """
    if after is None:
        return [] if before is None else [(before.cumulative_j, before.stream)]
    at_start = after.cumulative_j - after.energy_j
    if after.start_ns <= t_ns:  # t inside `after` (t < after.end_ns by construction)
        frac = (after.end_ns - t_ns) / (after.end_ns - after.start_ns)
        return [(after.cumulative_j - after.energy_j * frac, after.stream)]
    if before is None:
        return [(at_start, after.stream)]
    if before.stream != after.stream:
        return [(before.cumulative_j, before.stream), (at_start, after.stream)]
    gap = after.start_ns - before.end_ns
    lost = at_start - before.cumulative_j
    return [(before.cumulative_j + lost * (t_ns - before.end_ns) / gap, after.stream)]


def cumulative_window_energy(
    edge_before_t0: EdgeSample | None,
    edge_after_t0: EdgeSample | None,
    edge_before_t1: EdgeSample | None,
    edge_after_t1: EdgeSample | None,
    t0_ns: int,
    t1_ns: int,
) -> float | None:
    """Energy in ``[t0_ns, t1_ns]`` from four samples (O(1)), or None across an agent restart.

    ``edge_before_t`` is the last sample with ``end_ns <= t``, ``edge_after_t`` the first
    with ``end_ns > t`` (:func:`find_edges`). The result is the cumulative at ``t1``
    minus the cumulative at ``t0``, interpolated linearly in time inside the sample
    straddling an edge. None when the two edges lie in different streams: the caller
    then sums the samples (:func:`window_energy`). Unlike that sum, this counts the
    energy of samples of the stream missing from the store.
    """
    if t1_ns < t0_ns:
        raise ValueError(f"window ends before it starts: {t0_ns} > {t1_ns}")
    lo = _cum_candidates(edge_before_t0, edge_after_t0, t0_ns)
    hi = _cum_candidates(edge_before_t1, edge_after_t1, t1_ns)
    if not lo or not hi:
        return 0.0  # no sample at all
    for c1, s1 in hi:
        for c0, s0 in lo:
            if s0 == s1:
                return max(c1 - c0, 0.0)
    return None
