"""A report as readable tables: the saturated window beside the whole run.

Every figure states its unit, with an SI prefix and 4 significant digits
(:mod:`.quantities`); every figure derived from energy that is partly a model estimate
(energy, power, J per unit, kWh, CO2) carries the ESTIMATE label, never shown as a plain
measurement. Cost is instance time x price: no estimate enters it. With ``--idle subtract``
"total" and "above idle" are named as such. The JSON shapes live in :mod:`wattline.reports.report_json`
and :mod:`.comparison`, the ``wattline jobs`` table in :mod:`.jobs_table`; their public
names stay importable from here.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from wattline.accounting.uncertainty import Bound
from wattline.jobs.jobs_view import status_text, utc_iso
from wattline.quality import Quality
from wattline.reports.model import Report
from wattline.reports.model_split import ModelShare, model_split
from wattline.reports.output import quantities as q
from wattline.reports.output.interval_table import print_intervals
from wattline.reports.output.labels import NO_SAMPLES, estimate_tag, tagged
from wattline.reports.output.latency_table import latency_table
from wattline.reports.report_json import report_coverage
from wattline.reports.spans import Span, spans
from wattline.reports.unit_kinds import unit_kinds
from wattline.reports.windows import WindowEnergy


def _quality_label(by_quality: dict[str, float]) -> str:
    total = sum(by_quality.values())
    model = by_quality.get(Quality.MODEL.value, 0.0)
    if total <= 0:
        return ""
    if model >= total:
        return "ESTIMATE (model)"
    kinds = "+".join(k.value for k in Quality if k.measured and by_quality.get(k.value))
    return kinds if model == 0 else f"{kinds} + {estimate_tag(model / total)}"


def _qualities(*windows: WindowEnergy) -> dict[str, float]:
    out: dict[str, float] = {}
    for w in windows:
        for quality, j in w.by_quality().items():
            out[quality.value] = out.get(quality.value, 0.0) + j
    return out


def _bounded(text: str, rel: float | None) -> str:
    """A figure with its relative bound: "171.0 J ± 2.3 %"."""
    return f"{text} {q.plus_minus(rel)}" if text != q.NA else text


def _energy_bounded(energy_j: float, bound: Bound) -> str:
    """Energy with its bound: relative ("171.0 J ± 2.3 %"), in joules where none was counted ("0 J ± 20 J")."""
    rel = bound.relative(energy_j)
    if rel is None:
        return f"{q.si(energy_j, 'J')} ± {q.si(bound.total_j, 'J')}"
    return _bounded(q.si(energy_j, "J"), rel)


def _rel(bound: float | None, value: float) -> float | None:
    """``bound`` relative to ``value``; None when either is unknown or ``value`` is 0."""
    return bound / value if bound is not None and value else None


def _span_figure(text: str, s: Span, per_unit: bool = False) -> str:
    """A span's figure derived from its charged energy (``per_unit``: and its units): bound, then
    the estimate label."""
    return tagged(_bounded(text, s.per_unit_rel if per_unit else s.bound_rel), s.estimate)


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
        (f"energy per {one}{tag}", lambda s: _span_figure(q.si(s.figures.j_per_unit, "J"), s, per_unit=True)),
        (f"per million {unit}{tag}", lambda s: _span_figure(q.kwh(s.figures.kwh_per_million_units), s, per_unit=True)),
    ]
    if r.settings.price_per_instance_hour is not None:
        rows += [
            ("cost per run (instance time x price)", lambda s: q.usd(s.figures.cost_per_run)),
            (f"cost per million {unit}", lambda s: q.usd(s.figures.cost_per_million_units)),
        ]
    if r.settings.carbon_intensity is not None:
        rows += [
            (f"CO2 per run{tag}", lambda s: _span_figure(q.co2(s.figures.co2_per_run_g), s)),
            (
                f"CO2 per million {unit}{tag}",
                lambda s: _span_figure(q.co2(s.figures.co2_per_million_units_g), s, per_unit=True),
            ),
        ]
    if not r.energy_data:  # no sample at all: no energy figure, not "0 J"
        rows = [(name, _no_samples) if name.startswith(ENERGY_ROWS) else (name, text) for name, text in rows]
    return rows


#: Rows of the report's table derived from energy (shown as NO_SAMPLES when there is none).
ENERGY_ROWS = ("energy", "mean power", "per million", "CO2")


def _no_samples(_span: Span) -> str:
    return NO_SAMPLES


#: A table as text: (title, column heads, rows of cells).
TextTable = tuple[str, list[str], list[list[str]]]


def report_table(r: Report) -> TextTable:
    """The report's main table: each figure in the saturated window beside the whole run
    (only the whole run when the job never saturated)."""
    saturated, whole = spans(r)
    shown = (saturated, whole) if r.saturated else (whole,)
    title = "Saturated window and whole run" if r.saturated else "Whole run (not saturated)"
    if r.settings.window is not None:
        title = "Window asked"
    return (
        title,
        ["figure", *(s.title for s in shown)],
        [[name, *(text(s) for s in shown)] for name, text in _report_rows(r)],
    )


def unit_kinds_table(r: Report) -> TextTable | None:
    """The job's extra unit kinds over the whole run (or the window asked): each series' units
    and the job's energy per unit of it (:mod:`~wattline.reports.unit_kinds`); None
    without any."""
    kinds = unit_kinds(r)
    if not kinds:
        return None
    whole = spans(r)[1]
    rows = [
        [
            k.name,
            ", ".join(f"{name}={value}" for name, value in sorted(k.labels.items())) or "-",
            q.count(k.units),
            tagged(_bounded(q.si(k.j_per_unit, "J"), k.j_per_unit_rel), whole.estimate),
        ]
        for k in kinds
    ]
    head = ["unit kind", "labels", "units", "J per unit"]
    return f"Unit kinds ({whole.title}; the job's energy per unit of each)", head, rows


def model_split_table(r: Report) -> TextTable | None:
    """The job's energy split between the models of its unit series by the report's rule, and
    each model's J per unit of each kind by it (:mod:`~wattline.reports.model_split`);
    None without a split. Every figure is labelled a model, as the rule is one."""
    split = model_split(r)
    if split is None or not split.models:
        return None
    whole = spans(r)[1]
    kinds = sorted({p.name for m in split.models for p in m.per_unit})

    def per(m: ModelShare, kind: str) -> str:
        p = next((p for p in m.per_unit if p.name == kind), None)
        if p is None or p.j_per_unit is None:
            return q.NA
        return tagged(_bounded(q.si(p.j_per_unit, "J"), _rel(p.j_per_unit_bound, p.j_per_unit)), whole.estimate)

    rows = [
        [
            ", ".join(f"{name}={value}" for name, value in sorted(m.labels.items())),
            q.fraction(m.fraction),
            tagged(_bounded(q.si(m.energy_j, "J"), _rel(m.energy_bound_j, m.energy_j)), whole.estimate),
            *(per(m, kind) for kind in kinds),
        ]
        for m in split.models
    ]
    head = ["labels", f"fraction of {split.kind}", "energy (model)", *(f"J per {kind} (model)" for kind in kinds)]
    return f"Energy by model ({whole.title}; MODEL: split by {split.rule}, not measured)", head, rows


def component_table(r: Report) -> TextTable:
    """Energy and mean power by component (saturated window), warm-up energy, how obtained."""
    rows = []
    for name in sorted(set(r.saturated_window.components) | set(r.warmup.components)):
        m = r.saturated_window.components.get(name)
        w = r.warmup.components.get(name)
        watts = m.energy_j / r.saturated_window.seconds if m and r.saturated_window.seconds > 0 else None
        rows.append(
            [
                name,
                _energy_bounded(m.energy_j, m.bound) if m else q.si(0.0, "J"),
                q.si(watts, "W"),
                q.si(w.energy_j if w else 0.0, "J"),
                _quality_label(m.by_quality if m else {}),
            ]
        )
    title = "Energy by component" + (" (saturated window)" if r.saturated else "")
    return title, ["component", "energy", "mean power", "warm-up", "how obtained"], rows


def print_report(r: Report, console: Console | None = None) -> None:
    """Readable tables of one report: the saturated window beside the whole run."""
    console = console or Console()
    job = r.job
    console.print(
        f"[bold]Job {escape(job.name)}[/bold] ({escape(job.job_id)}, {escape(job.kind)}) "
        f"on {len(job.hosts)} host(s): {escape(', '.join(sorted(job.hosts)))}"
    )
    console.print(f"Status: {status_text(r.state, job.exit_code, job.heard_at_ns, job.end_reason, job.end_state)}")
    sat = r.saturation
    whole = spans(r)[1]
    if r.saturated:
        console.print(
            f"Saturated at {utc_iso(sat.at_ns or 0)} ({sat.method}); the saturated window leaves out "
            f"{q.duration(r.warmup.seconds)} of warm-up, the whole run includes it"
        )
    elif r.settings.window is not None:
        off = q.count(r.units_bound, r.job.unit_name)
        units = f"; its units may be off by {off} (events across its edges)" if r.units_bound else ""
        console.print(f"Window {utc_iso(r.job.start_ns)} to {utc_iso(r.end_ns)}: figures over it{units}")
    else:
        console.print(f"[yellow]NOT SATURATED[/yellow] ({escape(sat.reason)}): whole-run figures")
    fraction = whole.estimate
    if fraction > 0:
        console.print(
            f"[bold yellow]ESTIMATE[/bold yellow]: {q.fraction(fraction)} of this job's energy is a power-model "
            "estimate, not a measurement; every figure marked ESTIMATE derives from it"
        )
    if r.settings.idle == "subtract":
        console.print(
            "Idle policy subtract: figures marked 'above idle' charge only the energy above the idle baseline "
            f"(the {r.settings.idle_lookback_s:.0f} s before the job); 'total' is all of it"
        )
    tables = [report_table(r), component_table(r)]
    if kinds := unit_kinds_table(r):
        tables.append(kinds)
    if split := model_split_table(r):
        tables.append(split)
    if latency := latency_table(r.latencies, whole.title):
        tables.append(latency)
    for title, head, rows in tables:
        t = Table(title=title)
        for n, col in enumerate(head):
            t.add_column(col, justify="left" if n == 0 or col == "how obtained" else "right")
        for row in rows:
            t.add_row(*(escape(cell) for cell in row))
        console.print(t)
    cov = report_coverage(r)
    fractions = ", ".join(f"{quality} {q.fraction(v)}" for quality, v in cov["fractions"].items())
    console.print(
        f"Coverage: {fractions or 'no energy data'}"
        + (f"; not measured: {', '.join(cov['missing'])}" if cov["missing"] else "")
    )
    if r.intervals is not None:
        print_intervals(r.intervals, r.job.unit_name, console)
    for note in r.notes:
        if note.startswith("warning:"):
            console.print(f"[yellow]{escape(note)}[/yellow]")
        else:
            console.print(f"note: {escape(note)}")
