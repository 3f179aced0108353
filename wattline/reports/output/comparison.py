"""Two jobs compared, as JSON (a stable, documented shape) and as the study-style table:
each change computed from the figures as shown, with its bound where it derives from energy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from wattline.accounting.uncertainty import Side, change_bound
from wattline.jobs.jobs_view import utc_iso
from wattline.reports import economics
from wattline.reports.model import Report
from wattline.reports.output import quantities as q
from wattline.reports.output.labels import span_note, tagged
from wattline.reports.report_json import estimate_json
from wattline.reports.windows import estimate_fraction

#: Version of the JSON shape below; bumped on any incompatible change.
COMPARE_SCHEMA = "wattline.compare/1"


@dataclass(frozen=True)
class Kind:
    """How a comparison figure is shown: its text, and the number that text says (percent
    changes are computed from it)."""

    text: Callable[[float | None], str]
    shown: Callable[[float], float]
    energy: bool = False  #: derived from energy: carries the estimate label


def _si_kind(unit: str) -> Kind:
    return Kind(lambda x: q.si(x, unit), q.shown_si, energy=unit == "J" or unit == "W")


def _count_kind(unit: str = "") -> Kind:
    return Kind(lambda x: q.count(x, unit), q.shown_count)


KWH = Kind(q.kwh, q.shown_si, energy=True)
CO2 = Kind(q.co2, q.shown_si, energy=True)
USD = Kind(q.usd, q.shown_usd)


def change_percent(c: economics.Change, kind: Kind) -> float | None:
    """B's change relative to A, from the values as shown."""
    if c.a is None or c.b is None:
        return None
    return q.percent_shown(kind.shown(c.a), kind.shown(c.b))


def _compare_rows(a: Report, b: Report, cmp: economics.Comparison) -> list[tuple[str, economics.Change, Kind]]:
    """(figure, change, kind) of every comparison figure, in the table's order."""
    ua, ub = a.job.unit_name, b.job.unit_name
    unit = ua if ua == ub else "units"
    one = unit.rstrip("s") or "unit"
    rows = [
        (
            "throughput per instance",
            cmp.throughput_per_instance_hour,
            Kind(lambda x: q.rate(x, f"{unit}/h"), q.shown_rate),
        ),
        (f"energy per {one}", cmp.j_per_unit, _si_kind("J")),
        (f"energy per million {unit}", cmp.kwh_per_million_units, KWH),
        (f"cost per million {unit}", cmp.cost_per_million_units, USD),
        (f"CO2 per million {unit}", cmp.co2_per_million_units_g, CO2),
    ]
    if cmp.sla is not None:
        s = cmp.sla
        rows += [
            (f"instances for {q.count(s.sla_units_per_hour)} {unit}/h", s.instances, _count_kind()),
            ("fleet power at the SLA", s.fleet_power_w, _si_kind("W")),
            (f"energy per million {unit} at the SLA", s.energy_kwh_per_million, KWH),
            (f"cost per million {unit} at the SLA", s.cost_per_million, USD),
            (f"CO2 per million {unit} at the SLA", s.co2_g_per_million, CO2),
        ]
    if cmp.work is not None:
        w = cmp.work
        rows += [
            (f"time for {q.count(w.work_units)} {unit}", w.hours, _count_kind("h")),
            ("energy for that work", w.energy_j, _si_kind("J")),
            ("cost for that work", w.cost, USD),
            ("CO2 for that work", w.co2_g, CO2),
        ]
    return rows


def _side(r: Report) -> Side | None:
    """A job's relative bound in a comparison (of the energy its figures use)."""
    return Side.of(r.saturated_window.bound, r.figures.window.energy_j)


def change_significance(a: Report, b: Report, c: economics.Change) -> tuple[float | None, bool | None]:
    """(half-width of B's percent change, in percentage points; whether the change is within
    it) of a figure proportional to energy; None where it cannot be bounded."""
    bound = change_bound(c.ratio, _side(a), _side(b))
    pct = c.pct
    return bound, None if bound is None or pct is None else abs(pct) <= bound


