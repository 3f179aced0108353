"""Reports and comparisons as JSON (a stable, documented shape) and as rich tables.

Every figure states its unit; energy that is partly a model estimate is labelled as
such wherever it appears, never shown as a plain measurement.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from wattline.quality import Quality
from wattline.workloads import economics
from wattline.workloads.jobs_view import utc_iso
from wattline.workloads.report import Report, WindowEnergy, report_coverage

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
            }
            for c in sorted(w.components.values(), key=lambda c: c.component)
        ],
        "by_host": [{"host": h, "energy_j": j} for h, j in sorted(w.hosts.items())],
    }


def report_json(r: Report) -> dict[str, Any]:
    """The ``--json`` / ``--report-json`` shape (see README "Report JSON")."""
    f = r.figures
    job = r.job
    return {
        "schema": REPORT_SCHEMA,
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
        "measured": {
            **_window_json(r.measured),
            "throughput_units_per_s": f.throughput_per_s,
            "throughput_units_per_h": f.throughput_per_hour,
            "throughput_units_per_instance_h": f.throughput_per_instance_hour,
            "j_per_unit": f.j_per_unit,
            "kwh_per_million_units": f.kwh_per_million_units,
            "cost_usd_per_run": f.cost_per_run,
            "cost_usd_per_million_units": f.cost_per_million_units,
            "co2_g_per_run": f.co2_per_run_g,
            "co2_g_per_million_units": f.co2_per_million_units_g,
            "coverage": report_coverage(r),
        },
        "warmup": _window_json(r.warmup),
        "policy": {
            "idle": r.settings.idle,
            "share_rule": r.settings.share_rule,
            "price_usd_per_instance_hour": r.settings.price_per_instance_hour,
            "carbon_intensity_g_per_kwh": r.settings.carbon_intensity,
            "pue": r.settings.pue,
        },
        "device_shares": [asdict(d) for d in r.device_shares],
        "notes": r.notes,
    }


def _num(x: float | None, fmt: str = ",.2f", unit: str = "") -> str:
    return "n/a" if x is None else f"{x:{fmt}}{(' ' + unit) if unit else ''}"


def _quality_label(by_quality: dict[str, float]) -> str:
    total = sum(by_quality.values())
    model = by_quality.get("model", 0.0)
    if total <= 0:
        return ""
    if model >= total:
        return "ESTIMATE (model)"
    kinds = "+".join(q for q in ("counter", "integrated") if by_quality.get(q))
    return kinds if model == 0 else f"{kinds} + {model / total:.0%} ESTIMATE"


def print_report(r: Report, console: Console | None = None) -> None:
    """Readable tables of one report."""
    console = console or Console()
    job, f = r.job, r.figures
    unit = job.unit_name
    console.print(
        f"[bold]Job {job.name}[/bold] ({job.job_id}, {job.kind}) "
        f"on {len(job.hosts)} host(s): {', '.join(sorted(job.hosts))}"
    )
    sat = r.saturation
    if r.saturated:
        console.print(f"Saturated at {_iso(sat.at_ns or 0)} ({sat.method}); warm-up {r.warmup.seconds:.1f} s excluded")
    else:
        console.print(f"[yellow]NOT SATURATED[/yellow] ({sat.reason}): whole-run figures")
    t = Table(title="Measured window" if r.saturated else "Whole run (not saturated)", show_header=True)
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("duration", _num(r.measured.seconds, ",.1f", "s")),
        (f"{unit}", _num(r.units_measured, ",.0f")),
        (
            "throughput",
            f"{_num(f.throughput_per_s, ',.2f', unit + '/s')}  ({_num(f.throughput_per_hour, ',.0f', unit + '/h')})",
        ),
        (
            "energy",
            f"{_num(r.measured.energy_j, ',.1f', 'J')}  "
            f"{_quality_label({q.value: v for q, v in r.measured.by_quality().items()})}",
        ),
        ("mean power", _num(f.mean_power_w, ",.2f", "W")),
        (f"energy per {unit.rstrip('s') or 'unit'}", _num(f.j_per_unit, ",.4f", "J")),
        (f"per million {unit}", _num(f.kwh_per_million_units, ",.4g", "kWh")),
    ]
    if f.cost_per_run is not None:
        rows += [
            ("cost per run", _num(f.cost_per_run, ",.4f", "USD")),
            (f"cost per million {unit}", _num(f.cost_per_million_units, ",.2f", "USD")),
        ]
    if f.co2_per_run_g is not None:
        rows += [
            ("CO2 per run", _num(f.co2_per_run_g, ",.2f", "gCO2")),
            (f"CO2 per million {unit}", _num(f.co2_per_million_units_g, ",.1f", "gCO2")),
        ]
    for name, value in rows:
        t.add_row(name, value)
    console.print(t)
    c = Table(title="Energy by component", show_header=True)
    for col in ("component", "energy J", "W", "warm-up J", "how obtained"):
        c.add_column(col, justify="left" if col in ("component", "how obtained") else "right")
    for name in sorted(set(r.measured.components) | set(r.warmup.components)):
        m = r.measured.components.get(name)
        w = r.warmup.components.get(name)
        watts = m.energy_j / r.measured.seconds if m and r.measured.seconds > 0 else None
        c.add_row(
            name,
            _num(m.energy_j if m else 0.0, ",.1f"),
            _num(watts),
            _num(w.energy_j if w else 0.0, ",.1f"),
            _quality_label(m.by_quality if m else {}),
        )
    console.print(c)
    cov = report_coverage(r)
    shares = ", ".join(f"{q} {v:.0%}" for q, v in cov["shares"].items())
    console.print(
        f"Coverage: {shares or 'no energy data'}"
        + (f"; not measured: {', '.join(cov['missing'])}" if cov["missing"] else "")
    )
    for note in r.notes:
        console.print(f"note: {note}")


def comparison_json(a: Report, b: Report, cmp: economics.Comparison) -> dict[str, Any]:
    """The ``compare --json`` shape: both jobs' figures and each change (b relative to a)."""

    def change(c: economics.Change) -> dict[str, Any]:
        return {"a": c.a, "b": c.b, "ratio": c.ratio, "change_pct": c.pct}

    out: dict[str, Any] = {
        "schema": COMPARE_SCHEMA,
        "a": {"job": a.job.job_id, "name": a.job.name, "saturated": a.saturated},
        "b": {"job": b.job.job_id, "name": b.job.name, "saturated": b.saturated},
        "throughput_ratio": cmp.throughput_ratio,
        "throughput_per_instance_hour": change(cmp.throughput_per_instance_hour),
        "j_per_unit": change(cmp.j_per_unit),
        "kwh_per_million_units": change(cmp.kwh_per_million_units),
        "cost_per_million_units_usd": change(cmp.cost_per_million_units),
        "co2_g_per_million_units": change(cmp.co2_per_million_units_g),
    }
    if cmp.sla is not None:
        out["sla"] = {
            k: change(getattr(cmp.sla, k))
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
        out["work"] = {k: change(getattr(cmp.work, k)) for k in ("instances", "hours", "energy_j", "cost", "co2_g")}
    return out


def print_comparison(a: Report, b: Report, cmp: economics.Comparison, console: Console | None = None) -> None:
    """The study-style table: each figure for A and B and B's change relative to A."""
    console = console or Console()
    unit = a.job.unit_name
    t = Table(title=f"A = {a.job.name} ({a.job.job_id})  vs  B = {b.job.name} ({b.job.job_id})")
    for col in ("figure", "A", "B", "change (B vs A)"):
        t.add_column(col, justify="left" if col == "figure" else "right")

    def row(name: str, c: economics.Change, fmt: str = ",.2f", unit_s: str = "") -> None:
        t.add_row(name, _num(c.a, fmt, unit_s), _num(c.b, fmt, unit_s), economics.format_percent(c.pct))

    t.add_row("throughput ratio (per instance)", "1x", economics.format_ratio(cmp.throughput_ratio), "")
    row("throughput per instance", cmp.throughput_per_instance_hour, ",.0f", f"{unit}/h")
    row(f"energy per {unit.rstrip('s') or 'unit'}", cmp.j_per_unit, ",.4f", "J")
    row(f"energy per million {unit}", cmp.kwh_per_million_units, ",.4g", "kWh")
    row(f"cost per million {unit}", cmp.cost_per_million_units, ",.2f", "USD")
    row(f"CO2 per million {unit}", cmp.co2_per_million_units_g, ",.1f", "gCO2")
    if cmp.sla is not None:
        s = cmp.sla
        row(f"instances for {s.sla_units_per_hour:,.0f} {unit}/h", s.instances, ",.0f")
        row("fleet power at the SLA", s.fleet_power_w, ",.1f", "W")
        row(f"energy per million {unit} at the SLA", s.energy_kwh_per_million, ",.4g", "kWh")
        row(f"cost per million {unit} at the SLA", s.cost_per_million, ",.2f", "USD")
        row(f"CO2 per million {unit} at the SLA", s.co2_g_per_million, ",.1f", "gCO2")
    if cmp.work is not None:
        w = cmp.work
        row(f"time for {w.work_units:,.0f} {unit}", w.hours, ",.3f", "h")
        row("energy for that work", w.energy_j, ",.0f", "J")
        row("cost for that work", w.cost, ",.2f", "USD")
        row("CO2 for that work", w.co2_g, ",.1f", "gCO2")
    console.print(t)
    for r, tag in ((a, "A"), (b, "B")):
        if not r.saturated:
            console.print(f"[yellow]{tag} never saturated: its figures are whole-run figures[/yellow]")
        if r.measured.by_quality().get(Quality.MODEL):
            share = r.measured.by_quality()[Quality.MODEL] / max(r.measured.energy_j, 1e-12)
            console.print(f"{tag}: {share:.0%} of the energy is a MODEL ESTIMATE, not a measurement")
