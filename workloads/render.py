"""Reports and comparisons as JSON (a stable, documented shape) and as rich tables.

Every figure states its unit, with an SI prefix and 4 significant digits
(:mod:`.quantities`); every figure derived from energy that is partly a model estimate
(energy, power, J per unit, kWh, CO2) carries the ESTIMATE label in tables and
``estimate``/``estimate_share`` in JSON, never shown as a plain measurement. Cost is
instance time x price: no estimate enters it. A report shows the measured window beside
the whole run; with ``--idle subtract`` "total" and "above idle" are named as such.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table

from wattline.quality import Quality
from wattline.workloads import economics
from wattline.workloads import quantities as q
from wattline.workloads.jobs_view import utc_iso
from wattline.workloads.report import Report, WindowEnergy, report_coverage
from wattline.workloads.uncertainty import Bound, Side, change_bound

#: Version of the JSON shapes below; bumped on any incompatible change.
REPORT_SCHEMA = "wattline.report/1"
COMPARE_SCHEMA = "wattline.compare/1"


def _iso(ns: int) -> str:
    return utc_iso(ns)


def _window_json(w: WindowEnergy) -> dict[str, Any]:
    return {
        "seconds": w.seconds,
        "energy_j": w.energy_j,
        "dynamic_energy_j": w.dynamic_j,
        "mean_power_w": w.energy_j / w.seconds if w.seconds > 0 else None,
        "by_component": [
            {
                "component": c.component,
                "energy_j": c.energy_j,
                "dynamic_energy_j": c.dynamic_j,
                "mean_power_w": c.energy_j / w.seconds if w.seconds > 0 else None,
                "energy_j_by_quality": dict(sorted(c.by_quality.items())),
                "energy_bound_j": c.bound.total_j,
            }
            for c in sorted(w.components.values(), key=lambda c: c.component)
        ],
        "by_host": [{"host": h, "energy_j": j} for h, j in sorted(w.hosts.items())],
        **_estimate_json(w),
        **_bound_json(w.bound, w.energy_j),
        "mean_power_w_bound": w.bound.total_j / w.seconds if w.seconds > 0 else None,
    }


def _bound_json(bound: Bound, energy_j: float) -> dict[str, Any]:
    """How far ``energy_j`` may be off: half-width (J), relative, and by term (README "Method: uncertainty")."""
    return {
        "energy_bound_j": bound.total_j,
        "energy_bound_rel": bound.relative(energy_j),
        "energy_bound_terms_j": bound.terms(),
    }


#: Figures proportional to the charged energy (units, time, intensity exact): the bound's share of each.
BOUNDED_FIGURES = (
    "j_per_unit",
    "kwh_per_million_units",
    "co2_g_per_run",
    "co2_g_per_million_units",
)


def _figure_bounds_json(figures: dict[str, Any], rel: float | None) -> dict[str, Any]:
    """``<figure>_bound``: the half-width of each figure derived from energy (null when unknown)."""
    return {
        f"{k}_bound": None if figures.get(k) is None or rel is None else abs(figures[k]) * rel for k in BOUNDED_FIGURES
    }


def _estimate_json(*windows: WindowEnergy) -> dict[str, Any]:
    share = estimate_share(*windows)
    return {"estimate": share > 0, "estimate_share": share}


def estimate_share(*windows: WindowEnergy) -> float:
    """Share of the windows' energy that is a model estimate (0 without energy)."""
    total = sum(w.energy_j for w in windows)
    model = sum(w.by_quality().get(Quality.MODEL, 0.0) for w in windows)
    return model / total if total > 0 else 0.0


def estimate_tag(share: float) -> str:
    """The label of figures from energy of which ``share`` is a model estimate: "ESTIMATE"
    (all of it), "partly ESTIMATE (N % model)", or "" (none)."""
    if share <= 0:
        return ""
    if share >= 1 - 1e-9:
        return "ESTIMATE"
    return f"partly ESTIMATE ({q.share(share)} model)"