def comparison_json(a: Report, b: Report, cmp: economics.Comparison) -> dict[str, Any]:
    """The ``compare --json`` shape: both jobs' figures and each change (b relative to a);
    a figure derived from energy says whether either side is an estimate, the change's bound
    (``change_pct_bound``, percentage points) and whether it is ``within_uncertainty``."""
    estimate = estimate_fraction(a.saturated_window) > 0 or estimate_fraction(b.saturated_window) > 0

    def change(c: economics.Change, energy: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"a": c.a, "b": c.b, "ratio": c.ratio, "change_pct": c.pct}
        if energy:
            bound, within = change_significance(a, b, c)
            out |= {"estimate": estimate, "change_pct_bound": bound, "within_uncertainty": within}
        return out

    def side(r: Report) -> dict[str, Any]:
        return {
            "job": r.job.job_id,
            "name": r.job.name,
            "unit": r.job.unit_name,
            "saturated": r.saturated,
            "window": None if r.settings.window is None else {"from": utc_iso(r.job.start_ns), "to": utc_iso(r.end_ns)},
            **estimate_json(r.saturated_window),
            "energy_bound_rel": r.saturated_window.bound.relative(r.figures.window.energy_j),
        }

    out: dict[str, Any] = {
        "schema": COMPARE_SCHEMA,
        "a": side(a),
        "b": side(b),
        "throughput_ratio": cmp.throughput_ratio,
        "throughput_per_instance_hour": change(cmp.throughput_per_instance_hour),
        "j_per_unit": change(cmp.j_per_unit, True),
        "kwh_per_million_units": change(cmp.kwh_per_million_units, True),
        "cost_per_million_units_usd": change(cmp.cost_per_million_units),
        "co2_g_per_million_units": change(cmp.co2_per_million_units_g, True),
    }
    energy_derived = {"fleet_power_w", "energy_kwh_per_million", "co2_g_per_million", "energy_j", "co2_g"}
    if cmp.sla is not None:
        out["sla"] = {
            k: change(getattr(cmp.sla, k), k in energy_derived)
            for k in (
                "instances",
                "fleet_power_w",
                "cost_per_hour",
                "energy_kwh_per_million",
                "cost_per_million",
                "co2_g_per_million",
            )
        }
    if cmp.work is not None:
        keys = ("instances", "hours", "energy_j", "cost", "co2_g")
        out["work"] = {k: change(getattr(cmp.work, k), k in energy_derived) for k in keys}
    return out


def _significance_text(change: str, bound: float | None, within: bool | None) -> str:
    """ "-12 % ± 3.1 pp", and ", within uncertainty" when the change does not exceed its bound."""
    if change == q.NA:
        return change
    width = q.plus_minus(None if bound is None else bound / 100.0, "pp")
    return f"{change} {width}" + (", within uncertainty" if within else "")


def print_comparison(a: Report, b: Report, cmp: economics.Comparison, console: Console | None = None) -> None:
    """The study-style table: each figure for A and B and B's change relative to A, the
    change computed from the figures as shown; figures from estimated energy say so."""
    console = console or Console()
    t = Table(title=escape(f"A = {a.job.name} ({a.job.job_id})  vs  B = {b.job.name} ({b.job.job_id})"))
    for col in ("figure", "A", "B", "change (B vs A)"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    fraction_a, fraction_b = estimate_fraction(a.saturated_window), estimate_fraction(b.saturated_window)
    t.add_row("throughput ratio (per instance)", "1x", economics.format_ratio(cmp.throughput_ratio), "")
    for name, c, kind in _compare_rows(a, b, cmp):
        text_a, text_b = kind.text(c.a), kind.text(c.b)
        if kind.energy:
            text_a, text_b = tagged(text_a, fraction_a), tagged(text_b, fraction_b)
        change = economics.format_percent(change_percent(c, kind))
        if kind.energy:
            change = _significance_text(change, *change_significance(a, b, c))
        t.add_row(escape(name), escape(text_a), escape(text_b), escape(change))
    console.print(t)
    if a.job.unit_name != b.job.unit_name:
        console.print(
            f"[yellow]A counts {escape(a.job.unit_name)}, B counts {escape(b.job.unit_name)}: "
            "per-unit figures compare different units[/yellow]"
        )
    for r, tag, fraction in ((a, "A", fraction_a), (b, "B", fraction_b)):
        if note := span_note(r, tag):
            console.print(f"[yellow]{escape(note)}[/yellow]")
        if fraction > 0:
            console.print(f"{tag}: {q.fraction(fraction)} of the energy is a MODEL ESTIMATE, not a measurement")
