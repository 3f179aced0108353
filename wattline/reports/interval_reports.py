"""The reports behind :mod:`.intervals`: one per interval, each a window of the job."""

from __future__ import annotations

import dataclasses

from wattline.reports.build import build_report
from wattline.reports.intervals import Interval, Intervals, split
from wattline.reports.model import Report, ReportSettings
from wattline.reports.spans import spans
from wattline.reports.window_view import OutsideJob, Window
from wattline.stores.reader import Reader


def interval_figures(
    reader: Reader, job_id: str, report: Report, every_s: float, settings: ReportSettings
) -> Intervals:
    """The intervals of ``report``'s span (its window, else the job's whole run), each's load set.
    Each is a report of its own: a service's reads its stored intervals wholly inside it
    (``settings.from_stored``), so rows that start on their edges are made of whole ones."""
    whole = Window(report.job.start_ns, report.end_ns)
    out = []
    for w in split(whole, int(every_s * 1e9)):
        try:
            out.append(_interval(reader, job_id, w, dataclasses.replace(settings, window=w), report.end_ns))
        except OutsideJob:  # no host of the job ran in it (between two hosts' parts)
            continue
    top = max((i.throughput_per_s for i in out), default=0.0)
    return Intervals(every_s, [dataclasses.replace(i, load=i.throughput_per_s / top if top > 0 else None) for i in out])


def _interval(reader: Reader, job_id: str, window: Window, settings: ReportSettings, now_ns: int) -> Interval:
    return interval_of(build_report(reader, job_id, settings, now_ns=now_ns), window)


def interval_of(r: Report, window: Window) -> Interval:
    """The figures of ``r``, a report over ``window`` (its load left unset)."""
    span = spans(r)[1]
    f = span.figures
    rel = span.per_unit_rel
    return Interval(
        window=window,
        seconds=span.seconds,
        units=span.units,
        units_bound=r.units_bound,
        energy_j=f.window.energy_j,
        energy_bound_j=span.bound.total_j,
        j_per_unit=f.j_per_unit,
        j_per_unit_bound=None if f.j_per_unit is None or rel is None else abs(f.j_per_unit) * rel,
        throughput_per_s=f.throughput_per_s or 0.0,
        estimate_fraction=span.estimate,
        latency=r.latencies,
    )