@dataclass(frozen=True)
class Span:
    """A stretch of the job a report gives figures for: the measured window or the whole run."""

    title: str
    seconds: float
    units: float
    windows: tuple[WindowEnergy, ...]
    figures: economics.Figures  #: from the energy the idle policy charges

    @property
    def energy_j(self) -> float:
        return sum(w.energy_j for w in self.windows)

    @property
    def dynamic_j(self) -> float:
        return sum(w.dynamic_j for w in self.windows)

    @property
    def estimate(self) -> float:
        return estimate_share(*self.windows)

    @property
    def bound(self) -> Bound:
        """How far the energy may be off: the windows' bounds added (worst case)."""
        return sum((w.bound for w in self.windows), Bound())

    @property
    def bound_rel(self) -> float | None:
        """The bound relative to the energy the figures use (total, or above idle)."""
        return self.bound.relative(self.figures.measured.energy_j)


def spans(r: Report) -> tuple[Span, Span]:
    """(measured window, whole run) of a report; the whole run's figures use the same
    definitions (:mod:`.economics`) on warm-up + measured."""
    s = r.settings
    measured = Span("measured window", r.measured.seconds, r.units_measured, (r.measured,), r.figures)
    seconds = (r.end_ns - r.job.start_ns) / 1e9
    windows = (r.warmup, r.measured)
    energy = sum(w.dynamic_j if s.idle == "subtract" else w.energy_j for w in windows)
    whole = economics.Measured(r.job.units_total, max(seconds, 0.0), max(energy, 0.0), r.figures.measured.instances)
    figures = economics.figures(whole, s.price_per_instance_hour, s.carbon_intensity, s.pue)
    return measured, Span("whole run", seconds, r.job.units_total, windows, figures)


def _figures_json(f: economics.Figures) -> dict[str, Any]:
    return {
        "throughput_units_per_s": f.throughput_per_s,
        "throughput_units_per_h": f.throughput_per_hour,
        "throughput_units_per_instance_h": f.throughput_per_instance_hour,
        "j_per_unit": f.j_per_unit,
        "kwh_per_million_units": f.kwh_per_million_units,
        "cost_usd_per_run": f.cost_per_run,
        "cost_usd_per_million_units": f.cost_per_million_units,
        "co2_g_per_run": f.co2_per_run_g,
        "co2_g_per_million_units": f.co2_per_million_units_g,
    }


def _whole_run_json(whole: Span) -> dict[str, Any]:
    out = {
        "seconds": whole.seconds,
        "units": whole.units,
        "energy_j": whole.energy_j,
        "dynamic_energy_j": whole.dynamic_j,
        "mean_power_w": whole.energy_j / whole.seconds if whole.seconds > 0 else None,
        **_figures_json(whole.figures),
        **_estimate_json(*whole.windows),
        **_bound_json(whole.bound, whole.energy_j),
        "mean_power_w_bound": whole.bound.total_j / whole.seconds if whole.seconds > 0 else None,
    }
    return out | _figure_bounds_json(out, whole.bound_rel)


