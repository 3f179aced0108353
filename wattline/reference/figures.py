"""The reference workloads' own figures beside the job's: units counted against units
processed, where throughput detection alone puts saturation, and the workload's tables
(ramp and plateau latencies, or warm-up and step times) as ``wattline workload`` prints them."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from wattline.accounting.saturation import detect_saturation
from wattline.reference.common import RANDOM_WEIGHTS
from wattline.reports.model import Report


def cross_check(report: Report, result: dict[str, Any] | None) -> dict[str, Any]:
    """Units counted by the job against units the workload processed, and where throughput
    detection alone (ignoring any mark) puts saturation."""
    job = report.job
    detected = detect_saturation(
        job.start_ns, report.end_ns, unit_events=job.unit_events or None, params=report.settings.saturation
    )
    processed = None if result is None else result.get("units_processed")
    return {
        "units_counted": job.units_total,
        "units_processed": processed,
        "units_match": processed is not None and float(processed) == job.units_total,
        "saturation_method": report.saturation.method,
        "saturation_at_s": _offset(report.saturation.at_ns, job.start_ns),
        "detection_alone": {
            "saturated": detected.saturated,
            "at_s": _offset(detected.at_ns, job.start_ns),
            "method": detected.method,
            "reason": detected.reason,
        },
    }


def _offset(at_ns: int | None, start_ns: int) -> float | None:
    return None if at_ns is None else (at_ns - start_ns) / 1e9


def _ms(summary: dict[str, Any], key: str) -> str:
    value = summary.get(key)
    return "n/a" if value is None else f"{value:,.2f}"


def print_workload(result: dict[str, Any], check: dict[str, Any] | None, console: Console) -> None:
    """The workload's own figures: model, ramp or warm-up, measured period, the cross-check."""
    model = result.get("model", {})
    console.print(
        f"[bold]{result.get('workload')}[/bold]: {model.get('class')} {model.get('size')} "
        f"({model.get('parameters', 0) / 1e6:.1f} M parameters) on {result.get('device')}, {result.get('dtype')}, "
        f"{result.get('threads')} CPU thread(s) - {RANDOM_WEIGHTS}"
    )
    measured = result.get("measured", {})
    if "ramp" in result:
        ramp = Table(title=f"Load ramp (a step must gain {result['ramp']['min_gain']:.0%})")
        for col in ("concurrency", "batch", "documents/s"):
            ramp.add_column(col, justify="right")
        for s in result["ramp"]["steps"]:
            ramp.add_row(str(s["concurrency"]), str(s["batch_size"]), f"{s['throughput_per_s']:,.1f}")
        console.print(ramp)
        plateau = result["plateau"]
        t = Table(
            title=f"Plateau held {measured['seconds']:.1f} s: concurrency {plateau['concurrency']}, "
            f"batch {plateau['batch_size']}"
        )
        t.add_column("latency, ms")
        for col in ("p50", "p90", "p99", "max"):
            t.add_column(col, justify="right")
        for label, key in (
            ("per batch (each document waits this)", "batch_latency_ms"),
            ("per document", "per_document_ms"),
        ):
            summary = measured.get(key, {})
            t.add_row(label, *(_ms(summary, k) for k in ("p50", "p90", "p99", "max")))
        console.print(t)
        console.print(
            f"Throughput at the plateau: {measured['throughput_per_s']:,.1f} documents/s "
            f"({measured['throughput_per_h']:,.0f} per hour)"
        )
    else:
        warm = result.get("warmup", {})
        step = measured.get("step_ms", {})
        console.print(
            f"seq {result.get('seq_len')}, batch {result.get('batch_size')} x {result.get('world_size')} process(es); "
            f"warm-up {warm.get('steps')} steps, {warm.get('seconds', 0):.1f} s ({warm.get('reason')})"
        )
        console.print(
            f"After warm-up: {measured.get('steps')} steps in {measured.get('seconds', 0):.1f} s, "
            f"{measured.get('throughput_per_s', 0):,.1f} sequences/s, step p50 {_ms(step, 'p50')} ms, "
            f"p99 {_ms(step, 'p99')} ms; final loss {result.get('final_loss', float('nan')):.3f}"
        )
    if check is not None:
        match = "yes" if check["units_match"] else "NO"
        console.print(
            f"Units counted by the job {check['units_counted']:,.0f}, processed by the workload "
            f"{check['units_processed'] if check['units_processed'] is not None else 'n/a'}: match {match}"
        )
        alone = check["detection_alone"]
        where = f"at {alone['at_s']:.1f} s" if alone["saturated"] else f"not found ({alone['reason']})"
        console.print(f"Throughput-plateau detection alone (ignoring any mark): {where}")


def print_load(result: dict[str, Any], console: Console) -> None:
    """``wattline workload load``'s windows: target and achieved rates, answers, errors, latency."""
    measured = result.get("capacity_measured")
    if measured is not None:
        console.print(
            f"Capacity: {measured['rps']:,.1f} requests/s at {measured['concurrency']} closed-loop clients "
            f"(levels tried: {', '.join(str(level['concurrency']) for level in measured['levels'])})"
        )
    t = Table(title=f"Open-loop load on {result['url']} ({result['arrivals']} arrivals)")
    for col in ("step", "target/s", "seconds", "sent", "answered", "errors", "achieved/s", "p50 ms", "p99 ms"):
        t.add_column(col, justify="right")
    for w in result["windows"]:
        share = f" ({w['percent']:g}%)" if w["percent"] is not None else ""
        t.add_row(
            f"{w['index']}{share}", f"{w['rate_rps']:,.1f}", f"{w['seconds']:g}", str(w["sent"]), str(w["answered"]),
            str(sum(w["errors"].values())), f"{w['achieved_rps']:,.1f}",
            _ms(w["latency_ms"], "p50"), _ms(w["latency_ms"], "p99"),
        )  # fmt: skip
    console.print(t)
    kinds = {k: sum(w["errors"].get(k, 0) for w in result["windows"]) for w in result["windows"] for k in w["errors"]}
    if kinds:
        console.print("Errors: " + ", ".join(f"{k} x {n}" for k, n in sorted(kinds.items())))
