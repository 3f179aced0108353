"""Part "ingest": collector throughput into InfluxDB, into a null sink, and into SQLite.

- **InfluxDB**: agents' batches (pre-serialized, 4 concurrent streams, ~5,000 samples each)
  through gRPC and the real ``wattline collector`` into a real ``influxd``, against the
  ceiling measured in the same run: the same points, pre-encoded as line protocol, POSTed
  straight to ``/write`` in the same chunks over 4 kept-alive connections. Runs alternate
  (ceiling, gRPC, ceiling, gRPC...) into fresh databases; medians.
- **Null sink**: the collector's gRPC server over a store that encodes each batch with the
  real :class:`LineEncoder` and discards it: points per CPU-second of the collector
  process (decode + validate + encode). Yardstick, same run: ``repr()`` of the same floats
  alone, the floor of any exact line-protocol encoder in Python.
- **SQLite**: :class:`SqliteStore` rows/s against a bare ``executemany`` of the same rows
  into the same schema, same pragmas, one transaction per batch, in the same run.
"""

from __future__ import annotations

import http.client as httpclient
import json
import threading
import time
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.collector.lineprotocol import LineEncoder
from wattline.collector.pointfields import sample_fields
from wattline.collector.stores.schema import SAMPLE_FIELD_NAMES, host_tags, sample_tags
from wattline.collector.stores.sqlite import _INSERT_ENERGY, _INSERT_SERIES, SqliteStore, _json
from wlbench.common import PYTHON, Influxd, Proc, free_port, http, median, ratio, running, start_influxd, wait_port
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
    result["sqlite"] = sqlite(batches[: max(4, len(batches) // (3 if quick else 2))], work, rounds=1 if quick else 2)
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


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# -- null sink through gRPC ----------------------------------------------------------------


def push(target: str, frames: Path, out: Path, logs: Path) -> dict[str, Any]:
    argv = [PYTHON, "-m", "wlbench.pusher", "--target", target, "--frames", str(frames)]
    proc = Proc([*argv, "--streams", str(STREAMS), "--out", str(out)], logs / f"{out.stem}.log")
    if proc.popen.wait(timeout=600) != 0:
        raise RuntimeError(f"pusher failed:\n{proc.tail()}")
    proc.stop()
    doc: dict[str, Any] = json.loads(out.read_text())
    if doc["errors"]:
        raise RuntimeError(f"pusher errors: {doc['errors'][:3]}")
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


def influx(batches: list[wire.pb.Batch], work: Path, pairs: int) -> dict[str, Any]:
    encoder = LineEncoder()
    bodies = ["\n".join(encoder.batch(b).lines).encode() for b in batches]
    points = sum(len(b.samples) for b in batches)
    frames = work / "frames.bin"
    procs: list[Proc] = []
    ceilings: list[float] = []
    grpcs: list[float] = []
    stored: list[int] = []
    with running(procs):
        influxd = start_influxd(work / "influxd")
        procs.append(influxd.proc)
        for i in range(pairs):
            ceilings.append(points / write_direct(influxd, f"ceiling{i}", bodies))
            port = free_port()
            argv = [str(Path(PYTHON).parent / "wattline"), "collector", "--listen", f"127.0.0.1:{port}"]
            argv += ["--store", influxd.url, "--influx-api", "v1", "--influx-database", f"grpc{i}"]
            collector = Proc(argv, work / f"collector-{i}.log")
            procs.append(collector)
            wait_port(port, collector)
            doc = push(f"127.0.0.1:{port}", frames, work / f"push-influx-{i}.json", work)
            grpcs.append(doc["acked"] / (doc["end"] - doc["start"]))
            collector.stop()
            stored.append(count_points(influxd, f"grpc{i}"))
    ceiling, via = median(ceilings), median(grpcs)
    return {
        "points": points,
        "ceiling_points_per_s": ceiling,
        "grpc_points_per_s": via,
        "ratio": ratio(via, ceiling),
        "runs": {"ceiling": ceilings, "grpc": grpcs},
        "stored_per_grpc_run": stored,
    }


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