def report_json(r: Report) -> dict[str, Any]:
    """The ``--json`` / ``--report-json`` shape (see README "Report JSON")."""
    job = r.job
    return {
        "schema": REPORT_SCHEMA,
        "energy_data": r.energy_data,
        "job": {
            "id": job.job_id,
            "name": job.name,
            "kind": job.kind,
            "unit": job.unit_name,
            "labels": job.labels,
            "hosts": sorted(job.hosts),
            "devices": {h: w.devices for h, w in sorted(job.hosts.items())},
            "start": _iso(job.start_ns),
            "end": _iso(r.end_ns),
            "closed": job.closed,
            "status": r.state,  #: closed | running | abandoned
            "last_heard": None if job.closed else _iso(job.last_heard_ns()),
            "exit_code": job.exit_code,
            "status_text": status_text(r.state, job.exit_code, None if job.closed else job.last_heard_ns()),
        },
        "complete": r.complete,
        "samples_up_to": {host: _iso(ns) for host, ns in sorted(r.incomplete.items())},
        "samples_from": {host: _iso(ns) for host, ns in sorted(r.late_start.items())},
        "saturation": {
            "saturated": r.saturated,
            "at": _iso(r.saturation.at_ns) if r.saturation.at_ns is not None else None,
            "method": r.saturation.method,
            "reason": r.saturation.reason,
            "plateau_units_per_s": r.saturation.plateau_rate,
        },
        "durations_s": {
            "total": (r.end_ns - job.start_ns) / 1e9,
            "warmup": r.warmup.seconds,
            "measured": r.measured.seconds,
        },
        "units": {"total": job.units_total, "warmup": r.units_warmup, "measured": r.units_measured},
        "measured": _measured_json(r),
        "warmup": _window_json(r.warmup),
        "whole_run": _whole_run_json(spans(r)[1]),
        "figures_from": "dynamic_energy_j" if r.settings.idle == "subtract" else "energy_j",
        "policy": {
            "idle": r.settings.idle,
            "share_rule": r.settings.share_rule,
            "price_usd_per_instance_hour": r.settings.price_per_instance_hour,
            "carbon_intensity_g_per_kwh": r.settings.carbon_intensity,
            "pue": r.settings.pue,
            "idle_baseline_busy": r.idle_busy,
        },
        "device_shares": [asdict(d) for d in r.device_shares],
        "notes": r.notes,
    }


def _measured_json(r: Report) -> dict[str, Any]:
    out = {**_window_json(r.measured), **_figures_json(r.figures)}
    return out | _figure_bounds_json(out, spans(r)[0].bound_rel) | {"coverage": report_coverage(r)}


def status_text(state: str, exit_code: int | None, last_heard_ns: int | None) -> str:
    """How a job ended, for people: "ok (exit 0)", "failed (exit 143, SIGTERM)", "running",
    "abandoned (no close; last heard at T)"."""
    if state == "running":
        return "running"
    if state == "abandoned":
        return f"abandoned (no close; last heard at {utc_iso(last_heard_ns or 0)})"
    if not exit_code:
        return "ok (exit 0)"
    number = -exit_code if exit_code < 0 else exit_code - 128
    try:
        name = f", {signal.Signals(number).name}" if number > 0 else ""
    except ValueError:
        name = ""
    return f"failed (exit {exit_code}{name})"


def _quality_label(by_quality: dict[str, float]) -> str:
    total = sum(by_quality.values())
    model = by_quality.get("model", 0.0)
    if total <= 0:
        return ""
    if model >= total:
        return "ESTIMATE (model)"
    kinds = "+".join(q for q in ("counter", "integrated") if by_quality.get(q))
    return kinds if model == 0 else f"{kinds} + {estimate_tag(model / total)}"


def _qualities(*windows: WindowEnergy) -> dict[str, float]:
    out: dict[str, float] = {}
    for w in windows:
        for quality, j in w.by_quality().items():
            out[quality.value] = out.get(quality.value, 0.0) + j
    return out


def _tagged(text: str, share: float) -> str:
    tag = estimate_tag(share)
    return f"{text} {tag}" if tag and text != q.NA else text


def _bounded(text: str, rel: float | None) -> str:
    """A figure with its relative bound: "171.0 J ± 2.3 %"."""
    return f"{text} {q.plus_minus(rel)}" if text != q.NA else text


def _energy_bounded(energy_j: float, bound: Bound) -> str:
    """Energy with its bound: relative ("171.0 J ± 2.3 %"), in joules where none was counted ("0 J ± 20 J")."""
    rel = bound.relative(energy_j)
    if rel is None:
        return f"{q.si(energy_j, 'J')} ± {q.si(bound.total_j, 'J')}"
    return _bounded(q.si(energy_j, "J"), rel)


