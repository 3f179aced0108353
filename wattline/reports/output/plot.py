"""Figures of a report and of a comparison, drawn with matplotlib (the ``plot`` extra).

matplotlib is imported here only, on first use, with the Agg backend (no display); the
agent and the collector never import this module. A missing extra is a ConfigError with
the install hint (one line, exit 2).

:func:`plot_report` draws power over time stacked by component; a model estimate is
hatched and labelled ``ESTIMATE`` in the legend, a measurement is solid; the warm-up is
shaded, the saturation point marked, units/s drawn on a second axis. ``by_host`` draws
one line of total power per host instead (dashed where part of it is an estimate).
:func:`plot_comparison` draws the study's bars for two jobs, each panel titled with B's
change relative to A.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

from wattline.config import ConfigError
from wattline.jobs.jobs_view import utc_iso
from wattline.quality import Quality
from wattline.reports.model import Report
from wattline.reports.output.labels import estimate_tag, span_note
from wattline.reports.output.quantities import si
from wattline.reports.timeline import Timeline
from wattline.reports.windows import estimate_fraction

#: Output formats, by file suffix.
FORMATS = (".png", ".svg")
HINT = "plots need matplotlib: pip install 'wattline[plot]'"
#: Fixed colours per component, so two plots read alike.
COLOURS = {
    "gpu": "#2ca02c",
    "accelerator": "#2ca02c",
    "cpu_package": "#1f77b4",
    "cpu": "#1f77b4",
    "dram": "#9467bd",
    "nic": "#ff7f0e",
}
QUALITY_ORDER = {q.value: i for i, q in enumerate(Quality)}


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, text kept as text in SVG; ConfigError when missing."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(HINT) from None
    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its first run's font-cache INFO line
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, small
    matplotlib.rcParams["svg.hashsalt"] = "wattline"  # stable ids: the same figure, the same file
    matplotlib.rcParams["hatch.linewidth"] = 1.2  # estimates' hatching stays visible when scaled down
    import matplotlib.pyplot as plt

    return plt


def check_path(path: Path, option: str = "--plot") -> None:
    """ConfigError unless ``path`` ends in .png or .svg."""
    if path.suffix.lower() not in FORMATS:
        raise ConfigError(f"option {option}: {str(path)[:100]!r} must end in .png or .svg")


def _label(component: str, quality: str) -> str:
    return f"{component} — ESTIMATE (model)" if quality == "model" else f"{component} ({quality}, measured)"


def _step(values: list[float]) -> list[float]:
    return [*values, values[-1]] if values else values


def plot_report(report: Report, timeline: Timeline, by_host: bool = False) -> Any:
    """The report's figure (a matplotlib Figure)."""
    plt = pyplot()
    from matplotlib.colors import to_rgba

    fig, ax = plt.subplots(figsize=(10, 5.2), dpi=100)
    x = timeline.seconds()
    if by_host:
        for host in sorted({h for h, _c, _q in timeline.power_w}):
            model = sum(timeline.energy_j(k) for k in timeline.power_w if k[0] == host and k[2] == "model")
            total = sum(timeline.energy_j(k) for k in timeline.power_w if k[0] == host)
            fraction = model / total if total > 0 else 0.0
            label = host + (f" ({fraction:.0%} ESTIMATE)" if fraction else " (measured)")
            ax.step(x, _step(timeline.total_w(host)), where="post", label=label, linestyle="--" if fraction else "-")
    else:
        base = [0.0] * timeline.bins
        keys = sorted({(c, q) for _h, c, q in timeline.power_w}, key=lambda k: (QUALITY_ORDER.get(k[1], 9), k[0]))
        for component, quality in keys:
            watts = [
                sum(v[i] for (_h, c, q), v in timeline.power_w.items() if (c, q) == (component, quality))
                for i in range(timeline.bins)
            ]
            top = [a + b for a, b in zip(base, watts, strict=True)]
            estimate = quality == "model"
            ax.fill_between(
                x,
                _step(base),
                _step(top),
                step="post",
                facecolor=to_rgba(COLOURS.get(component, "#7f7f7f"), 0.35 if estimate else 0.85),  # hatch opaque
                hatch="///" if estimate else None,
                edgecolor="#333333" if estimate else "none",
                linewidth=0.0,
                label=_label(component, quality),
            )
            base = top
    _mark_saturation(ax, report, x[-1] if x else 0.0)
    ax.set_xlabel(f"seconds since the job opened ({_utc(report.job.start_ns)})")
    ax.set_ylabel("power (W)" + (" per host" if by_host else ", stacked by component"))
    ax.set_xlim(0, x[-1] if x else 1)
    curves: list[str | None] = [*sorted({h for h, _c, _q in timeline.power_w})] if by_host else [None]
    peak = max((w for h in curves for w in timeline.total_w(h)), default=0.0)
    ax.set_ylim(0, peak * 1.3 or 1.0)  # headroom: the power and throughput curves stay apart
    if timeline.units_per_s is not None:
        ax2 = ax.twinx()
        ax2.step(x, _step(timeline.units_per_s), where="post", color="black", linewidth=1.2, label="throughput")
        ax2.set_ylabel(f"throughput ({report.job.unit_name}/s)")
        ax2.set_ylim(0, max(timeline.units_per_s, default=0.0) * 1.1 or 1.0)
        lines, labels = ax2.get_legend_handles_labels()
    else:
        lines, labels = [], []
    h, lab = ax.get_legend_handles_labels()
    ax.legend(h + lines, lab + labels, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8)
    ax.set_title(_title(report), fontsize=10)
    fig.tight_layout()
    return fig


