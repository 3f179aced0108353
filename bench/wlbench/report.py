"""Part "report": ``build_report`` latency against job length, InfluxDB 1.x and SQLite.

Per store, ONE database holds every job, so a report shares the store with everything else
(as in production) and flatness is honest: the jobs measured (full: 1 h and 24 h; quick:
10 min and 1 h, one after the other) on 16 hosts sampled at 1 Hz (package and DRAM of
socket 0: 2 series per host, constant 100 W and 20 W, so the truth is known) from 2 minutes
before each job to 1 minute after, each with its events: open, a ``saturated`` phase mark at
5 % of the job, close; plus unrelated jobs (``OTHER_JOBS`` of 10 min on the same hosts, before
the measured ones, and as many on other hosts) with one UNITS event per host per minute.
Then again with one UNITS event per host per minute added to the measured jobs. Data is
written fast: line protocol straight to ``/write`` for InfluxDB, the store's own INSERT in
large transactions for SQLite (job events through the store). After each bulk write the run
waits for influxd to go idle (its compactions would slow whatever runs next). Latency: first
call (cold) and the median of ``WARM_CALLS`` more, the jobs' calls alternating (one slow call, a
collection or a compaction, must not move it); the report's energy is checked against the truth.

InfluxDB's floor (``units_floor``, same run, same data): what the store's read of a job's UNITS
events costs against influxd alone returning the rows, and against the cheapest queries that
could replace it: one aggregate function over a GROUP BY time() grid (it still visits every
row), the five an exact per-span reduction would need, and one statement per cut.
"""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from wattline import wire
from wattline.accounting.saturation import SaturationParams, grid_bins
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.reports.build import build_report
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.reader import UnitCuts
from wattline.stores.sqlite.store import _INSERT_ENERGY, _INSERT_SERIES, SqliteStore
from wlbench.common import Influxd, Proc, http, running, start_influxd, wait_idle
from wlbench.data import T0_NS

HOSTS = 16
NS = 10**9
SERIES = (("cpu_package", "package-0", 100.0), ("dram", "package-0/dram", 20.0))
BEFORE_S, AFTER_S = 120, 60
UNITS_EVERY_S = 60
#: Unrelated jobs in the same store: this many on the measured jobs' hosts (before them) and
#: as many on other hosts; 10 minutes each, with their UNITS events.
OTHER_JOBS, OTHER_S = 20, 600
DATABASE = "report"
#: Calls after the cold one; the figure is their median.
WARM_CALLS = 7


def run(work: Path, quick: bool) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    lengths = {"10min": 600, "1h": 3600} if quick else {"1h": 3600, "24h": 86400}
    shortest, longest = min(lengths, key=lengths.__getitem__), max(lengths, key=lengths.__getitem__)
    # the unrelated jobs first, then each measured job after the previous one (2 min apart)
    others_s = OTHER_JOBS * (OTHER_S + 60)
    starts, t = {}, T0_NS + others_s * NS
    for label, seconds in lengths.items():
        starts[label] = t
        t += (BEFORE_S + seconds + AFTER_S) * NS
    result: dict[str, Any] = {
        "hosts": HOSTS,
        "series_per_host": len(SERIES),
        "lengths_s": lengths,
        "other_jobs": 2 * OTHER_JOBS,
        "one_database": True,
        "stores": {},
    }
    procs: list[Proc] = []
    with running(procs):
        influxd = start_influxd(work / "influxd")
        procs.append(influxd.proc)
        for store_name in ("influxdb1", "sqlite"):
            latency: dict[str, dict[str, float]] = {"marks only": {}, "units every 60 s": {}}
            detail: dict[str, Any] = {label: {} for label in lengths}
            store = open_store(store_name, influxd, work)
            _builder.cache_clear()  # each store's jobs from processes of their own
            t0 = time.monotonic()
            for batch in other_jobs():
                store.write(batch)
            for label, seconds in lengths.items():
                t = time.monotonic()
                fill(store, influxd, starts[label], seconds)
                for batch in job_events(f"bench-{label}", starts[label], seconds):
                    store.write(batch)
                detail[label]["load_s"] = time.monotonic() - t
                detail[label]["points"] = HOSTS * len(SERIES) * (seconds + BEFORE_S + AFTER_S)
            result.setdefault("load_s", {})[store_name] = time.monotonic() - t0
            for variant, units in (("marks only", False), ("units every 60 s", True)):
                if units:
                    for label, seconds in lengths.items():
                        for batch in job_events(f"bench-{label}", starts[label], seconds, units_only=True):
                            store.write(batch)
                detail["settle_s"] = wait_idle(influxd.proc)
                timed = timed_reports(store, lengths)
                for label, seconds in lengths.items():
                    timings, error = timed[label]
                    latency[variant][label] = statistics.median(timings[1:])
                    detail[label][variant] = {"cold_s": timings[0], "runs_s": timings[1:], "energy_error": error}
                    if units and isinstance(store, InfluxV1Store):
                        floor = units_floor(store, influxd, f"bench-{label}", starts[label], seconds)
                        detail[label]["units_floor_s"] = floor
            store.close()
            result["stores"][store_name] = {
                "latency_s": latency,
                # latency of the longest job over that of the shortest
                "flatness": {v: d[longest] / d[shortest] for v, d in latency.items()},
                "detail": detail,
            }
    return result