def _span_figure(text: str, s: Span) -> str:
    """A span's figure derived from its charged energy: bound, then the estimate label."""
    return _tagged(_bounded(text, s.bound_rel), s.estimate)


#: (figure name, its text in a span) for the report's main table.
Row = tuple[str, Callable[[Span], str]]


def _report_rows(r: Report) -> list[Row]:
    unit = r.job.unit_name
    one = unit.rstrip("s") or "unit"
    above = r.settings.idle == "subtract"
    tag = " above idle" if above else ""
    rows: list[Row] = [
        ("duration", lambda s: q.duration(s.seconds)),
        (unit, lambda s: q.count(s.units)),
        (
            "throughput",
            lambda s: (
                f"{q.count(s.figures.throughput_per_s, unit + '/s')} "
                f"({q.count(s.figures.throughput_per_hour, unit + '/h')})"
            ),
        ),
        (
            "energy (total)" if above else "energy",
            lambda s: (f"{_energy_bounded(s.energy_j, s.bound)}  {_quality_label(_qualities(*s.windows))}").rstrip(),
        ),
    ]
    if above:
        rows.append(("energy above idle", lambda s: _span_figure(q.si(s.dynamic_j, "J"), s)))
    rows += [
        (f"mean power{tag}", lambda s: _span_figure(q.si(s.figures.mean_power_w, "W"), s)),
        (f"energy per {one}{tag}", lambda s: _span_figure(q.si(s.figures.j_per_unit, "J"), s)),
        (f"per million {unit}{tag}", lambda s: _span_figure(q.kwh(s.figures.kwh_per_million_units), s)),
    ]
    if r.settings.price_per_instance_hour is not None:
        rows += [
            ("cost per run (instance time x price)", lambda s: q.usd(s.figures.cost_per_run)),
            (f"cost per million {unit}", lambda s: q.usd(s.figures.cost_per_million_units)),
        ]
    if r.settings.carbon_intensity is not None:
        rows += [
            (f"CO2 per run{tag}", lambda s: _span_figure(q.co2(s.figures.co2_per_run_g), s)),
            (f"CO2 per million {unit}{tag}", lambda s: _span_figure(q.co2(s.figures.co2_per_million_units_g), s)),
        ]
    if not r.energy_data:  # no sample at all: no energy figure, not "0 J"
        rows = [(name, _no_samples) if name.startswith(ENERGY_ROWS) else (name, text) for name, text in rows]
    return rows


#: Rows of the report's table derived from energy (shown as NO_SAMPLES when there is none).
ENERGY_ROWS = ("energy", "mean power", "per million", "CO2")
NO_SAMPLES = "no samples"


def _no_samples(_span: Span) -> str:
    return NO_SAMPLES


#: A table as text: (title, column heads, rows of cells).
TextTable = tuple[str, list[str], list[list[str]]]


def report_table(r: Report) -> TextTable:
    """The report's main table: each figure in the measured window beside the whole run
    (only the whole run when the job never saturated)."""
    measured, whole = spans(r)
    shown = (measured, whole) if r.saturated else (whole,)
    title = "Measured window and whole run" if r.saturated else "Whole run (not saturated)"
    return (
        title,
        ["figure", *(s.title for s in shown)],
        [[name, *(text(s) for s in shown)] for name, text in _report_rows(r)],
    )


def component_table(r: Report) -> TextTable:
    """Energy and mean power by component (measured window), warm-up energy, how obtained."""
    rows = []
    for name in sorted(set(r.measured.components) | set(r.warmup.components)):
        m = r.measured.components.get(name)
        w = r.warmup.components.get(name)
        watts = m.energy_j / r.measured.seconds if m and r.measured.seconds > 0 else None
        rows.append(
            [
                name,
                _energy_bounded(m.energy_j, m.bound) if m else q.si(0.0, "J"),
                q.si(watts, "W"),
                q.si(w.energy_j if w else 0.0, "J"),
                _quality_label(m.by_quality if m else {}),
            ]
        )
    title = "Energy by component" + (" (measured window)" if r.saturated else "")
    return title, ["component", "energy", "mean power", "warm-up", "how obtained"], rows


