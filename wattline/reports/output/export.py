"""Reports and samples as CSV rows: one row per job (joinable with a scheduler's accounting)
and one row per sample of a job.

Job rows take their figures from the report JSON (:func:`wattline.reports.report_json.report_json`), so every
energy column is the figure ``wattline report --json`` prints. Sample rows are the job's
samples on each of its hosts, cut at the host's window and at the saturation point (the
energy of a sample straddling an edge is apportioned by overlap, as the report does), and
``job_energy_j`` is what the report charged the job for it (the host split between jobs, and
by CPU time, by the report's rule): summing ``job_energy_j`` over the rows of ``window`` =
``measured`` (the saturated window; the value kept for old readers) gives the report's
saturated-window energy, ``energy_j`` the host's. A stretch between samples the report read
without one is a row too, flagged in ``origin``: ``bridged`` (samples of one agent stream the
store lacks, their energy from its running total, as the report counts it) or ``gap`` (nothing
to bridge it: 0 J, unhealthy, held by the report's ``gaps`` bound).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from wattline.accounting.window_bounds import uncovered
from wattline.jobs.jobs_view import utc_iso
from wattline.quality import Quality
from wattline.reports.channels import EXCLUDED_COMPONENTS, merge_series
from wattline.reports.host_energy import sample_parts
from wattline.reports.model import Report
from wattline.reports.report_json import report_json
from wattline.reports.timeline import host_span
from wattline.stores.reader import Reader, StoredSample

QUALITIES = tuple(q.value for q in Quality)

JOB_COLUMNS = [
    "job_id", "name", "kind", "unit", "hosts", "start", "end", "status", "exit_code", "saturated", "saturated_at",
    "duration_s", "warmup_s", "measured_s", "units_total", "units_measured", "energy_measured_j", "energy_total_j",
    "j_per_unit", "kwh_per_million_units", "cost_usd_per_run", "co2_g_per_run",
    *(f"share_{q}" for q in QUALITIES), "complete", "error", "saturated_s", "units_saturated", "energy_saturated_j",
    *(f"fraction_{q}" for q in QUALITIES),
]  # fmt: skip
#: Deprecated job columns (the saturated window was called "measured", a fraction "share"),
#: kept for old readers.
DEPRECATED_JOB_COLUMNS = {
    "measured_s": "saturated_s",
    "units_measured": "units_saturated",
    "energy_measured_j": "energy_saturated_j",
    **{f"share_{q}": f"fraction_{q}" for q in QUALITIES},
}

SAMPLE_COLUMNS = [
    "time", "start", "host", "source", "component", "device", "quality", "window", "in_total",
    "energy_j", "power_w", "utilization", "healthy", "job_energy_j", "origin",
]  # fmt: skip


def job_row(report: Report) -> dict[str, Any]:
    """One CSV row of a job: the report's figures (energy of the saturated window and of the
    whole run), its quality fractions and its labels (``label_KEY`` columns)."""
    data = report_json(report)
    job, sat, fractions = data["job"], data["saturated"], data["saturated"]["coverage"]["fractions"]
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
        **{f"fraction_{q}": fractions.get(q, 0.0) for q in QUALITIES},
    }
    row.update({old: row[new] for old, new in DEPRECATED_JOB_COLUMNS.items()})
    row.update({f"label_{k}": v for k, v in sorted(job["labels"].items())})
    return row


@dataclass(frozen=True, slots=True)
class _Piece:
    """A row's source before it is cut at the windows: a stored sample, a stretch the store
    lacks bridged by its stream's counter, or a gap (no sample, no counter to bridge it)."""

    series: tuple[str, str, str, str, str]  #: host, source, component, device, quality
    start_ns: int
    end_ns: int
    energy_j: float
    origin: str  #: stored | bridged | gap
    stream: str = ""
    healthy: bool = True
    utilization: float | None = None


def _pieces(reader: Reader, host: str, open_ns: int, close_ns: int) -> list[_Piece]:
    """The host's samples in its window, and per series what the report reads between them:
    stretches the store lacks bridged by the counter, and gaps (:func:`uncovered`)."""
    stored = reader.samples(host, open_ns, close_ns)
    (before, _), (_, after) = reader.around(host, (open_ns, close_ns))
    grouped: dict[tuple[str, str, str, str, str], list[StoredSample]] = defaultdict(list)
    for s in [*before, *stored, *(s for s in after if s.start_ns >= close_ns)]:
        grouped[s.series].append(s)
    out = [
        _Piece(s.series, s.start_ns, s.end_ns, s.energy_j, "stored", s.stream, s.healthy, s.utilization) for s in stored
    ]
    for key, raw in grouped.items():
        merged = merge_series(raw).intervals
        out += [
            _Piece(key, iv.start_ns, iv.end_ns, iv.energy_j, "bridged")
            for iv in merged
            if iv.bridged and iv.start_ns < close_ns and iv.end_ns > open_ns
        ]
        out += [_Piece(key, a, b, 0.0, "gap", healthy=False) for a, b in uncovered(raw, merged, open_ns, close_ns)]
    # Samples ending at one instant come in the store's own order (SQLite: insertion, InfluxDB
    # and VictoriaMetrics: series); channel order makes the CSV the same from any.
    return sorted(out, key=lambda p: (p.end_ns, p.series, p.stream, p.origin, p.start_ns))


def sample_rows(reader: Reader, report: Report) -> Iterator[dict[str, Any]]:
    """The job's samples, host by host (by end, then channel), cut at the window edges and the
    saturation point, each with the job's part of it; and the stretches between them the report
    read as bridged by the counter or as gaps, flagged in ``origin``."""
    job = report.job
    charged = sample_parts(reader, report)
    for host in sorted(job.hosts):
        open_ns, close = host_span(report, host)
        split = min(max(report.saturated_from_ns, open_ns), close)
        for s in _pieces(reader, host, open_ns, close):
            _host, source, component, device, stored_quality = s.series
            quality = _quality(stored_quality)
            parts = charged.get((host, component, device, quality, s.start_ns, s.end_ns), {}) if quality else {}
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
                    "source": source,
                    "component": component,
                    "device": device,
                    "quality": stored_quality,
                    "window": name,
                    "in_total": int(component not in EXCLUDED_COMPONENTS),
                    "energy_j": energy,
                    "power_w": energy / ((b - a) / 1e9) if b > a and s.origin != "gap" else None,
                    "utilization": s.utilization,
                    "healthy": int(s.healthy),
                    "job_energy_j": parts.get("warmup" if name == "warmup" else "saturated", 0.0),
                    "origin": s.origin,
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
