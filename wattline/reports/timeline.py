"""A job's power and throughput over time, for plots, the HTML page and the CSV export.

The job's span ``[start, end)`` is cut into equal bins (about one per sample, at most
``max_bins``). Each series' samples on each host are merged across agent streams as the
report merges them (:func:`wattline.accounting.streams.merge_streams`: an instant counted once), clipped to
the host's window, and their energy spread over the bins pro rata by overlap; a bin's
power is its energy over its width. Sub-domains left out of the report's totals
(``cpu_core``, ``cpu_uncore``, ``psys``) are left out here too, so on a host the job had
to itself the timeline's energy equals the report's. On a host shared with other jobs
the timeline shows the host's power, not the job's share (the report's notes say so).

Units/s come from the job's unit intervals, spread over the same bins.
"""

from __future__ import annotations

import bisect
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from wattline.accounting.streams import StreamSample, merge_streams
from wattline.accounting.window_energy import overlap
from wattline.jobs.jobs_view import JobView, view_at
from wattline.reports.channels import EXCLUDED_COMPONENTS
from wattline.reports.model import Report
from wattline.stores.reader import Reader, StoredSample, UnitCuts

#: Most bins a timeline has (a plot is some hundred pixels wide).
MAX_BINS = 400

#: (host, source, component, device, quality), as stored.
Series = tuple[str, str, str, str, str]


@dataclass
class Timeline:
    """Power (W) per bin by (host, component, quality), and units/s per bin."""

    start_ns: int
    edges_ns: list[int]  #: bin edges, len = bins + 1
    power_w: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    units_per_s: list[float] | None = None  #: None when the job counted no units
    series: list[Series] = field(default_factory=list)  #: every series seen (provenance)

    @property
    def bins(self) -> int:
        return len(self.edges_ns) - 1

    def width_s(self, i: int) -> float:
        return (self.edges_ns[i + 1] - self.edges_ns[i]) / 1e9

    def seconds(self) -> list[float]:
        """Bin edges as seconds since the job's start."""
        return [(t - self.start_ns) / 1e9 for t in self.edges_ns]

    def energy_j(self, key: tuple[str, str, str]) -> float:
        """Energy of one (host, component, quality) over the timeline, J."""
        return math.fsum(w * self.width_s(i) for i, w in enumerate(self.power_w.get(key, [])))

    def total_w(self, host: str | None = None) -> list[float]:
        """Total power per bin (of ``host``, or of every host)."""
        out = [0.0] * self.bins
        for (h, _c, _q), watts in self.power_w.items():
            if host is None or h == host:
                out = [a + b for a, b in zip(out, watts, strict=True)]
        return out


def build_timeline(
    reader: Reader, report: Report, max_bins: int = MAX_BINS, edges: list[int] | None = None
) -> Timeline:
    """The timeline of ``report``'s job, read from the same store; ``edges`` (increasing,
    ns) replaces the equal bins, e.g. the times a carbon intensity changes."""
    job = report.job
    start, end = job.start_ns, max(report.end_ns, job.start_ns + 1)
    per_host: dict[str, tuple[int, int, list[StoredSample]]] = {}
    neighbours: dict[Series, list[StoredSample]] = defaultdict(list)
    for host in sorted(job.hosts):
        open_ns, close = host_span(report, host)
        per_host[host] = (open_ns, close, reader.samples(host, open_ns, close))
        # each series' samples just outside: a stretch one stream lacks across an edge is bridged
        (before, _), (_, after) = reader.around(host, (open_ns, close))
        for s in [*before, *(s for s in after if s.start_ns >= close)]:
            neighbours[s.series].append(s)
    if edges is None:
        lengths = [s.end_ns - s.start_ns for _o, _c, ss in per_host.values() for s in ss if s.end_ns > s.start_ns]
        typical = statistics.median(lengths) if lengths else (end - start) / max_bins
        n = max(1, min(max_bins, round((end - start) / max(typical, 1))))
        edges = [start + (end - start) * i // n for i in range(n + 1)]
    n = len(edges) - 1
    timeline = Timeline(start, edges)
    energy: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0] * n)
    for host, (open_ns, close_ns, samples) in per_host.items():
        grouped: dict[Series, list[StoredSample]] = defaultdict(list)
        for s in samples:
            grouped[s.series].append(s)
        for key, ss in sorted(grouped.items()):
            timeline.series.append(key)
            if key[2] in EXCLUDED_COMPONENTS:
                continue
            read = [*ss, *neighbours.get(key, [])]
            merged = merge_streams(
                StreamSample(s.start_ns, s.end_ns, s.energy_j, s.stream, s.cumulative_j) for s in read
            )
            spread(
                ((iv.start_ns, iv.end_ns, iv.energy_j) for iv in merged.intervals),
                open_ns,
                close_ns,
                edges,
                energy[(host, key[2], key[4])],
            )
    timeline.power_w = {k: [_per_s(j, timeline.width_s(i)) for i, j in enumerate(v)] for k, v in sorted(energy.items())}
    if job.unit_intervals:
        units = [0.0] * n
        spread(_units_at(reader, job, edges).unit_intervals, start, end, edges, units)
        timeline.units_per_s = [_per_s(u, timeline.width_s(i)) for i, u in enumerate(units)]
    return timeline


def _units_at(reader: Reader, job: JobView, edges: list[int]) -> JobView:
    """``job``, its UNITS events read again for ``edges`` where the report read them for other cuts."""
    if job.unit_cuts is None or set(edges) <= set(job.unit_cuts.instants):
        return job
    grid = UnitCuts(edges[0], edges[-1], len(edges) - 1) if edges[-1] > edges[0] else UnitCuts(0, 0)
    return view_at(reader, job.job_id, grid if grid.instants == edges else UnitCuts(0, 0, 0, tuple(edges)))


def _per_s(amount: float, seconds: float) -> float:
    return amount / seconds if seconds > 0 else 0.0


def host_span(report: Report, host: str) -> tuple[int, int]:
    """The host's window in ``report``: open to close, to its last heard time once abandoned
    (as the report ends it), else to the report's end."""
    window = report.job.hosts[host]
    close = window.end_ns(max(time.time_ns(), report.end_ns), report.end_ns)
    return window.open_ns, min(max(close, window.open_ns), report.end_ns)


def spread(
    intervals: Iterable[tuple[int, int, float]], lo_ns: int, hi_ns: int, edges: list[int], out: list[float]
) -> None:
    """Add each interval's amount, clipped to ``[lo_ns, hi_ns]``, to the bins of ``edges``
    it overlaps, pro rata by overlap (an instant interval goes to the bin holding it)."""
    for a, b, amount in intervals:
        ca, cb = max(a, lo_ns, edges[0]), min(b, hi_ns, edges[-1])
        i = max(bisect.bisect_left(edges, ca) - 1, 0)  # the first bin it can reach
        while i < len(out) and edges[i] <= cb:
            inside, length = overlap(a, b, max(lo_ns, edges[i]), min(hi_ns, edges[i + 1]))
            if inside:
                out[i] += amount * inside / length
            i += 1
