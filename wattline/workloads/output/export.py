"""Reports and samples as CSV rows: one row per job (joinable with a scheduler's accounting)
and one row per sample of a job.

Job rows take their figures from the report JSON (:func:`wattline.workloads.report.report_json.report_json`), so every
energy column is the figure ``wattline report --json`` prints. Sample rows are the job's
samples on each of its hosts, cut at the host's window and at the saturation point (the
energy of a sample straddling an edge is apportioned by overlap, as the report does), and
``job_energy_j`` is what the report charged the job for it (the host split between jobs, and
by CPU time, by the report's rule): summing ``job_energy_j`` over the rows of ``window`` =
``measured`` (the saturated window; the value kept for old readers) gives the report's
saturated-window energy, ``energy_j`` the host's.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from typing import IO, Any

from wattline.collector.stores.reader import Reader
from wattline.quality import Quality
from wattline.workloads.jobs.jobs_view import utc_iso
from wattline.workloads.report.channels import EXCLUDED_COMPONENTS
from wattline.workloads.report.host_energy import sample_parts
from wattline.workloads.report.model import Report
from wattline.workloads.report.report_json import report_json
from wattline.workloads.report.timeline import host_span

QUALITIES = tuple(q.value for q in Quality)

JOB_COLUMNS = [
    "job_id", "name", "kind", "unit", "hosts", "start", "end", "status", "exit_code", "saturated", "saturated_at",
    "duration_s", "warmup_s", "measured_s", "units_total", "units_measured", "energy_measured_j", "energy_total_j",
    "j_per_unit", "kwh_per_million_units", "cost_usd_per_run", "co2_g_per_run",
    *(f"share_{q}" for q in QUALITIES), "complete", "error", "saturated_s", "units_saturated", "energy_saturated_j",
]  # fmt: skip
#: Deprecated job columns (the saturated window was called "measured"), kept for old readers.
DEPRECATED_JOB_COLUMNS = {
    "measured_s": "saturated_s",
    "units_measured": "units_saturated",
    "energy_measured_j": "energy_saturated_j",
}

SAMPLE_COLUMNS = [
    "time", "start", "host", "source", "component", "device", "quality", "window", "in_total",
    "energy_j", "power_w", "utilization", "healthy", "job_energy_j",
]  # fmt: skip


def job_row(report: Report) -> dict[str, Any]:
    """One CSV row of a job: the report's figures (energy of the saturated window and of the
    whole run), its quality shares and its labels (``label_KEY`` columns)."""
    data = report_json(report)
    job, sat, shares = data["job"], data["saturated"], data["saturated"]["coverage"]["shares"]
    row: dict[str, Any] = {
        "job_id": job["id"],
        "name": job["name"],
        "kind": job["kind"],
        "unit": job["unit"],
        "hosts": " ".join(job["hosts"]),
        "start": job["start"],
        "end": job["end"],
        "status": job["status"],
        "exit_code": job["exit_code"],
        "saturated": int(data["saturation"]["saturated"]),
        "saturated_at": data["saturation"]["at"],
        "duration_s": data["durations_s"]["total"],
        "warmup_s": data["durations_s"]["warmup"],
        "saturated_s": data["durations_s"]["saturated"],
        "units_total": data["units"]["total"],
        "units_saturated": data["units"]["saturated"],
        "energy_saturated_j": sat["energy_j"],
        "energy_total_j": sat["energy_j"] + data["warmup"]["energy_j"],
        "j_per_unit": sat["j_per_unit"],
        "kwh_per_million_units": sat["kwh_per_million_units"],
        "cost_usd_per_run": sat["cost_usd_per_run"],
        "co2_g_per_run": sat["co2_g_per_run"],
        "complete": int(data["complete"]),
        **{f"share_{q}": shares.get(q, 0.0) for q in QUALITIES},
    }
    row.update({old: row[new] for old, new in DEPRECATED_JOB_COLUMNS.items()})
    row.update({f"label_{k}": v for k, v in sorted(job["labels"].items())})
    return row


def sample_rows(reader: Reader, report: Report) -> Iterator[dict[str, Any]]:
    """The job's samples, host by host (by end, then channel), cut at the window edges and the
    saturation point, each with the job's part of it."""
    job = report.job
    charged = sample_parts(reader, report)
    for host in sorted(job.hosts):
        open_ns, close = host_span(report, host)
        split = min(max(report.saturated_from_ns, open_ns), close)
        # Samples ending at one instant come in the store's own order (SQLite: insertion,
        # InfluxDB and VictoriaMetrics: series); channel order makes the CSV the same from any.
        for s in sorted(reader.samples(host, open_ns, close), key=lambda s: (s.end_ns, s.series, s.stream)):
            quality = _quality(s.quality)
            parts = charged.get((host, s.component, s.device, quality, s.start_ns, s.end_ns), {}) if quality else {}
            for name, lo, hi in (("warmup", open_ns, split), ("measured", split, close)):
                a, b = max(s.start_ns, lo), min(s.end_ns, hi)
                if b < a or (b == a and not (s.start_ns == s.end_ns and lo < b <= hi)):
                    continue
                whole = s.end_ns - s.start_ns
                energy = s.energy_j if whole == 0 else s.energy_j * (b - a) / whole
                yield {
                    "time": utc_iso(b),
                    "start": utc_iso(a),
                    "host": host,
                    "source": s.source,
                    "component": s.component,
                    "device": s.device,
                    "quality": s.quality,
                    "window": name,
                    "in_total": int(s.component not in EXCLUDED_COMPONENTS),
                    "energy_j": energy,
                    "power_w": energy / ((b - a) / 1e9) if b > a else None,
                    "utilization": s.utilization,
                    "healthy": int(s.healthy),
                    "job_energy_j": parts.get("warmup" if name == "warmup" else "saturated", 0.0),
                }


def _quality(value: str) -> Quality | None:
    try:
        return Quality(value)
    except ValueError:  # stored as no known quality: left out of the report
        return None


def write_csv(rows: Iterable[dict[str, Any]], columns: list[str], out: IO[str]) -> int:
    """Write ``rows`` under ``columns`` (plus any ``label_*`` columns the rows carry, sorted);
    None is written as an empty cell. Returns the number of rows."""
    rows = list(rows)
    extra = sorted({k for r in rows for k in r if k not in columns})
    writer = csv.DictWriter(out, fieldnames=columns + extra, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return len(rows)