def timed_reports(store: Any, lengths: dict[str, int]) -> dict[str, tuple[list[float], float]]:
    """Per job (``bench-LABEL``): its cold call's latency, then WARM_CALLS more, and its energy's
    relative error against the truth. The jobs' warm calls alternate (each round in the other
    order), so a slow spell of the store's (a compaction, a cache snapshot) falls on every job
    alike and the ratio compares like with like."""
    labels = list(lengths)
    timings: dict[str, list[float]] = {label: [] for label in labels}
    reports = {}
    for k in range(1 + WARM_CALLS):
        for label in labels if k % 2 == 0 else reversed(labels):
            t = time.perf_counter()
            reports[label] = build_report(store, f"bench-{label}")
            timings[label].append(time.perf_counter() - t)
    out = {}
    for label, seconds in lengths.items():
        truth = HOSTS * sum(w for _, _, w in SERIES) * seconds
        total = reports[label].warmup.energy_j + reports[label].saturated_window.energy_j
        out[label] = (timings[label], abs(total - truth) / truth)
    return out


def units_floor(store: InfluxV1Store, influxd: Influxd, job_id: str, open_ns: int, seconds: int) -> dict[str, float]:
    """Median of WARM_CALLS timings each: the store's UNITS read at the report's cuts (the grid
    and the saturation mark); influxd alone answering the rows it reads (the HTTP answer, not
    decoded); and queries that visit the rows inside influxd instead: one function over the
    grid, the five an exact reduction needs (a span's units from ``units_total``, its first
    and last instants, the first event's units), one ``last()`` statement per cut."""
    end_ns = open_ns + seconds * NS
    bins = grid_bins(open_ns, end_ns, SaturationParams())
    cuts = UnitCuts(open_ns, end_ns, bins, (open_ns, open_ns + seconds * NS // 20))
    step = (end_ns - open_ns) // bins
    where = f"FROM job_events WHERE job_id = '{job_id}' AND event = 'units'"
    grid = f"AND time >= {open_ns} AND time < {end_ns} GROUP BY time({step}ns, {open_ns % step}ns), host, seq_block"
    queries = {
        "influxd_rows_s": f"SELECT units, time_ns {where} GROUP BY host, seq_block",
        "influxd_one_function_s": f"SELECT sum(units) {where} {grid}",
        "influxd_exact_functions_s": (
            f"SELECT last(units_total), min(time_ns), max(time_ns), first(units), first(time_ns) {where} {grid}"
        ),
        "influxd_statement_per_cut_s": "; ".join(
            f"SELECT last(units_total) {where} AND time < {t - t % 10**6} GROUP BY host, seq_block"
            for t in cuts.instants
        ),
    }

    def median_s(call: Any) -> float:
        timings = []
        for _ in range(WARM_CALLS):
            t = time.perf_counter()
            call()
            timings.append(time.perf_counter() - t)
        return statistics.median(timings)

    def answer(influxql: str) -> None:
        status, body = http("POST", f"{influxd.url}/query?db={DATABASE}&epoch=ns", f"q={quote(influxql)}".encode())
        if status != 200 or b'"error"' in body:
            raise RuntimeError(f"influxd answered {status}: {body[:200]!r}")

    out = {"store_units_read_s": median_s(lambda: store.unit_events(job_id, cuts)), "cuts": float(len(cuts.instants))}
    for name, influxql in queries.items():
        out[name] = median_s(functools.partial(answer, influxql))
    return out


def job_events(
    job_id: str, open_ns: int, seconds: int, units_only: bool = False, hosts: int = HOSTS, host_prefix: str = "host"
) -> list[wire.pb.Batch]:
    """Per host: open, the saturation mark and close; or (``units_only``) the UNITS events;
    each host's events from one builder, as one process of a job writes them."""
    batches = []
    for h in range(hosts):
        builder = _builder(job_id, f"{host_prefix}-{h:02d}")
        batch = wire.Batch(stream_id=f"events-{job_id}-{h}", seq=2 if units_only else 1)
        batch.host.host_id = f"{host_prefix}-{h:02d}"
        if units_only:
            units = range(UNITS_EVERY_S, seconds, UNITS_EVERY_S)
            batch.job_events.extend(builder.units(600.0, open_ns + k * NS) for k in units)
        else:
            marks = [builder.open(open_ns), builder.phase("saturated", open_ns + seconds * NS // 20)]
            batch.job_events.extend([*marks, builder.close(0, open_ns + seconds * NS)])
        batches.append(batch)
    return batches


@functools.cache
def _builder(job_id: str, host: str) -> EventBuilder:
    """The one process of ``job_id`` on ``host``: it numbers the job's events there."""
    return EventBuilder(JobSpec(job_id, job_id, "training", "sequences", {"suite": "bench"}))


def other_jobs() -> list[wire.pb.Batch]:
    """The unrelated jobs: OTHER_JOBS on the measured hosts (before the measured jobs) and as many
    at the same times on other hosts, with their UNITS events."""
    batches = []
    for k in range(OTHER_JOBS):
        open_ns = T0_NS + k * (OTHER_S + 60) * NS
        for prefix in ("host", "other"):
            job_id = f"other-{prefix}-{k}"
            batches += job_events(job_id, open_ns, OTHER_S, host_prefix=prefix)
            batches += job_events(job_id, open_ns, OTHER_S, units_only=True, host_prefix=prefix)
    return batches


def open_store(store_name: str, influxd: Influxd, work: Path) -> InfluxV1Store | SqliteStore:
    if store_name == "influxdb1":
        store = InfluxV1Store(influxd.url, DATABASE)
        store.create_database()
        return store
    return SqliteStore(work / f"{DATABASE}.db")


def fill(store: InfluxV1Store | SqliteStore, influxd: Influxd, open_ns: int, seconds: int) -> None:
    """Energy samples of every host from BEFORE_S before ``open_ns`` to AFTER_S after the job's end."""
    t0 = open_ns - BEFORE_S * NS
    total_s = BEFORE_S + seconds + AFTER_S
    if isinstance(store, InfluxV1Store):
        for h in range(HOSTS):
            lines: list[str] = []
            for component, device, watts in SERIES:
                prefix = f"energy,component={component},device={device},host=host-{h:02d},quality=counter,source=rapl "
                for k in range(1, total_s + 1):
                    end = t0 + k * NS
                    lines.append(
                        f"{prefix}energy_j={watts},power_w={watts},cumulative_j={watts * k},interval_s=1.0,"
                        f'start_ns={end - NS}i,healthy=true,stream="s-{h}-{t0}" {end}'
                    )
            for i in range(0, len(lines), 50_000):
                status, body = http(
                    "POST",
                    f"{influxd.url}/write?db={DATABASE}&precision=ns",
                    "\n".join(lines[i : i + 50_000]).encode(),
                    120,
                )
                if status != 204:
                    raise RuntimeError(f"/write answered {status}: {body[:200]!r}")
        return
    conn = store._db
    for h in range(HOSTS):
        host = f"host-{h:02d}"
        rows = [
            (
                *(host, "rapl", component, device, "counter", "{}", t0 + k * NS, t0 + (k - 1) * NS),
                *(watts, watts, watts * k, 1.0, None, 1, "", None, f"s-{h}-{t0}", "{}"),
            )
            for component, device, watts in SERIES
            for k in range(1, total_s + 1)
        ]
        conn.execute("BEGIN")
        conn.executemany(_INSERT_ENERGY, rows)
        conn.executemany(_INSERT_SERIES, sorted({r[:5] for r in rows}))
        conn.execute("COMMIT")
