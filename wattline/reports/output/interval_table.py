"""A report's intervals as text (``wattline report SVC --every 5m``): energy per unit against load,
and the energy per unit at saturation."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from wattline.jobs.jobs_view import utc_iso
from wattline.reports.intervals import SATURATED_LOAD, Intervals
from wattline.reports.output import quantities as q
from wattline.reports.output.labels import tagged
from wattline.reports.output.latency_table import interval_latency


def _rel(value: float | None, bound: float | None) -> float | None:
    return None if value is None or bound is None or value == 0 else bound / abs(value)


def print_intervals(intervals: Intervals, unit: str, console: Console) -> None:
    """One row per interval, then the saturated intervals' energy per unit together."""
    one = unit.rstrip("s") or "unit"
    first = utc_iso(intervals.rows[0].window.from_ns) if intervals.rows else ""
    t = Table(title=f"Intervals of {q.duration(intervals.every_s)} from {first[:10]} (UTC)")
    latency = any(i.latency for i in intervals.rows)
    for col in ("from", "s", unit, "/s", "load", "energy", f"per {one}", *(["latency p50 / p99"] if latency else [])):
        t.add_column(col, justify="left" if col == "from" else "right")
    for i in intervals.rows:
        units = q.count(i.units) + (f" ± {q.count(i.units_bound)}" if i.units_bound else "")
        energy = f"{q.si(i.energy_j, 'J')} {q.plus_minus(_rel(i.energy_j, i.energy_bound_j))}"
        per_unit = f"{q.si(i.j_per_unit, 'J')} {q.plus_minus(_rel(i.j_per_unit, i.j_per_unit_bound))}"
        t.add_row(
            utc_iso(i.window.from_ns)[11:23],  # the time of day: the date is in the title
            f"{i.seconds:.3f}",
            escape(units),
            q.count(i.throughput_per_s),
            q.NA if i.load is None else q.fraction(i.load),
            escape(tagged(energy, i.estimate_fraction)),
            escape(tagged(per_unit, i.estimate_fraction)) if i.j_per_unit is not None else q.NA,
            *([escape(interval_latency(i.latency))] if latency else []),
        )
    console.print(t)
    sat = intervals.at_saturation
    if sat is None:
        load = q.fraction(SATURATED_LOAD)
        console.print(f"At saturation: no interval counted {escape(unit)} at {load} of the highest")
        return
    figure = f"{q.si(sat.j_per_unit, 'J')} per {one} {q.plus_minus(_rel(sat.j_per_unit, sat.j_per_unit_bound))}"
    console.print(
        f"At saturation (load >= {q.fraction(SATURATED_LOAD)} of the highest throughput seen, {sat.intervals} "
        f"interval(s)): {escape(tagged(figure, sat.estimate_fraction))}"
    )
