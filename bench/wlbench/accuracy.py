"""Part "accuracy": window energy of reports against exactly known power, and RAPL joules against node_exporter.

**Reports.** Synthetic hosts (tests/helpers/pipeline.py: a RAPL sysfs tree whose counters advance by a
known constant power on a synthetic clock, sampled by the real sampler) with package and DRAM
zones, counters that wrap during the job, sampling steps that do not divide the job, and job
edges in the middle of samples. Their batches go through the real stores (SQLite; InfluxDB
1.x when influxd is installed); the report's warm-up + measured energy is compared with
power x window length. Worst relative error over every case is reported.

**node_exporter.** The same RAPL tree is read by node_exporter (``node_rapl_*_joules_total``)
and by the agent's sampler before and after the counters advance (one zone across its wrap).
Zones are matched by path (node_exporter names ``intel-rapl:a`` index 10 and subzones index 0).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pipeline import T0_NS, SyntheticHost, ZoneSpec
from sysfs_trees import INTEL_RANGE_UJ, Zone, powercap_tree, set_energy

from wattline import wire
from wattline.agent import registry
from wattline.agent.clock import StampClock
from wattline.agent.sampler import Sampler
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.reports.build import build_report
from wattline.stores.base import Store
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.sqlite.store import SqliteStore
from wlbench.common import Proc, binary, free_port, http, running, start_influxd, wait_port

NS = 10**9
#: (step seconds, ticks, job open offset s, saturation offset s, close offset s)
CASES = [
    (1.0, 120, 10.3, 30.7, 100.45),
    (0.37, 300, 0.05, 50.0, 110.999),
    (2.5, 48, 1.25, 2.5, 118.75),
]
POWER = {"package-0": 87.3, "dram": 11.9}


def run(work: Path, quick: bool) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"cases": len(CASES), "worst_error": {}, "errors": {}}
    procs: list[Proc] = []
    with running(procs):
        stores: dict[str, Store] = {"sqlite": SqliteStore(work / "accuracy.db")}
        if binary("INFLUXD", "influxd"):
            influxd = start_influxd(work / "influxd")
            procs.append(influxd.proc)
            stores["influxdb1"] = InfluxV1Store(influxd.url, "accuracy")
        for name, store in stores.items():
            errors = [case_error(work / f"{name}-{i}", store, f"acc-{name}-{i}", case) for i, case in enumerate(CASES)]
            result["errors"][name] = errors
            result["worst_error"][name] = max(errors)
            store.close()
        if binary("NODE_EXPORTER", "prometheus-node-exporter"):
            result["node_exporter"] = versus_node_exporter(work / "ne", procs)
    return result


def case_error(root: Path, store: Store, job_id: str, case: tuple[float, int, float, float, float]) -> float:
    step, ticks, open_s, sat_s, close_s = case
    zones = [
        # the package counter starts 50 J before its wrap: it wraps early in the job
        ZoneSpec("intel-rapl:0", "package-0", POWER["package-0"], start_uj=INTEL_RANGE_UJ - 50_000_000),
        ZoneSpec("intel-rapl:0:2", "dram", POWER["dram"], start_uj=INTEL_RANGE_UJ - 1_000_000_000),
    ]
    host = SyntheticHost(root, job_id.replace("acc", "host"), zones)
    builder = EventBuilder(JobSpec(job_id, job_id, "inference", "items", {}))
    host.spool.add_job_events(
        [
            builder.open(T0_NS + int(open_s * NS)),
            builder.phase("saturated", T0_NS + int(sat_s * NS)),
            builder.close(0, T0_NS + int(close_s * NS)),
        ]
    )
    for _ in range(ticks):
        host.advance(step)
    host.spool.seal()
    while (batch := host.spool.peek()) is not None:
        store.write(batch)
        host.spool.ack(batch.seq)
    host.close()
    report = build_report(store, job_id)  # type: ignore[arg-type]
    # A counter advances by round(P x step) uJ per tick: the truth is those whole microjoules.
    truth = sum(round(p * step * 1e6) / 1e6 / step for p in POWER.values()) * (close_s - open_s)
    got = report.warmup.energy_j + report.saturated_window.energy_j
    return abs(got - truth) / truth


_NE_LINE = re.compile(r'^node_rapl_(\w+)_joules_total\{index="(\w+)",path="([^"]+)"\} (\S+)$')


def node_exporter_joules(url: str) -> dict[str, float]:
    status, body = http("GET", url)
    if status != 200:
        raise RuntimeError(f"node_exporter answered {status}")
    out = {}
    for line in body.decode().splitlines():
        m = _NE_LINE.match(line)
        if m:
            out[m.group(3).rsplit("/", 1)[1]] = float(m.group(4))
    return out


def versus_node_exporter(root: Path, procs: list[Proc]) -> dict[str, Any]:
    start = {"intel-rapl:0": INTEL_RANGE_UJ - 5_000_000, "intel-rapl:0:0": 123_456, "intel-rapl:0:2": 7_000_000}
    start |= {"intel-rapl:1": 42, "intel-rapl:a": 999_999}
    names = {"intel-rapl:0": "package-0", "intel-rapl:0:0": "core", "intel-rapl:0:2": "dram"}
    names |= {"intel-rapl:1": "package-1", "intel-rapl:a": "psys"}
    powercap_tree(root, [Zone(z, names[z], v) for z, v in start.items()])
    path = binary("NODE_EXPORTER", "prometheus-node-exporter")
    assert path is not None
    port = free_port()
    argv = [path, f"--path.sysfs={root / 'sys'}", "--collector.disable-defaults", "--collector.rapl"]
    ne = Proc([*argv, f"--web.listen-address=127.0.0.1:{port}"], root / "node_exporter.log")
    procs.append(ne)
    wait_port(port, ne)
    url = f"http://127.0.0.1:{port}/metrics"
    t_ns = [T0_NS]
    clock = StampClock(wall=lambda: t_ns[0], mono=lambda: t_ns[0] - T0_NS)
    statuses = registry.discover(["rapl"], root, {}, {})
    sources = [s.source for s in statuses if s.source is not None]
    sampler = Sampler(sources, lambda _samples: None, clock)
    before = node_exporter_joules(url)
    sampler.tick()
    advance_uj = {z: 7_654_321 + i * 1_000_003 for i, z in enumerate(start)}  # about 8-12 J in 0.1 s (< max power)
    for zone, uj in advance_uj.items():
        set_energy(root, zone, (start[zone] + uj) % INTEL_RANGE_UJ)
    t_ns[0] += NS // 10
    sampler.tick()
    after = node_exporter_joules(url)
    for source in sources:
        source.close()
    ours = {dict(s.channel.info)["zone"]: s.last.energy_j for s in sampler.snapshot() if s.last is not None}
    diffs: dict[str, float] = {}
    wrap: dict[str, Any] | None = None
    for zone, uj in advance_uj.items():
        truth = uj / 1e6
        ne_delta = after[zone] - before[zone]
        if zone == "intel-rapl:0":
            wrap = {"zone": zone, "truth_j": truth, "wattline_j": ours[zone], "node_exporter_delta_j": ne_delta}
            continue
        diffs[zone] = abs(ours[zone] - ne_delta) / truth
    ne.stop()
    return {
        "zones": len(diffs),
        "worst_rel_diff": max(diffs.values()),
        "rel_diff_by_zone": diffs,
        "wrap": wrap,
        "wattline_wrap_error": abs(wrap["wattline_j"] - wrap["truth_j"]) / wrap["truth_j"] if wrap else None,
    }


__all__ = ["run", "wire"]
