"""A sweep's answer as JSON (``"schema": "wattline.sweep/1"``), as a table and as CSV rows:
one shape (:func:`answer_json`) that the table, the CSV, the figure and the page read."""

from __future__ import annotations

import csv
import io
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from wattline.reports.output import quantities as q
from wattline.sweep.analysis import Advantage, PointResult, SweepAnswer, Value
from wattline.sweep.grid import point_text
from wattline.sweep.plan import Plan

SWEEP_SCHEMA = "wattline.sweep/1"


def _value(v: Value | None) -> dict[str, Any] | None:
    if v is None:
        return None
    bound = None if v.side is None else v.side.measurement + v.side.model
    return {
        "mean": v.mean,
        "runs": list(v.values),
        "range_rel": v.range / v.mean if v.mean else None,
        "bound_rel": bound,
    }


def _advantage(a: Advantage | None) -> dict[str, Any] | None:
    if a is None:
        return None
    return {
        "over": dict(a.over),
        "pct": a.pct,
        "bound_pp": a.bound_pp,
        "spread_pp": a.spread_pp,
        "real": a.real,
        "verdict": a.why,
    }


def _point(p: PointResult, rank: int | None) -> dict[str, Any]:
    return {
        "rank": rank,
        "params": dict(p.point),
        "jobs": [r.job_id for r in p.runs],
        "runs": len(p.runs),
        "runs_ok": len(p.usable),
        "problems": sorted({r.problem for r in p.runs if r.problem}),
        "not_saturated": sum(not r.saturated for r in p.usable),
        "estimate_fraction": max((r.estimate_fraction for r in p.usable), default=0.0),
        "estimate_share": max((r.estimate_fraction for r in p.usable), default=0.0),  # its deprecated name
        "j_per_unit": _value(p.j_per_unit),
        "throughput_per_s": _value(p.throughput_per_s),
        "mean_power_w": _value(p.mean_power_w),
        "latency_s": _value(p.latency_s),
        "pareto": p.pareto,
        "advantage_over_next": _advantage(p.advantage),
        "sla_instances": list(p.sla_instances) if p.sla_instances else None,
        "sla_energy_kwh_per_million": _value(p.sla_energy_kwh_per_million),
        "sla_cost_usd_per_million": _value(p.sla_cost_per_million),
    }


def answer_json(plan: Plan, answer: SweepAnswer, sla: float | None, price: float | None) -> dict[str, Any]:
    """The ``sweep --json`` shape."""
    return {
        "schema": SWEEP_SCHEMA,
        "sweep": plan.sweep_id,
        "unit": plan.units,
        "params": {p.name: list(p.values) for p in plan.params},
        "repeat": plan.repeat,
        "sla_units_per_hour": sla,
        "price_usd_per_instance_hour": price,
        "points": [_point(p, i) for i, p in enumerate(answer.ranked, 1)] + [_point(p, None) for p in answer.failed],
        "choices": [
            {"figure": c.figure, "params": dict(c.point.point), "advantage": _advantage(c.advantage)}
            for c in answer.choices
        ],
    }


def _pm(v: dict[str, Any] | None, unit: str, fmt: Any = q.si) -> str:
    if v is None:
        return "n/a"
    text = fmt(v["mean"], unit)
    return text if v["bound_rel"] is None else f"{text} {q.plus_minus(v['bound_rel'])}"


def _spread(v: dict[str, Any] | None) -> str:
    if v is None or v["range_rel"] is None or len(v["runs"]) < 2:
        return "n/a"
    return f"{q.round_sig(100 * v['range_rel'], 2):g} %"


def verdict_text(a: dict[str, Any] | None) -> str:
    """``the next, batch=8, takes +12 %: real`` / ``...: within uncertainty (...)``."""
    if a is None:
        return ""
    return f"the next, {point_text(tuple(a['over'].items()))}, takes {q.round_sig(a['pct'], 2):+g} %: {a['verdict']}"


def _latency(v: dict[str, Any] | None) -> str:
    """The mean of the runs' median latencies, in ms."""
    return "n/a" if v is None else f"{q.round_sig(1000 * v['mean'], 3):g} ms"