def _utc(ns: int) -> str:
    return utc_iso(ns)[:19].replace("T", " ") + " UTC"


def _mark_saturation(ax: Any, report: Report, end_s: float) -> None:
    sat = report.saturation
    if not sat.saturated or sat.at_ns is None:
        ax.text(0.01, 0.97, "NOT SATURATED: whole-run figures", transform=ax.transAxes, va="top", color="#b00000")
        return
    at_s = (sat.at_ns - report.job.start_ns) / 1e9
    if at_s > 0:
        ax.axvspan(0, at_s, color="#999999", alpha=0.18, linewidth=0, label="warm-up (excluded from figures)")
    ax.axvline(at_s, color="#b00000", linestyle="--", linewidth=1.3, label=f"saturated ({sat.method})")
    ax.annotate(
        f"saturated at {at_s:.1f} s",
        xy=(at_s, 0.0),
        xycoords=("data", "axes fraction"),
        xytext=(4, 4),
        textcoords="offset points",
        color="#b00000",
        fontsize=8,
    )


def _title(report: Report) -> str:
    job, f = report.job, report.figures
    jpu = "n/a" if f.j_per_unit is None else f"{si(f.j_per_unit, 'J')}/{job.unit_name.rstrip('s') or 'unit'}"
    head = f"{job.name} ({job.job_id}) on {len(job.hosts)} host(s)"
    window = "saturated window" if report.saturated else "whole run (not saturated)"
    tag = estimate_tag(estimate_fraction(report.saturated_window))
    tail = f"{window}: {si(report.saturated_window.energy_j, 'J')}, {jpu}" + (f" ({tag})" if tag else "")
    if any("shared with" in n for n in report.notes):
        tail += "; hosts shared with other jobs: curves are host power"
    if not report.complete:
        tail += "; INCOMPLETE (see notes)"
    return f"{head}\n{tail}"


def save(fig: Any, path: Path) -> None:
    """Write ``fig`` to ``path`` (.png or .svg) and close it."""
    plt = pyplot()
    try:
        fig.savefig(
            path, format=path.suffix.lower().lstrip("."), metadata={"Date": None} if path.suffix == ".svg" else None
        )
    finally:
        plt.close(fig)


def svg_text(fig: Any) -> str:
    """``fig`` as an inline SVG element (no XML prolog), and close it."""
    plt = pyplot()
    buf = io.StringIO()
    try:
        fig.savefig(buf, format="svg", metadata={"Date": None})
    finally:
        plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


#: compare JSON key, panel title, unit (formatted with the job's unit name).
COMPARE_PANELS = (
    ("throughput_per_instance_hour", "throughput per instance", "{unit}/h"),
    ("sla.instances", "instances for the SLA", "instances"),
    ("kwh_per_million_units", "energy per million {unit}", "kWh"),
    ("cost_per_million_units_usd", "cost per million {unit}", "USD"),
    ("co2_g_per_million_units", "CO2 per million {unit}", "gCO2"),
    ("work.hours", "time for the work", "h"),
    ("work.energy_j", "energy for the work", "J"),
    ("work.cost", "cost for the work", "USD"),
)


