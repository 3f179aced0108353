"""Part "ingest": collector throughput into InfluxDB, a null sink, SQLite, and through the replay log.

- **InfluxDB**: agents' batches (pre-serialized, 4 concurrent streams on 4 connections,
  ~5,000 samples each) through gRPC and the real ``wattline collector`` (``--processes`` 1
  and 2) into a real ``influxd``, against the ceiling measured in the same run: the same
  points, pre-encoded as line protocol, POSTed straight to ``/write`` in the same chunks
  over 4 kept-alive connections. Runs alternate (ceiling, 1 process, 2 processes, ...)
  into fresh databases; medians. CPU per point of every party (influxd, the /write
  client, the collector's processes, the pusher) gives the floor: the ratio the cores
  allow when the collector's work shares them with influxd.
- **Null sink**: the collector's gRPC server over a store that encodes each batch with the
  real :class:`LineEncoder` and discards it: points per CPU-second of the collector
  process (decode + validate + encode). Yardstick, same run: ``repr()`` of the same floats
  alone, the floor of any exact line-protocol encoder in Python.
- **SQLite**: :class:`SqliteStore` rows/s against a bare ``executemany`` of the same rows
  into the same schema, same pragmas, one transaction per batch, in the same run.
- **Replay log**: group commits to a real VictoriaMetrics through the collector's replay
  log against the same commits straight to it, rounds alternating, one server.
"""

from __future__ import annotations

import http.client as httpclient
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.collector.replay import Replaying, ReplayLog
from wattline.collector.validation import drop_invalid_points, validate
from wattline.stores.base import Store
from wattline.stores.lineprotocol import LineEncoder
from wattline.stores.pointfields import sample_fields
from wattline.stores.schema import SAMPLE_FIELD_NAMES, host_tags, sample_tags
from wattline.stores.sqlite.store import _INSERT_ENERGY, _INSERT_SERIES, SqliteStore, _json
from wattline.stores.victoria.store import VictoriaStore
from wlbench.common import (
    PYTHON,
    Influxd,
    Proc,
    RusagePopen,
    cpu_s,
    free_port,
    http,
    median,
    ratio,
    running,
    start_influxd,
    start_victoria_metrics,
    wait_port,
)
from wlbench.data import fleet_batches, write_frames

STREAMS = 4


