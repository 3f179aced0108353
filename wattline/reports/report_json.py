"""A report as JSON: the stable, documented ``--json`` / ``--report-json`` shape (docs/reports.md,
"Report JSON"). Every figure derived from energy that is partly a model estimate carries
``estimate``/``estimate_fraction``, and each its bound (``*_bound``)."""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from wattline.accounting.coverage import coverage
from wattline.accounting.uncertainty import Bound
from wattline.jobs.jobs_view import status_text, utc_iso
from wattline.reports import economics
from wattline.reports.intervals import SATURATED_LOAD
from wattline.reports.latency import latency_json
from wattline.reports.model_split import split_json, unit_kinds_json
from wattline.reports.spans import Span, spans
from wattline.reports.windows import WindowEnergy, estimate_fraction

if TYPE_CHECKING:
    from wattline.reports.intervals import Intervals
    from wattline.reports.model import Report

#: Version of the JSON shape below; bumped on any incompatible change.
REPORT_SCHEMA = "wattline.report/1"


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
        **estimate_json(w),
        **_bound_json(w.bound, w.energy_j),
        "mean_power_w_bound": w.bound.total_j / w.seconds if w.seconds > 0 else None,
    }


def _bound_json(bound: Bound, energy_j: float) -> dict[str, Any]:
    """How far ``energy_j`` may be off: half-width (J), relative, and by term (docs/method.md, "Uncertainty")."""
    return {
        "energy_bound_j": bound.total_j,
        "energy_bound_rel": bound.relative(energy_j),
        "energy_bound_terms_j": bound.terms(),
    }


#: Figures proportional to the charged energy (units, time, intensity exact): the bound's fraction of each.
BOUNDED_FIGURES = (
    "j_per_unit",
    "kwh_per_million_units",
    "co2_g_per_run",
    "co2_g_per_million_units",
)


#: Of those, the figures per unit: their bound also takes how far the units may be off.
PER_UNIT_FIGURES = ("j_per_unit", "kwh_per_million_units", "co2_g_per_million_units")


def _figure_bounds_json(figures: dict[str, Any], span: Span) -> dict[str, Any]:
    """``<figure>_bound``: the half-width of each figure derived from energy (null when unknown)."""
    out: dict[str, Any] = {}
    for k in BOUNDED_FIGURES:
        rel = span.per_unit_rel if k in PER_UNIT_FIGURES else span.bound_rel
        out[f"{k}_bound"] = None if figures.get(k) is None or rel is None else abs(figures[k]) * rel
    return out


def estimate_json(*windows: WindowEnergy) -> dict[str, Any]:
    fraction = estimate_fraction(*windows)
    # estimate_share: deprecated name of estimate_fraction
    return {"estimate": fraction > 0, "estimate_fraction": fraction, "estimate_share": fraction}


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
        **estimate_json(*whole.windows),
        **_bound_json(whole.bound, whole.energy_j),
        "mean_power_w_bound": whole.bound.total_j / whole.seconds if whole.seconds > 0 else None,
    }
    return out | _figure_bounds_json(out, whole)


def report_json(r: Report) -> dict[str, Any]:
    """The ``--json`` / ``--report-json`` shape (see docs/reports.md, "Report JSON")."""
    job = r.job
    saturated = _saturated_json(r)
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
            "start": utc_iso(job.start_ns),
            "end": utc_iso(r.end_ns),
            "closed": job.closed,
            "status": r.state,  #: closed | running | abandoned
            "last_heard": None if job.heard_at_ns is None else utc_iso(job.heard_at_ns),
            "exit_code": job.exit_code,
            "service": job.service,
            "end_state": job.end_state,  #: how the scheduler ended it ("" on its own)
            "status_text": status_text(r.state, job.exit_code, job.heard_at_ns, job.end_reason, job.end_state),
        },
        "complete": r.complete,
        "missing_events": job.missing_events,  #: host -> events not stored ("open": the window starts at its evidence)
        "samples_up_to": {host: utc_iso(ns) for host, ns in sorted(r.incomplete.items())},
        "samples_from": {host: utc_iso(ns) for host, ns in sorted(r.late_start.items())},
        "saturation": {
            "saturated": r.saturated,
            "at": utc_iso(r.saturation.at_ns) if r.saturation.at_ns is not None else None,
            "method": r.saturation.method,
            "reason": r.saturation.reason,
            "plateau_units_per_s": r.saturation.plateau_rate,
        },
        "durations_s": {
            "total": (r.end_ns - job.start_ns) / 1e9,
            "warmup": r.warmup.seconds,
            "saturated": r.saturated_window.seconds,
            "measured": r.saturated_window.seconds,  # deprecated name of "saturated"
        },
        "units": {
            "total": job.units_total,
            "warmup": r.units_warmup,
            "saturated": r.units_saturated,
            "measured": r.units_saturated,  # deprecated name of "saturated"
        },
        "saturated": saturated,
        "measured": copy.deepcopy(saturated),  # deprecated name of "saturated"
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
        # measured_j, share: deprecated names of split_by_use_j (a share by use is derived, not
        # measured) and fraction
        "device_shares": [asdict(d) | {"measured_j": d.split_by_use_j, "share": d.fraction} for d in r.device_shares],
        "notes": r.notes,
        "intervals": None if r.intervals is None else _intervals_json(r.intervals),
        "unit_kinds": unit_kinds_json(r),
        "model_split": split_json(r),
        "latency": latency_json(r.latencies),
        "window": None
        if r.settings.window is None
        else {"from": utc_iso(r.job.start_ns), "to": utc_iso(r.end_ns), "units_bound": r.units_bound},
    }


def _intervals_json(intervals: Intervals) -> dict[str, Any]:
    sat = intervals.at_saturation
    return {
        "every_s": intervals.every_s,
        "saturated_load": SATURATED_LOAD,
        "rows": [
            {
                "from": utc_iso(i.window.from_ns),
                "to": utc_iso(i.window.to_ns),
                **{k: v for k, v in dataclasses.asdict(i).items() if k != "window"},
                "estimate_share": i.estimate_fraction,  # deprecated name of estimate_fraction
            }
            for i in intervals.rows
        ],
        "at_saturation": None
        if sat is None
        else dataclasses.asdict(sat) | {"estimate_share": sat.estimate_fraction},  # deprecated name
    }


def _saturated_json(r: Report) -> dict[str, Any]:
    out = {**_window_json(r.saturated_window), **_figures_json(r.figures)}
    return out | _figure_bounds_json(out, spans(r)[0]) | {"coverage": report_coverage(r)}


def report_coverage(report: Report) -> dict[str, Any]:
    """Fraction of the saturated window's energy by quality, the measured fraction (counter and
    integrated), what was not measured at all, and the fraction that is the job's part of a
    shared device split by use (the device's energy is measured; the job's part of it is
    derived, not measured). Each also under its deprecated name (shares, measured_share,
    split_by_utilization_share)."""
    cov = coverage(report.saturated_window.by_quality(), report.missing)
    total = report.saturated_window.energy_j
    split = math.fsum(c.split_by_use_j for c in report.saturated_window.components.values())
    by_use = split / total if total > 0 else 0.0
    fractions = {q.value: v for q, v in cov.fractions.items()}
    return {
        "fractions": fractions,
        "shares": dict(fractions),  # deprecated name of fractions
        "measured_fraction": cov.measured_fraction,
        "measured_share": cov.measured_fraction,  # deprecated name of measured_fraction
        "missing": list(cov.missing),
        "split_by_use_fraction": by_use,
        "split_by_utilization_share": by_use,  # deprecated name of split_by_use_fraction
    }
