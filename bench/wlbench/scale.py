"""Part "scale": 100 and 1,000 concurrent agents at 1 Hz into one collector.

The agents are simulated by asyncio gRPC clients in a few processes (:mod:`wlbench.fleet`),
each agent with its own channel and connection and real batches (12 RAPL + NIC samples a
second, sealed and pushed every 1.5 s, the agent's default ``batch_interval``, on its own
phase, kept until acknowledged, retried for up to 60 s after the run). The collector is the
real gRPC server over the real store (SQLite, the default; also InfluxDB 1.x at 1,000 agents
in full mode, with 1 and 2 collector processes sharing the port as ``--processes`` does),
wrapped to record for every sample the delay from its timestamp (interval end) to the commit
of its batch: visible in storage. That delay includes up to 1.5 s spent waiting in the agent
for the next push, as in a real deployment.

Reported: samples sent and stored per second during the run, samples lost (acknowledged
but not stored), samples still unacknowledged 60 s after the run (real agents keep them in
their spool and retry), delay p50/p99, the collector's CPU and peak RSS, the fleet
simulator's CPU (it shares the 2 cores) and the collector's CPU per push. Yardsticks in the
same run: the SQLite store's own rate for one-batch transactions of 12 samples (in process):
without group commit, each push needs one; and (full mode) 1,000 agents into the same gRPC
server with no store behind it (``null``): what the server and its admission path cost per
push, and the delay to the acknowledgement, on these cores.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from wattline.stores.sqlite.store import SqliteStore
from wlbench.common import PYTHON, Proc, RusagePopen, free_port, running, start_influxd, wait_port
from wlbench.data import HostStream
from wlbench.fleet import AGENT_PUSH_EVERY_S

#: Collector processes sharing the port (as ``wattline collector --processes``) at 1,000
#: agents into InfluxDB.
COLLECTOR_PROCESSES = (1, 2)


def run(work: Path, quick: bool) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    duration = 10.0 if quick else 30.0
    plan = [(100, "sqlite", 1)] if quick else [(100, "sqlite", 1), (1000, "sqlite", 1)]
    plan += [(1000, "influxdb1", n) for n in ([] if quick else COLLECTOR_PROCESSES)]
    plan += [] if quick else [(1000, "null", 1)]  # yardstick: the gRPC server with no store
    result: dict[str, Any] = {"duration_s": duration, "push_every_s": AGENT_PUSH_EVERY_S}
    result["sqlite_tx_per_s"] = sqlite_tx_rate(work / "tx.db")
    procs: list[Proc] = []
    with running(procs):
        influx_url = ""
        if any(store == "influxdb1" for _, store, _ in plan):
            influxd = start_influxd(work / "influxd")
            procs.append(influxd.proc)
            influx_url = influxd.url
        sizes = {}
        for agents, store, n in plan:
            url = {"influxdb1": influx_url, "null": "null"}.get(store, f"sqlite:{work / f'fleet-{agents}.db'}")
            name = f"{agents} ({store}{f', {n} processes' if n > 1 else ''})"
            sizes[name] = size(agents, store, url, duration, work / f"n{agents}-{store}-{n}", n)
    result["sizes"] = sizes
    return result


def merge_stats(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The stats of several sink processes as one: counts added, delay percentiles from
    the merged millisecond histograms."""
    by_host: Counter[str] = Counter()
    batches = sum(doc.get("batches", 0) for doc in docs)
    per_second: Counter[str] = Counter()
    hist: Counter[int] = Counter()
    steady: Counter[int] = Counter()
    for doc in docs:
        by_host.update(doc["by_host"])
        per_second.update(doc["per_second"])
        hist.update({int(k): v for k, v in doc["delay_hist_ms"].items()})
        steady.update({int(k): v for k, v in doc.get("steady_delay_hist_ms", {}).items()})
    worst = [d["delay_ms"]["max"] for d in docs if d["delay_ms"]["max"] is not None]
    delay = {"count": hist.total(), "p50": pct(hist, 50), "p99": pct(hist, 99), "max": max(worst) if worst else None}
    return {
        "by_host": dict(by_host),
        "per_second": dict(per_second),
        "delay_ms": delay,
        "steady_delay_ms": {"count": steady.total(), "p50": pct(steady, 50), "p99": pct(steady, 99)},
        "batches": batches,
    }


def pct(hist: Counter[int], p: float) -> float | None:
    """The ``p``-th percentile of a millisecond histogram."""
    total = hist.total()
    if not total:
        return None
    rank, seen = min(total - 1, int(p / 100 * total)), 0
    for ms in sorted(hist):
        seen += hist[ms]
        if seen > rank:
            return float(ms)
    return None