def run(work: Path, quick: bool) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    points = 40_000 if quick else 300_000
    batches = fleet_batches(hosts=16, points=points)
    result: dict[str, Any] = {"points_per_run": sum(len(b.samples) for b in batches), "streams": STREAMS}
    result["encoder"] = encoder_bench(batches[:8], rounds=5 if quick else 15)
    result["null_sink"] = null_sink(batches, work)
    result["null_sink"]["repr_floor_per_s"] = result["encoder"]["repr_floor_samples_per_s"]
    result["null_sink"]["vs_repr_floor"] = ratio(
        result["null_sink"]["points_per_cpu_s"], result["encoder"]["repr_floor_samples_per_s"]
    )
    result["influx"] = influx(batches, work, pairs=1 if quick else 3)
    result["influx"]["steps_us_per_point"] = collector_steps(batches[:8], rounds=3 if quick else 7)
    result["sqlite"] = sqlite(batches[: max(4, len(batches) // (3 if quick else 2))], work, rounds=1 if quick else 2)
    result["replay_log"] = replay_log(batches, work / "replay", rounds=1 if quick else 3)
    return result


# -- encoder, in process -----------------------------------------------------------------


def encoder_bench(batches: list[wire.pb.Batch], rounds: int) -> dict[str, Any]:
    encoder = LineEncoder()
    for b in batches:
        encoder.batch(b)  # series prefixes and field keys cached, as in steady state
    samples = sum(len(b.samples) for b in batches)
    best = min(_timed(lambda: [encoder.batch(b) for b in batches]) for _ in range(rounds))
    floats = [
        v
        for b in batches
        for s in b.samples
        for v in (s.energy_j, s.power_w, s.cumulative_j, (s.end_ns - s.start_ns) / 1e9, *s.gauges.values())
    ] + [s.utilization for b in batches for s in b.samples if s.HasField("utilization")]
    floor = min(_timed(lambda: [repr(x) for x in floats]) for _ in range(rounds))
    return {
        "samples": samples,
        "samples_per_s": samples / best,
        "floats_per_sample": len(floats) / samples,
        "repr_floor_samples_per_s": samples / floor,
        "vs_repr_floor": floor / best,
    }


def collector_steps(batches: list[wire.pb.Batch], rounds: int) -> dict[str, float]:
    """CPU per point of each step a collector process takes in Python, run bare in a loop
    (best of ``rounds``): decode the bytes, validate, encode line protocol, build the
    request body. The rest of its CPU per point (the run's figure) is gRPC, HTTP and threads."""
    datas = [b.SerializeToString() for b in batches]
    points = sum(len(b.samples) for b in batches)
    decoded = [wire.Batch.FromString(d) for d in datas]
    encoder = LineEncoder()
    lines = [encoder.batch(b).lines for b in decoded]

    def validate_all() -> None:
        for b in decoded:
            validate(b)
            drop_invalid_points(b)

    steps = {
        "decode": lambda: [wire.Batch.FromString(d) for d in datas],
        "validate": validate_all,
        "encode": lambda: [encoder.batch(b) for b in decoded],
        "body": lambda: ["\n".join(chunk).encode() for chunk in lines],
    }
    return {name: min(_timed(fn) for _ in range(rounds)) / points * 1e6 for name, fn in steps.items()}


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# -- null sink through gRPC ----------------------------------------------------------------


def push(target: str, frames: Path, out: Path, logs: Path) -> dict[str, Any]:
    """Push ``frames`` with STREAMS connections; the pusher's JSON, plus its CPU seconds."""
    argv = [PYTHON, "-m", "wlbench.pusher", "--target", target, "--frames", str(frames)]
    proc = Proc([*argv, "--streams", str(STREAMS), "--out", str(out)], logs / f"{out.stem}.log", popen=RusagePopen)
    if proc.popen.wait(timeout=600) != 0:
        raise RuntimeError(f"pusher failed:\n{proc.tail()}")
    proc.stop()
    doc: dict[str, Any] = json.loads(out.read_text())
    if doc["errors"]:
        raise RuntimeError(f"pusher errors: {doc['errors'][:3]}")
    doc["cpu_s"] = proc.popen.cpu_s() if isinstance(proc.popen, RusagePopen) else None
    return doc


def null_sink(batches: list[wire.pb.Batch], work: Path) -> dict[str, Any]:
    frames = work / "frames.bin"
    write_frames(frames, [b.SerializeToString() for b in batches])
    port = free_port()
    argv = [PYTHON, "-m", "wlbench.sink", "--listen", f"127.0.0.1:{port}", "--stats", str(work / "null.json")]
    sink = Proc([*argv, "--store", "encode"], work / "sink-encode.log")
    with running([sink]):
        wait_port(port, sink)
        time.sleep(1.0)
        c0 = sink.cpu_s()
        doc = push(f"127.0.0.1:{port}", frames, work / "push-null.json", work)
        c1 = sink.cpu_s()
    cpu = c1 - c0
    return {
        "points": doc["acked"],
        "collector_cpu_s": cpu,
        "wall_s": doc["end"] - doc["start"],
        "points_per_cpu_s": doc["acked"] / cpu if cpu else None,
    }


# -- InfluxDB --------------------------------------------------------------------------------


def write_direct(influxd: Influxd, db: str, bodies: list[bytes]) -> float:
    """POST every body to /write over STREAMS kept-alive connections; wall seconds."""
    http("POST", f"{influxd.url}/query?q=CREATE+DATABASE+{db}")
    host, port = influxd.url.removeprefix("http://").split(":")
    errors: list[str] = []

    def worker(k: int) -> None:
        conn = httpclient.HTTPConnection(host, int(port), timeout=120)
        for body in bodies[k::STREAMS]:
            conn.request("POST", f"/write?db={db}&precision=ns", body=body)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 204:
                errors.append(f"{resp.status}")
        conn.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(STREAMS)]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.monotonic() - t
    if errors:
        raise RuntimeError(f"/write answered {errors[:3]}")
    return wall


def count_points(influxd: Influxd, db: str) -> int:
    rows = influxd.query("SELECT count(energy_j) FROM energy", db)
    return int(rows[0]["count"]) if rows else 0


#: Collector processes (``--processes``) measured against the same ceiling.
PROCESSES = (1, 2)


def influx(batches: list[wire.pb.Batch], work: Path, pairs: int) -> dict[str, Any]:
    """Ceiling, then the collector with each of PROCESSES, alternating, each into a fresh
    database; CPU per point of each party (influxd, the /write client, the collector's
    processes, the pusher) to show what caps the ratio when they share the cores."""
    encoder = LineEncoder()
    bodies = ["\n".join(encoder.batch(b).lines).encode() for b in batches]
    points = sum(len(b.samples) for b in batches)
    frames = work / "frames.bin"
    procs: list[Proc] = []
    rates: dict[str, list[float]] = {"ceiling": [], **{f"grpc_{n}": [] for n in PROCESSES}}
    cpu: dict[str, list[dict[str, float]]] = {k: [] for k in rates}
    stored: dict[str, list[int]] = {f"grpc_{n}": [] for n in PROCESSES}
    with running(procs):
        influxd = start_influxd(work / "influxd")
        procs.append(influxd.proc)
        for i in range(pairs):
            i0, c0 = influxd.proc.cpu_s(), time.process_time()
            rates["ceiling"].append(points / write_direct(influxd, f"ceiling{i}", bodies))
            us = 1e6 / points
            cpu["ceiling"].append(
                {"influxd": (influxd.proc.cpu_s() - i0) * us, "client": (time.process_time() - c0) * us}
            )
            for n in PROCESSES:
                key = f"grpc_{n}"
                rate, parts = via_collector(influxd, n, frames, work, f"{key}_{i}")
                rates[key].append(rate)
                cpu[key].append({k: v * us for k, v in parts.items()})
                stored[key].append(count_points(influxd, f"{key}_{i}"))
    m = {k: median(v) for k, v in rates.items()}
    result: dict[str, Any] = {
        "points": points,
        "ceiling_points_per_s": m["ceiling"],
        "runs": rates,
        "cpu_us_per_point": {k: {p: median([c[p] for c in v]) for p in v[0]} for k, v in cpu.items()},
        "stored_per_grpc_run": stored,
        "cores": len(os.sched_getaffinity(0)),
    }
    for n in PROCESSES:
        result[f"grpc_{n}_points_per_s"] = m[f"grpc_{n}"]
        result[f"ratio_{n}"] = ratio(m[f"grpc_{n}"], m["ceiling"])
        result[f"floor_{n}"] = cpu_floor(result["cpu_us_per_point"][f"grpc_{n}"], m["ceiling"], result["cores"])
    best = max(PROCESSES, key=lambda n: result[f"ratio_{n}"] or 0.0)
    result.update(processes=best, grpc_points_per_s=m[f"grpc_{best}"], ratio=result[f"ratio_{best}"])
    return result


def cpu_floor(cpu: dict[str, float], ceiling: float | None, cores: int) -> float | None:
    """The best ratio the cores allow the collector path: ``cores`` CPU-seconds a second
    over its CPU per point (influxd + the collector's processes + the pusher, all on these
    cores), against the ceiling; 1 when the cores are not what limits it."""
    via = sum(cpu.values())
    if not via or not ceiling:
        return None
    return min(1.0, cores / (via / 1e6) / ceiling)


def via_collector(influxd: Influxd, n: int, frames: Path, work: Path, db: str) -> tuple[float, dict[str, float]]:
    """Push ``frames`` through ``wattline collector --processes n`` into ``db``: points/s,
    and CPU seconds of influxd, the collector (all its processes) and the pusher."""
    port = free_port()
    argv = [str(Path(PYTHON).parent / "wattline"), "collector", "--listen", f"127.0.0.1:{port}"]
    argv += ["--store", influxd.url, "--influx-api", "v1", "--influx-database", db, "--processes", str(n)]
    collector = Proc(argv, work / f"collector-{db}.log")
    try:
        wait_port(port, collector)
        ready = "collector listening on" if n == 1 else f"collector: {n} processes on port"
        deadline = time.monotonic() + 60
        while ready not in collector.tail(20_000) and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = [collector.pid, *descendants(collector.pid)]
        i0, c0 = influxd.proc.cpu_s(), sum(cpu_s(p) for p in tree)
        doc = push(f"127.0.0.1:{port}", frames, work / f"push-{db}.json", work)
        parts = {
            "influxd": influxd.proc.cpu_s() - i0,
            "collector": sum(cpu_s(p) for p in tree) - c0,
            "pusher": doc["cpu_s"] or 0.0,
        }
    finally:
        collector.stop()
    return doc["acked"] / (doc["end"] - doc["start"]), parts


def descendants(pid: int) -> list[int]:
    """Child processes of ``pid``, recursively (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *descendants(int(child))]
    return found


# -- SQLite ------------------------------------------------------------------------------------


def energy_rows(batch: wire.pb.Batch) -> list[tuple[Any, ...]]:
    """The 18 columns SqliteStore writes per sample (built here once, outside the timing)."""
    host = host_tags(batch)
    labels = _json({k: v for k, v in host.items() if k != "host"})
    rows = []
    for s in batch.samples:
        tags, fields = sample_tags(s), sample_fields(s, batch.stream_id)
        gauges = _json({k: v for k, v in fields.items() if k not in SAMPLE_FIELD_NAMES})
        rows.append(
            (
                *(host["host"], tags["source"], tags["component"], tags["device"], tags["quality"], labels),
                *(s.end_ns, s.start_ns, s.energy_j, s.power_w, s.cumulative_j, fields["interval_s"]),
                *(fields.get("utilization"), int(s.healthy), s.status, fields.get("energy_error_j")),
                *(batch.stream_id, gauges),
            )
        )
    return rows


GROUP = 4  # batches per group commit in the grouped figure (what a busy collector merges)


def sqlite(batches: list[wire.pb.Batch], work: Path, rounds: int) -> dict[str, Any]:
    """Rows/s of SqliteStore against bare ``executemany`` with the same commits: one
    transaction per batch (``write``), then one per group of ``GROUP`` (``write_group``)."""
    rows = [energy_rows(b) for b in batches]
    n = sum(len(r) for r in rows)
    groups = [batches[i : i + GROUP] for i in range(0, len(batches), GROUP)]
    row_groups = [[r for b in rows[i : i + GROUP] for r in b] for i in range(0, len(rows), GROUP)]
    rates: dict[str, list[float]] = {"store": [], "bare": [], "store_grouped": [], "bare_grouped": []}
    for i in range(rounds):
        for grouped in (False, True):
            suffix = "_grouped" if grouped else ""
            store = SqliteStore(work / f"store{suffix}-{i}.db")
            t = time.perf_counter()
            if grouped:
                for g in groups:
                    store.write_group(g)
            else:
                for b in batches:
                    store.write(b)
            rates["store" + suffix].append(n / (time.perf_counter() - t))
            store.close()
            bare = SqliteStore(work / f"bare{suffix}-{i}.db")  # the same schema and pragmas
            db = bare._db
            t = time.perf_counter()
            for commit_rows in row_groups if grouped else rows:
                db.execute("BEGIN")
                db.executemany(_INSERT_ENERGY, commit_rows)
                db.executemany(_INSERT_SERIES, sorted({r[:5] for r in commit_rows}))
                db.execute("COMMIT")
            rates["bare" + suffix].append(n / (time.perf_counter() - t))
            bare.close()
    m = {k: median(v) for k, v in rates.items()}
    return {
        "rows": n,
        "batches": len(batches),
        "group_size": GROUP,
        "store_rows_per_s": m["store"],
        "bare_rows_per_s": m["bare"],
        "ratio": ratio(m["store"], m["bare"]),
        "grouped_store_rows_per_s": m["store_grouped"],
        "grouped_bare_rows_per_s": m["bare_grouped"],
        "grouped_ratio": ratio(m["store_grouped"], m["bare_grouped"]),
    }


# -- the replay log's cost, in process ---------------------------------------------------------

REPLAY_GROUP = 8  # batches per group commit


def replay_log(batches: list[wire.pb.Batch], work: Path, rounds: int) -> dict[str, Any]:
    """Points/s and CPU per point of group commits to VictoriaMetrics through the collector's
    replay log (:class:`~wattline.collector.replay.Replaying`, its thread fsyncing each second)
    and straight to the store, rounds alternating, one server; ratio with / without."""
    work.mkdir(parents=True, exist_ok=True)
    groups = [batches[i : i + REPLAY_GROUP] for i in range(0, len(batches), REPLAY_GROUP)]
    n = sum(len(b.samples) for b in batches)
    rates: dict[str, list[float]] = {"with": [], "without": []}
    cpu: dict[str, list[float]] = {"with": [], "without": []}
    procs: list[Proc] = []
    with running(procs):
        victoria = start_victoria_metrics(work / "victoria-metrics")
        procs.append(victoria.proc)
        for i in range(rounds):
            for kind in ("without", "with"):
                store: Store = VictoriaStore(victoria.url)
                if kind == "with":
                    store = Replaying(store, ReplayLog(work / f"log-{i}", store.durable_after_s, 1 << 30))
                t, c = time.perf_counter(), time.process_time()
                for g in groups:
                    store.write_group(g)
                rates[kind].append(n / (time.perf_counter() - t))
                cpu[kind].append((time.process_time() - c) / n * 1e6)
                store.close()
    m = {k: median(v) for k, v in rates.items()}
    return {
        "points": n,
        "group_batches": REPLAY_GROUP,
        "with_points_per_s": m["with"],
        "without_points_per_s": m["without"],
        "ratio": ratio(m["with"], m["without"]),
        "with_cpu_us_per_point": median(cpu["with"]),
        "without_cpu_us_per_point": median(cpu["without"]),
    }
