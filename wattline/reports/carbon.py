"""Grid carbon intensity that changes over time, applied interval by interval.

``--carbon-intensity`` takes a number (gCO2/kWh, constant) or a CSV file as grid operators
and carbon-data services export it: a header with ``time`` and ``gco2_per_kwh`` (other
columns ignored), one row per period; ``time`` is ISO 8601 (no offset: UTC) or Unix
seconds. Each row's value holds from its time until the next row's; the last row's holds
on. Before the first row there is no value: the first one is used, and the report says so.

The saturated window is cut where the intensity changes; the job's energy in each piece (its
hosts' power over time, :mod:`.timeline`) is weighted by that piece's intensity, which
gives the window's energy-weighted intensity. CO2 figures use it: CO2 of the run = the
sum over pieces of energy x intensity (x PUE). On a host shared with other jobs the
weights are the host's power over time, not the job's share (their shapes differ only
when the other jobs' load changes with the intensity).
"""

from __future__ import annotations

import dataclasses
import math

from wattline.jobs.jobs_view import utc_iso
from wattline.reports import economics
from wattline.reports.intensity import IntensitySeries
from wattline.reports.model import Report
from wattline.reports.timeline import build_timeline
from wattline.stores.reader import Reader


def apply_series(reader: Reader, report: Report, series: IntensitySeries) -> None:
    """Set ``report``'s CO2 figures from ``series``, applied piece by piece over its saturated
    window (see the module doc), and say so in a note."""
    lo, hi = report.saturated_from_ns, report.end_ns
    inside = [t for t in series.times_ns if lo < t < hi]
    edges = [report.job.start_ns, *([lo] if lo > report.job.start_ns else []), *inside, hi]
    timeline = build_timeline(reader, report, edges=edges)
    first = 1 if lo > report.job.start_ns else 0  # the warm-up bin is not weighed
    pieces = [
        (sum(w[i] for w in timeline.power_w.values()) * timeline.width_s(i), edges[i])
        for i in range(first, timeline.bins)
    ]
    energy = math.fsum(j for j, _ in pieces)
    if energy > 0:
        effective = math.fsum(j * series.at(t) for j, t in pieces) / energy
    else:  # no energy to weigh by: the time-weighted mean
        seconds = [(edges[i + 1] - edges[i], edges[i]) for i in range(first, timeline.bins)]
        effective = math.fsum(s * series.at(t) for s, t in seconds) / max(sum(s for s, _ in seconds), 1)
    settings = dataclasses.replace(report.settings, carbon_intensity=effective)
    report.settings = settings
    report.figures = economics.figures(report.figures.window, settings.price_per_instance_hour, effective, settings.pue)
    note = (
        f"carbon intensity from {series.source[:100]}: applied interval by interval ({len(inside) + 1} "
        f"period(s) in the saturated window), energy-weighted {effective:.6g} gCO2/kWh"
    )
    if lo < series.times_ns[0]:
        note += (
            f"; the file starts at {utc_iso(series.times_ns[0])}, after the window began: its first value used before"
        )
    report.notes.append(note)