def plot_comparison(cmp: dict[str, Any], unit: str, footnotes: list[str] | None = None) -> Any:
    """The study's bars for A and B from ``compare --json``'s shape; panels without
    figures (no price, no SLA) are left out; ``footnotes`` (estimates, not saturated) are
    printed under them."""
    plt = pyplot()
    panels = []
    for key, title, unit_fmt in COMPARE_PANELS:
        value: Any = cmp
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value and value.get("a") is not None and value.get("b") is not None:
            panels.append((value, title.format(unit=unit), unit_fmt.format(unit=unit)))
    cols = min(4, max(1, len(panels)))
    rows = (len(panels) + cols - 1) // cols or 1
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows + 0.6), dpi=100, squeeze=False)
    names = (f"A: {cmp['a']['name']}", f"B: {cmp['b']['name']}")
    for ax, (value, title, unit_s) in zip(axes.flat, panels, strict=False):
        bars = ax.bar(["A", "B"], [value["a"], value["b"]], color=["#7f7f7f", "#1f77b4"])
        ax.bar_label(bars, labels=[_short(value["a"]), _short(value["b"])], fontsize=8)
        pct = value.get("change_pct")
        change = "" if pct is None else f"\nB vs A: {pct:+.0f} %"
        ax.set_title(f"{title}{change}", fontsize=9)
        ax.set_ylabel(unit_s, fontsize=8)
        ax.margins(y=0.18)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"{names[0]} ({cmp['a']['job']})   vs   {names[1]} ({cmp['b']['job']})", fontsize=10)
    if footnotes:
        fig.text(0.01, 0.01, "\n".join(footnotes), fontsize=8, color="#8a4b00", va="bottom")
    fig.tight_layout(rect=(0, 0.03 * len(footnotes or []), 1, 1))
    return fig


def plot_curve(report: Report) -> Any:
    """Energy per unit against load, one point per interval of ``report --every`` (its bound as
    an error bar); the saturated intervals' figure as a line. A service at low load pays its
    idle power over few units: the curve shows how much."""
    assert report.intervals is not None
    plt = pyplot()
    unit = report.job.unit_name
    one = unit.rstrip("s") or "unit"
    rows = [i for i in report.intervals.rows if i.load is not None and i.j_per_unit is not None]
    bounded = [i for i in rows if i.j_per_unit_bound is not None]
    # An interval whose units may all lie outside it (a short last one) has no upper bound: drawn
    # hollow, apart, never as a point as sure as the others.
    unbounded = [i for i in rows if i.j_per_unit_bound is None]
    fig, ax = plt.subplots(figsize=(7, 4.2), constrained_layout=True)
    ax.errorbar(
        [100 * (i.load or 0.0) for i in bounded],
        [i.j_per_unit for i in bounded],
        yerr=[i.j_per_unit_bound or 0.0 for i in bounded],
        fmt="o",
        color=COLOURS["cpu"],
        ecolor="#555555",
        capsize=3,
        label=f"one interval of {report.intervals.every_s:g} s",
    )
    if unbounded:
        ax.scatter(
            [100 * (i.load or 0.0) for i in unbounded],
            [i.j_per_unit for i in unbounded],
            facecolors="none",
            edgecolors=COLOURS["cpu"],
            label="too few units to bound (not to be read)",
        )
    sat = report.intervals.at_saturation
    if sat is not None:
        ax.axhline(
            sat.j_per_unit, color=COLOURS["nic"], linestyle="--", label=f"at saturation: {si(sat.j_per_unit, 'J')}"
        )
    estimate = estimate_tag(estimate_fraction(report.warmup, report.saturated_window))
    ax.set_xlabel("load (% of the highest throughput seen)")
    ax.set_ylabel(f"energy per {one} (J){estimate}")
    ax.set_xlim(0, 105)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    ax.set_title(f"{report.job.name} ({report.job.job_id}): energy per {one} against load", fontsize=10)
    return fig


def comparison_footnotes(reports: dict[str, Report]) -> list[str]:
    """What the bars do not show: a side that never saturated, a side partly estimated."""
    notes = []
    for tag, r in reports.items():
        if note := span_note(r, tag):
            notes.append(note)
        by_quality = r.saturated_window.by_quality()
        model = sum(j for q, j in by_quality.items() if q.value == "model")
        if model > 0:
            notes.append(
                f"{tag}: {model / max(r.saturated_window.energy_j, 1e-12):.0%} of the energy is a MODEL ESTIMATE"
            )
    return notes


def _short(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