def print_report(r: Report, console: Console | None = None) -> None:
    """Readable tables of one report: the measured window beside the whole run."""
    console = console or Console()
    job = r.job
    console.print(
        f"[bold]Job {escape(job.name)}[/bold] ({escape(job.job_id)}, {escape(job.kind)}) "
        f"on {len(job.hosts)} host(s): {escape(', '.join(sorted(job.hosts)))}"
    )
    console.print(f"Status: {status_text(r.state, job.exit_code, None if job.closed else job.last_heard_ns())}")
    sat = r.saturation
    whole = spans(r)[1]
    if r.saturated:
        console.print(
            f"Saturated at {_iso(sat.at_ns or 0)} ({sat.method}); the measured window leaves out "
            f"{q.duration(r.warmup.seconds)} of warm-up, the whole run includes it"
        )
    else:
        console.print(f"[yellow]NOT SATURATED[/yellow] ({escape(sat.reason)}): whole-run figures")
    share = whole.estimate
    if share > 0:
        console.print(
            f"[bold yellow]ESTIMATE[/bold yellow]: {q.share(share)} of this job's energy is a power-model "
            "estimate, not a measurement; every figure marked ESTIMATE derives from it"
        )
    if r.settings.idle == "subtract":
        console.print(
            "Idle policy subtract: figures marked 'above idle' charge only the energy above the idle baseline "
            f"(the {r.settings.idle_lookback_s:.0f} s before the job); 'total' is all of it"
        )
    for title, head, rows in (report_table(r), component_table(r)):
        t = Table(title=title)
        for n, col in enumerate(head):
            t.add_column(col, justify="left" if n == 0 or col == "how obtained" else "right")
        for row in rows:
            t.add_row(*(escape(cell) for cell in row))
        console.print(t)
    cov = report_coverage(r)
    shares = ", ".join(f"{quality} {q.share(v)}" for quality, v in cov["shares"].items())
    console.print(
        f"Coverage: {shares or 'no energy data'}"
        + (f"; not measured: {', '.join(cov['missing'])}" if cov["missing"] else "")
    )
    for note in r.notes:
        if note.startswith("warning:"):
            console.print(f"[yellow]{escape(note)}[/yellow]")
        else:
            console.print(f"note: {escape(note)}")


JOB_COLUMNS = ("id", "name", "status", "start (UTC)", "duration", "hosts", "units")
ENERGY_COLUMNS = ("energy (whole run)", "J/unit (measured)")


def _job_cells(row: dict[str, Any], energy: bool, errors: bool) -> list[str]:
    """One ``wattline jobs`` row as text, in the order of JOB_COLUMNS (+ ENERGY_COLUMNS, error)."""
    status = status_text(row["status"], row["exit_code"], row["last_heard_ns"])
    if row.get("saturated") is False:
        status += ", not saturated"
    cells = [
        row["id"],
        row["name"],
        status,
        _iso(row["start_ns"])[:19].replace("T", " "),
        q.duration(row["duration_s"]),
        str(len(row["hosts"])),
        q.count(row["units"], row["unit"]),
    ]
    if energy and row.get("energy_data") is False:
        cells += [NO_SAMPLES, NO_SAMPLES]
    elif energy:
        share = row.get("estimate_share") or 0.0
        cells += [
            _tagged(q.si(row.get("total_energy_j"), "J"), share),
            _tagged(q.si(row.get("j_per_unit"), "J"), share),
        ]
    if errors:
        cells.append(row.get("error", ""))
    return cells