def print_answer(data: dict[str, Any], console: Console) -> None:
    """The table (ordered by energy per unit) and the choices, as text."""
    unit = data["unit"]
    one = unit.rstrip("s") or "unit"
    table = Table(title=f"sweep {escape(data['sweep'])}: ordered by energy per {escape(one)}")
    latency = any(p["latency_s"] for p in data["points"])
    heads = ["#", "setting", "runs", f"energy per {one}", "spread of runs", "throughput", "power"]
    for head in [*heads, *(["latency (median)"] if latency else []), "Pareto"]:
        table.add_column(escape(head), justify="left" if head in ("setting", "Pareto") else "right")
    sla = data["sla_units_per_hour"] is not None
    if sla:
        table.add_column("instances for SLA", justify="right")
        table.add_column(f"kWh per million {escape(unit)} at SLA", justify="right")
        if data["price_usd_per_instance_hour"] is not None:
            table.add_column(f"cost per million {escape(unit)} at SLA", justify="right")
    for p in data["points"]:
        row = [
            str(p["rank"] or "-"),
            escape(" ".join(f"{k}={v}" for k, v in p["params"].items())),
            f"{p['runs_ok']}/{p['runs']}",
            _pm(p["j_per_unit"], "J"),
            _spread(p["j_per_unit"]),
            "n/a" if p["throughput_per_s"] is None else q.rate(p["throughput_per_s"]["mean"], f"{unit}/s"),
            _pm(p["mean_power_w"], "W"),
            *([_latency(p["latency_s"])] if latency else []),
            "yes" if p["pareto"] else ("" if p["rank"] else escape("; ".join(p["problems"]))),
        ]
        if sla:
            inst = p["sla_instances"]
            row.append("n/a" if inst is None else (str(inst[0]) if inst[0] == inst[1] else f"{inst[0]}-{inst[1]}"))
            e = p["sla_energy_kwh_per_million"]
            row.append("n/a" if e is None else q.kwh(e["mean"]))
            if data["price_usd_per_instance_hour"] is not None:
                c = p["sla_cost_usd_per_million"]
                row.append("n/a" if c is None else q.usd(c["mean"]))
        table.add_row(*row)
    console.print(table)
    for c in data["choices"]:
        text = " ".join(f"{k}={v}" for k, v in c["params"].items())
        lead = verdict_text(c["advantage"]) or "the only setting with figures"
        console.print(f"lowest {escape(c['figure'])}: {escape(text)} ({escape(lead)})")


CSV_FIELDS = (
    "rank", "runs", "runs_ok", "j_per_unit", "j_per_unit_bound_rel", "j_per_unit_range_rel",
    "throughput_per_s", "mean_power_w", "latency_s", "pareto", "advantage_pct", "advantage_real", "verdict",
    "sla_instances_max", "sla_energy_kwh_per_million", "sla_cost_usd_per_million", "jobs", "problems",
)  # fmt: skip


def csv_text(data: dict[str, Any]) -> str:
    """One row per point: its parameters (``param_NAME``), then :data:`CSV_FIELDS` (raw numbers)."""
    names = list(data["params"])
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow([f"param_{n}" for n in names] + list(CSV_FIELDS))
    for p in data["points"]:
        e, a = p["j_per_unit"] or {}, p["advantage_over_next"] or {}
        w.writerow(
            [p["params"][n] for n in names]
            + [
                p["rank"],
                p["runs"],
                p["runs_ok"],
                e.get("mean"),
                e.get("bound_rel"),
                e.get("range_rel"),
                (p["throughput_per_s"] or {}).get("mean"),
                (p["mean_power_w"] or {}).get("mean"),
                (p["latency_s"] or {}).get("mean"),
                int(p["pareto"]),
                a.get("pct"),
                None if not a else int(a["real"]),
                a.get("verdict"),
                (p["sla_instances"] or [None, None])[1],
                (p["sla_energy_kwh_per_million"] or {}).get("mean"),
                (p["sla_cost_usd_per_million"] or {}).get("mean"),
                " ".join(p["jobs"]),
                "; ".join(p["problems"]),
            ]
        )
    return out.getvalue()