def sqlite_tx_rate(path: Path, batches: int = 300) -> float:
    """One 12-sample batch per transaction, as the store commits each agent's batch."""
    store = SqliteStore(path)
    data = [HostStream(f"tx-{i}", "rapl+nic", seed=i).batch(1) for i in range(batches)]
    t = time.perf_counter()
    for b in data:
        store.write(b)
    rate = batches / (time.perf_counter() - t)
    store.close()
    return rate


def size(
    agents: int, store: str, url: str, duration: float, work: Path, sinks: int = 1, steady_after_s: float = 0.0
) -> dict[str, Any]:
    """``agents`` simulated agents into ``sinks`` collector processes sharing one port;
    ``steady_after_s``: also the delays of the samples stamped that long after the first."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    stats_files = [work / f"collector-{k}.json" for k in range(sinks)]
    procs: list[Proc] = []
    for k, stats_file in enumerate(stats_files):
        argv = [PYTHON, "-m", "wlbench.sink", "--listen", f"127.0.0.1:{port}", "--stats", str(stats_file)]
        argv += ["--store", url, "--steady-after", str(steady_after_s), *(["--reuse-port"] if sinks > 1 else [])]
        procs.append(Proc(argv, work / f"sink-{k}.log"))
    collectors = list(procs)
    processes = 1 if agents <= 100 else 4
    fleets: list[Proc] = []
    with running(procs):
        for sink in collectors:
            wait_port(port, sink)
        time.sleep(0.5 if sinks > 1 else 0.0)  # every sink listening before the first connection
        c0 = sum(sink.cpu_s() for sink in collectors)
        per = agents // processes
        outs = []
        for p in range(processes):
            out = work / f"fleet-{p}.json"
            outs.append(out)
            fleet_argv = [PYTHON, "-m", "wlbench.fleet", "--target", f"127.0.0.1:{port}", "--first", str(p * per)]
            fleet_argv += ["--agents", str(per), "--duration", str(duration), "--out", str(out)]
            fleets.append(Proc(fleet_argv, work / f"fleet-{p}.log", popen=RusagePopen))
        procs += fleets
        for proc in fleets:
            if proc.popen.wait(timeout=duration + 180) != 0:
                raise RuntimeError(f"fleet process failed:\n{proc.tail()}")
        collector_cpu = sum(sink.cpu_s() for sink in collectors) - c0
        hwm = sum(sink.hwm_mib() for sink in collectors)
        for sink in collectors:
            sink.stop()
    collector = merge_stats([json.loads(f.read_text()) for f in stats_files])
    runs = [json.loads(o.read_text()) for o in outs]
    start, end = min(r["start"] for r in runs), max(r["end"] for r in runs)
    wall = max(r["finished"] for r in runs) - start
    sent = sum(r["sent"] for r in runs)
    stored = sum(collector["by_host"].values())
    steady = range(int(start) + 2, int(end))  # whole seconds after the first pushes, before the end
    in_window = sum(n for sec, n in collector["per_second"].items() if int(sec) in steady)
    delay, steady_delay = collector["delay_ms"], collector["steady_delay_ms"]
    fleet_cpu = sum(p.popen.cpu_s() or 0.0 for p in fleets if isinstance(p.popen, RusagePopen))
    return {
        "agents": agents,
        "store": store,
        "simulator_processes": processes,
        "collector_processes": sinks,
        "sent": sent,
        "stored": stored,
        # acknowledged to an agent but not stored: lost for good (an agent keeps the rest)
        "lost": sent - stored - sum(r["unacked_samples"] for r in runs),
        "unacked_at_end": sum(r["unacked_samples"] for r in runs),
        "failed_pushes": sum(r["failed_pushes"] for r in runs),
        "failed_by_code": {
            k.removeprefix("failed_"): sum(r.get(k, 0) for r in runs)
            for k in sorted({k for r in runs for k in r if k.startswith("failed_") and k != "failed_pushes"})
        },
        "sent_per_s": agents * 12.0,  # every agent ticks its 12 channels once a second
        "stored_per_s": in_window / max(1, len(steady)),
        "delay_p50_s": delay["p50"] / 1e3 if delay["p50"] is not None else None,
        "delay_p99_s": delay["p99"] / 1e3 if delay["p99"] is not None else None,
        "delay_max_s": delay["max"] / 1e3 if delay["max"] is not None else None,
        "steady_delay_p50_s": None if steady_delay["p50"] is None else steady_delay["p50"] / 1e3,
        "steady_delay_p99_s": None if steady_delay["p99"] is None else steady_delay["p99"] / 1e3,
        "collector_cpu_s": collector_cpu,
        "collector_core_pct": collector_cpu / wall * 100,
        "collector_cpu_ms_per_push": collector_cpu * 1e3 / collector["batches"] if collector["batches"] else None,
        "simulator_core_pct": fleet_cpu / wall * 100,
        "collector_hwm_mib": hwm,
        "cores": os.cpu_count(),
        "window": [int(start), int(end)],  # wall clock (s) of the agents' first and last tick
    }