#: Columns of ``wattline jobs`` whose text may wrap; every other cell is shown whole.
WRAPPED = frozenset({"name", "status", "start (UTC)", "error"})
#: Width a table of N columns adds to its cells (padding, borders).
TABLE_OVERHEAD = (3, 2)  # per column, once


def _job_widths(columns: tuple[str, ...], cells: list[list[str]], width: int) -> list[int] | None:
    """Column widths that fit ``width`` with every cell whole, except those of WRAPPED columns,
    which wrap at spaces (never inside a word) and get what room is left; None when that
    does not fit (headers wrap too)."""

    def longest_word(texts: list[str]) -> int:
        return max((len(w) for t in texts for w in t.split()), default=1)

    natural, least = [], []
    for i, col in enumerate(columns):
        texts = [r[i] for r in cells]
        whole = max([len(t) for t in texts] + [longest_word([col])])
        natural.append(whole)
        least.append(max(longest_word(texts), longest_word([col])) if col in WRAPPED else whole)
    room = width - TABLE_OVERHEAD[0] * len(columns) - TABLE_OVERHEAD[1] - sum(least)
    if room < 0:
        return None
    widths = list(least)
    for col in sorted(WRAPPED & set(columns), key=("start (UTC)", "name", "status", "error").index):
        i = columns.index(col)
        if col in WRAPPED:
            extra = min(natural[i] - least[i], room)
            widths[i] += extra
            room -= extra
    return widths


def print_jobs(rows: list[dict[str, Any]], console: Console, energy: bool) -> None:
    """The ``wattline jobs`` table, with whole ids at any width: where the table does not fit
    the terminal, each job is a block instead (its id on a line of its own, the other
    columns wrapped below it). Only the figures computed are shown."""
    errors = any("error" in row for row in rows)
    columns = JOB_COLUMNS + (ENERGY_COLUMNS if energy else ()) + (("error",) if errors else ())
    cells = [_job_cells(row, energy, errors) for row in rows]
    widths = _job_widths(columns, cells, console.width)
    if widths is not None:
        table = Table(title="wattline jobs", box=box.SIMPLE_HEAD, padding=(0, 1))
        for col, width in zip(columns, widths, strict=True):
            right = col in ("duration", "hosts", "units", *ENERGY_COLUMNS)
            table.add_column(col, justify="right" if right else "left", width=width, no_wrap=col == "id")
        for row_cells in cells:
            table.add_row(*(escape(c) for c in row_cells))
        console.print(table)
        return
    console.print("wattline jobs", style="bold")
    for row_cells in cells:
        console.print(escape(row_cells[0]), soft_wrap=True, style="bold")
        details = "; ".join(f"{name}: {c}" for name, c in zip(columns[1:], row_cells[1:], strict=True) if c)
        console.print(Padding(escape(details), (0, 0, 0, 2)))


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
    return Side.of(r.measured.bound, r.figures.measured.energy_j)


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
    estimate = estimate_share(a.measured) > 0 or estimate_share(b.measured) > 0

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
            **_estimate_json(r.measured),
            "energy_bound_rel": r.measured.bound.relative(r.figures.measured.energy_j),
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
    share_a, share_b = estimate_share(a.measured), estimate_share(b.measured)
    t.add_row("throughput ratio (per instance)", "1x", economics.format_ratio(cmp.throughput_ratio), "")
    for name, c, kind in _compare_rows(a, b, cmp):
        text_a, text_b = kind.text(c.a), kind.text(c.b)
        if kind.energy:
            text_a, text_b = _tagged(text_a, share_a), _tagged(text_b, share_b)
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
    for r, tag, share in ((a, "A", share_a), (b, "B", share_b)):
        if not r.saturated:
            console.print(f"[yellow]{tag} never saturated: its figures are whole-run figures[/yellow]")
        if share > 0:
            console.print(f"{tag}: {q.share(share)} of the energy is a MODEL ESTIMATE, not a measurement")
