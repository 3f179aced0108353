"""Samples of one series from several agent streams: each instant's energy counted once.

A stream is one sampler's life (an agent process, an embedded ``wattline run``); its
``cumulative_j`` restarts with it. Streams of one series (host, source, component,
device, quality) that cover the same time measured the same energy; streams that
follow each other (a restart) measured different energy. :func:`merge_streams` turns
the samples of one series into intervals that never overlap:

* each stream covers the union of its samples' intervals ``(start_ns, end_ns]`` and of the
  stretches between two of its samples that the store lacks (samples lost, or never
  written): such a stretch is bridged by the stream's running total, ``cumulative_j`` (the
  later sample's total at its start minus the earlier one's), an interval of its own
  flagged ``bridged``, as the counters at a window's edges read it
  (:func:`~wattline.accounting.window_energy.cumulative_window_energy`); samples
  without a running total bridge nothing;
* where several streams cover a time, the stream that started first (earliest sample
  start; ties by stream id) counts, and the others' samples are clipped to the time no
  earlier-starting stream covers, pro rata (uniform power inside a sample, as in
  :mod:`.attribution`); a zero-length sample counts when no earlier-starting stream
  covers its instant;
* where one stream covers a time, its samples count as they are, so streams that follow
  each other add up.

The result also says how the streams' spans (first start to last end) lie: streams whose
spans overlap another's were live at once (two agents under one host id, two embedded
runs at once); a span that begins after every earlier one ended is a restart, and the time
from that end to its beginning was sampled by no stream: not measured.

Pure arithmetic: no I/O, no clock.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from wattline.accounting.window_energy import Interval

__all__ = ["StreamMerge", "StreamSample", "merge_streams"]


@dataclass(frozen=True, slots=True)
class StreamSample:
    """One sample of a series with the stream that produced it."""

    start_ns: int
    end_ns: int
    energy_j: float
    stream: str
    cumulative_j: float | None = None  #: the stream's running total at end_ns, if known


@dataclass(frozen=True, slots=True)
class StreamMerge:
    """Result of :func:`merge_streams`."""

    intervals: tuple[Interval, ...]  #: never overlapping, ordered by end
    streams: int  #: streams with samples
    overlapping: int  #: streams whose span overlaps another stream's span
    restarts: int  #: times a stream began after every earlier stream had ended
    #: Time (ns) between the streams' spans that no stream covered: before each restart,
    #: from the end of every earlier stream to the next one's first sample.
    unmeasured_ns: int = 0

    @property
    def overlapped(self) -> bool:
        return self.overlapping > 0


class _Covered:
    """A union of intervals ``(a, b]`` as sorted, disjoint, non-touching lists."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def holes(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``(start, end]`` not covered (``start < end``)."""
        out: list[tuple[int, int]] = []
        at = start
        i = bisect.bisect_right(self.ends, start)  # first covered interval ending after start
        while i < len(self.starts) and self.starts[i] < end:
            if self.starts[i] > at:
                out.append((at, self.starts[i]))
            at = max(at, self.ends[i])
            i += 1
        if at < end:
            out.append((at, end))
        return out

    def covers(self, t: int) -> bool:
        """Whether the instant ``t`` lies in some ``(a, b]``."""
        i = bisect.bisect_left(self.ends, t)
        return i < len(self.starts) and self.starts[i] < t

    def add(self, intervals: Iterable[tuple[int, int]]) -> None:
        """Add intervals (``a < b``), merging those that overlap or touch."""
        merged: list[tuple[int, int]] = []
        for a, b in sorted([*zip(self.starts, self.ends, strict=True), *intervals]):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        self.starts = [a for a, _ in merged]
        self.ends = [b for _, b in merged]


def _clip(sample: Interval, covered: _Covered) -> list[Interval]:
    """The parts of ``sample`` that ``covered`` leaves, with their pro-rata energy."""
    start, end, energy = sample.start_ns, sample.end_ns, sample.energy_j
    if start == end:
        return [] if covered.covers(end) else [sample]
    holes = covered.holes(start, end)
    if holes == [(start, end)]:
        return [sample]
    return [Interval(a, b, energy * (b - a) / (end - start), sample.bridged) for a, b in holes]


def _bridged(samples: list[StreamSample]) -> list[Interval]:
    """One stream's samples (sorted by end) as intervals, with the stretches between two of them
    that the store lacks bridged by the running total (its energy never below 0)."""
    out: list[Interval] = []
    prev: StreamSample | None = None
    for s in samples:
        before = None if prev is None or s.start_ns <= prev.end_ns else prev.cumulative_j
        if before is not None and s.cumulative_j is not None and prev is not None:
            lost = s.cumulative_j - s.energy_j - before
            out.append(Interval(prev.end_ns, s.start_ns, max(lost, 0.0), bridged=True))
        out.append(Interval(s.start_ns, s.end_ns, s.energy_j))
        prev = s
    return out


def _spans(by_stream: dict[str, list[StreamSample]]) -> tuple[int, int, int]:
    """(streams whose span overlaps another's, restarts, ns between spans) of the streams' spans."""
    spans = sorted((min(s.start_ns for s in v), max(s.end_ns for s in v)) for v in by_stream.values())
    overlapping = restarts = unmeasured = 0
    group_end, group_size = spans[0][1], 1
    for a, b in spans[1:]:
        if a < group_end:
            group_size += 1
        else:
            overlapping += group_size if group_size > 1 else 0
            restarts += 1
            unmeasured += a - group_end
            group_size = 1
        group_end = max(group_end, b)
    overlapping += group_size if group_size > 1 else 0
    return overlapping, restarts, unmeasured


def merge_streams(samples: Iterable[StreamSample]) -> StreamMerge:
    """Intervals of one series that count each instant once (see the module doc)."""
    by_stream: dict[str, list[StreamSample]] = defaultdict(list)
    for s in samples:
        if s.end_ns < s.start_ns:
            raise ValueError(f"sample ends before it starts: {s.start_ns} > {s.end_ns}")
        by_stream[s.stream].append(s)
    if not by_stream:
        return StreamMerge((), 0, 0, 0)
    if len(by_stream) == 1:
        (only,) = by_stream.values()
        return StreamMerge(tuple(_bridged(sorted(only, key=_end))), 1, 0, 0)
    order = sorted(by_stream, key=lambda k: (min(s.start_ns for s in by_stream[k]), k))
    covered = _Covered()
    out: list[Interval] = []
    for name in order:
        mine = _bridged(sorted(by_stream[name], key=_end))
        for iv in mine:
            out += _clip(iv, covered)
        covered.add((iv.start_ns, iv.end_ns) for iv in mine if iv.end_ns > iv.start_ns)
    overlapping, restarts, unmeasured = _spans(by_stream)
    return StreamMerge(tuple(sorted(out, key=_iv_end)), len(by_stream), overlapping, restarts, unmeasured)


def _end(s: StreamSample) -> tuple[int, int]:
    return (s.end_ns, s.start_ns)


def _iv_end(iv: Interval) -> tuple[int, int]:
    return (iv.end_ns, iv.start_ns)
