"""Part "agent": the agent's CPU and memory against node_exporter and CodeCarbon, same rate, same run.

Per rate, every subject runs at once (so the other engineers' load hits them alike), in
``replicas`` copies each (the median is reported), for one fixed window of CPU time read
from ``/proc/PID/stat`` (utime + stime, every thread):

- ``rapl+nic``: ``wattline agent --sysfs-root TREE --source rapl --source nic`` (8 RAPL
  zones, 4 NICs: 24 counter files, 12 channels), shipping to a null-sink collector;
- ``lean``: the same agent started as ``python -m wattline.agent`` (no CLI imports);
- ``batch10``: the rapl+nic agent with ``--batch-interval 10`` (one push per 10 s, not per
  second: the push is most of the cost at 1 Hz);
- ``floor``: not an agent: a plain Python loop reading the same 24 files with ``os.pread`` at
  the same rate (:mod:`wlbench.floor`), the least any Python sampler can cost;
- ``floor+grpc``: the same loop plus one empty unary gRPC call to the sink every default
  ``batch_interval``, on a channel set up as the agent's: the least a Python agent shipping
  over gRPC at the default settings can cost (the push's floor);
- ``all``: every source: RAPL, NIC, 8 GPUs through the NVML stand-in library
  (``LD_LIBRARY_PATH``), one Neuron device from tests/helpers/neuron_replay.py as ``monitor_path``
  (the replay child's own CPU is not the agent's and is not counted);
- ``rapl+nic scraped``: the rapl+nic agent with its ``/metrics`` scraped at the same rate
  (gzip); the extra CPU over the unscraped agents, per scrape, is the scrape's cost;
- ``node_exporter`` on the same tree (``--collector.rapl --collector.netclass`` only: the
  NIC byte counters of netclass's peer ``netdev`` come from /proc/net/dev of the real host,
  not from ``--path.sysfs``), scraped at the rate with ``Accept-Encoding: gzip``. The
  scraper is a separate process, so its cost is not in node_exporter's figure;
- CodeCarbon (``OfflineEmissionsTracker``, ``measure_power_secs`` = the interval) in
  bench/.venv: its steady-state CPU per measurement, and its whole run including start-up
  and children (``os.wait4``).

Back-to-back scrapes (no pacing) of node_exporter and of the agent's ``/metrics`` are
measured after the paced windows. Before each rate, the interpreter's, its environment's and
node_exporter's files leave the page cache (those no running process maps), so peak RSS does
not depend on what an install or an earlier part left cached.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wlbench import ccvenv
from wlbench.common import (
    PYTHON,
    Proc,
    binary,
    evict_page_cache,
    free_port,
    median,
    ratio,
    running,
    shared_objects,
    wait_port,
)
from wlbench.fixtures import FixtureHost, make_host

#: Channels of each agent kind on the fixture host.
CHANNELS = {"rapl+nic": 12, "lean": 12, "batch10": 12, "scraped": 12, "all": 12 + 8 + 1, "floor": 12, "floor+grpc": 12}
KINDS = ("rapl+nic", "lean", "batch10", "all", "scraped", "floor", "floor+grpc")


@dataclass
class Plan:
    rates: list[float]
    window_s: dict[float, float]
    replicas: int
    codecarbon_rates: list[float]
    b2b_scrapes: int


#: 1 Hz for 120 s: /proc's CPU times tick at 10 ms, 0.083 ms a tick over 120 ticks.
FULL = Plan([1, 10, 100], {1: 120, 10: 30, 100: 15}, 3, [1, 10], 300)
QUICK = Plan([10], {10: 8}, 1, [], 60)


def wattline_argv() -> list[str]:
    script = Path(PYTHON).parent / "wattline"
    return [str(script)] if script.exists() else [PYTHON, "-m", "wattline.cli.main"]


@dataclass
class Subject:
    kind: str  #: "rapl+nic", "all", "scraped", "node_exporter"
    proc: Proc
    url: str = ""  #: /metrics to scrape, if scraped
    cpu0: float = 0.0
    cpu1: float = 0.0
    hwm_mib: float = 0.0
    scrapes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def start_agent(kind: str, rate: float, host: FixtureHost, sink: int, name: str, logs: Path) -> Subject:
    if kind.startswith("floor"):
        argv = [PYTHON, "-m", "wlbench.floor", str(host.tree), repr(rate)]
        return Subject(kind, Proc(argv + ([f"127.0.0.1:{sink}"] if kind == "floor+grpc" else []), logs / f"{name}.log"))
    if kind == "lean":
        argv = [PYTHON, "-m", "wattline.agent", "--sysfs-root", str(host.tree), "--interval", repr(1.0 / rate)]
        argv += ["--collectors", f"127.0.0.1:{sink}", "--host-id", name, "--sources", "rapl,nic"]
        return Subject(kind, Proc(argv, logs / f"{name}.log"))
    argv = [*wattline_argv(), "agent", "--sysfs-root", str(host.tree), "--interval", repr(1.0 / rate)]
    argv += ["--collector", f"127.0.0.1:{sink}", "--host-id", name]
    env: dict[str, str] = {}
    if kind == "all":
        argv += ["-c", str(host.config)]
        argv += [a for s in ("rapl", "nvml", "neuron", "nic") for a in ("--source", s)]
        env = host.env_all
    else:
        argv += ["--source", "rapl", "--source", "nic"]
    if kind == "batch10":
        argv += ["--batch-interval", "10"]
    url = ""
    if kind == "scraped":
        port = free_port()
        argv += ["--prometheus-port", str(port)]
        url = f"http://127.0.0.1:{port}/metrics"
    return Subject(kind, Proc(argv, logs / f"{name}.log", env=env), url)


def start_node_exporter(host: FixtureHost, name: str, logs: Path) -> Subject:
    path = binary("NODE_EXPORTER", "prometheus-node-exporter")
    if path is None:
        raise RuntimeError("prometheus-node-exporter not found (Debian package; or set NODE_EXPORTER)")
    port = free_port()
    argv = [
        path,
        f"--path.sysfs={host.tree / 'sys'}",
        "--collector.disable-defaults",
        "--collector.rapl",
        "--collector.netclass",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    proc = Proc(argv, logs / f"{name}.log")
    wait_port(port, proc)
    return Subject("node_exporter", proc, f"http://127.0.0.1:{port}/metrics")


def wait_agents_ready(subjects: list[Subject], timeout_s: float = 60.0) -> None:
    """Until every agent logged that it samples (and scraped ones listen)."""
    deadline = time.monotonic() + timeout_s
    for s in subjects:
        if s.kind == "node_exporter":
            continue
        ready = "floor:" if s.kind.startswith("floor") else "sampling every"
        while ready not in s.proc.tail(20000):
            if not s.proc.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"agent did not start:\n{s.proc.tail()}")
            time.sleep(0.1)


def scrape(urls: list[str], rate: float, duration: float, out: Path, logs: Path, count: int = 0) -> Proc:
    argv = [PYTHON, "-m", "wlbench.scraper", "--rate", str(rate), "--duration", str(duration), "--out", str(out)]
    if count:
        argv += ["--count", str(count)]
    return Proc([*argv, *urls], logs / f"scraper-{out.stem}.log")


def in_window(times: list[float], t0: float, t1: float) -> int:
    return sum(1 for t in times if t0 <= t < t1)


def run_rate(rate: float, plan: Plan, host: FixtureHost, sink: int, work: Path, cc: Path | None) -> dict[str, Any]:
    logs = work / f"logs-{rate:g}hz"
    window = plan.window_s[rate]
    procs: list[Proc] = []
    evicted = evict_page_cache(binaries())
    with running(procs):
        codecarbon = None
        if cc is not None and rate in plan.codecarbon_rates:
            codecarbon = ccvenv.start_probe(cc, 1.0 / rate, warm_s=12.0, window_s=window, log=logs / "codecarbon.log")
            procs.append(codecarbon.proc)
        subjects: list[Subject] = []
        for i in range(plan.replicas):
            for kind in KINDS:
                if kind == "batch10" and rate > 10:
                    continue
                subjects.append(start_agent(kind, rate, host, sink, f"r{rate:g}-{kind}-{i}", logs))
                procs.append(subjects[-1].proc)
            subjects.append(start_node_exporter(host, f"node_exporter-{i}", logs))
            procs.append(subjects[-1].proc)
        wait_agents_ready(subjects)
        settle = 3.0
        scraped = [s for s in subjects if s.url]
        out = logs / "paced.json"
        scraper = scrape([s.url for s in scraped], rate, settle + window + 2.0, out, logs)
        procs.append(scraper)
        time.sleep(settle)
        t0 = time.monotonic()
        for s in subjects:
            s.cpu0 = s.proc.cpu_s()
        time.sleep(window)
        for s in subjects:
            s.cpu1 = s.proc.cpu_s()
        t1 = time.monotonic()
        for s in subjects:
            s.hwm_mib = s.proc.hwm_mib()
        scraper.popen.wait(timeout=60)
        paced = json.loads(out.read_text())
        for s in scraped:
            s.scrapes = in_window(paced["done"][s.url], t0, t1)
        cc_result = codecarbon.finish() if codecarbon is not None else None
    result = summarize(rate, t1 - t0, subjects, paced, cc_result)
    result["page_cache_evicted_mib"] = evicted / 2**20
    return result


def binaries() -> list[Path | str]:
    """What the subjects map from disk: the interpreter, its environment's shared objects, node_exporter.

    Evicted from the page cache before each rate (see :func:`wlbench.common.evict_page_cache`),
    so peak RSS does not depend on what an install or an earlier part left cached.
    """
    files: list[Path | str] = [os.path.realpath(PYTHON), *shared_objects()]
    node_exporter = binary("NODE_EXPORTER", "prometheus-node-exporter")
    if node_exporter:
        files.append(node_exporter)
    return files


def summarize(
    rate: float, window: float, subjects: list[Subject], paced: dict[str, Any], cc: dict[str, Any] | None
) -> dict[str, Any]:
    ticks = rate * window
    out: dict[str, Any] = {"rate_hz": rate, "window_s": window, "ticks": ticks}
    base_cpu = median([s.cpu1 - s.cpu0 for s in subjects if s.kind == "rapl+nic"])
    for kind in KINDS:
        group = [s for s in subjects if s.kind == kind]
        if not group:
            continue
        cpu = median([s.cpu1 - s.cpu0 for s in group]) or 0.0
        channels = CHANNELS[kind]
        entry: dict[str, Any] = {
            "replicas": len(group),
            "cpu_s": cpu,
            "cpu_ms_per_tick": cpu / ticks * 1e3,
            "cpu_s_per_1000_samples": cpu / (ticks * channels) * 1e3,
            "core_pct": cpu / window * 100,
            "hwm_mib": median([s.hwm_mib for s in group]),
            "channels": channels,
        }
        if kind == "scraped":
            scrapes = median([s.scrapes for s in group]) or 0
            entry["scrapes"] = scrapes
            extra = cpu - (base_cpu or 0.0)
            entry["scrape_cpu_ms"] = extra / scrapes * 1e3 if scrapes else None
        out[kind] = entry
    ne = [s for s in subjects if s.kind == "node_exporter"]
    ne_cpu = median([s.cpu1 - s.cpu0 for s in ne]) or 0.0
    ne_scrapes = median([s.scrapes for s in ne]) or 0
    out["node_exporter"] = {
        "replicas": len(ne),
        "cpu_s": ne_cpu,
        "scrapes": ne_scrapes,
        "cpu_ms_per_scrape": ne_cpu / ne_scrapes * 1e3 if ne_scrapes else None,
        "core_pct": ne_cpu / window * 100,
        "hwm_mib": median([s.hwm_mib for s in ne]),
        "scraper_cpu_s_total": paced.get("cpu_s"),
        "scrape_errors": paced.get("errors", []),
    }
    if cc is not None:
        out["codecarbon"] = cc
    agent_tick = out["rapl+nic"]["cpu_ms_per_tick"]
    out["ratios"] = {
        "agent_tick_vs_floor": ratio(agent_tick, out["floor"]["cpu_ms_per_tick"]),
        "agent_tick_vs_floor_grpc": ratio(agent_tick, out["floor+grpc"]["cpu_ms_per_tick"]),
        "floor_grpc_tick_vs_node_exporter_scrape": ratio(
            out["floor+grpc"]["cpu_ms_per_tick"], out["node_exporter"]["cpu_ms_per_scrape"]
        ),
        "agent_tick_vs_node_exporter_scrape": ratio(agent_tick, out["node_exporter"]["cpu_ms_per_scrape"]),
        "agent_tick_vs_codecarbon_steady": ratio(agent_tick, (cc or {}).get("steady_ms_per_measurement")),
        "agent_tick_vs_codecarbon_whole_run": ratio(agent_tick, (cc or {}).get("whole_run_ms_per_measurement")),
        "wattline_scrape_vs_node_exporter_scrape": ratio(
            out["scraped"]["scrape_cpu_ms"], out["node_exporter"]["cpu_ms_per_scrape"]
        ),
    }
    return out


def back_to_back(plan: Plan, host: FixtureHost, sink: int, work: Path) -> dict[str, Any]:
    """Unpaced scrapes: node_exporter's CPU per scrape, and the agent's extra CPU per scrape."""
    logs = work / "logs-b2b"
    procs: list[Proc] = []
    result: dict[str, Any] = {"scrapes": plan.b2b_scrapes}
    with running(procs):
        agent = start_agent("scraped", 1.0, host, sink, "b2b-agent", logs)
        procs.append(agent.proc)
        ne = start_node_exporter(host, "b2b-node_exporter", logs)
        procs.append(ne.proc)
        wait_agents_ready([agent])
        wait_port(int(agent.url.rsplit(":", 1)[1].split("/")[0]), agent.proc)
        time.sleep(2.0)
        a0, t0 = agent.proc.cpu_s(), time.monotonic()
        time.sleep(5.0)
        idle_rate = (agent.proc.cpu_s() - a0) / (time.monotonic() - t0)  # sampling at 1 Hz, no scrapes
        for subject, name in ((ne, "node_exporter"), (agent, "wattline")):
            out = logs / f"b2b-{name}.json"
            c0, t0 = subject.proc.cpu_s(), time.monotonic()
            scraper = scrape([subject.url], 0, 120, out, logs, count=plan.b2b_scrapes)
            scraper.popen.wait(timeout=180)
            c1, t1 = subject.proc.cpu_s(), time.monotonic()
            scraper.stop()
            done = json.loads(out.read_text())
            n = len(done["done"][subject.url])
            cpu = (c1 - c0) - (idle_rate * (t1 - t0) if name == "wattline" else 0.0)
            result[name] = {"cpu_ms_per_scrape": cpu / n * 1e3 if n else None, "scrapes": n, "errors": done["errors"]}
        result["idle_agent_core_pct"] = idle_rate * 100
    result["wattline_vs_node_exporter"] = ratio(
        result["wattline"]["cpu_ms_per_scrape"], result["node_exporter"]["cpu_ms_per_scrape"]
    )
    return result


def run(work: Path, quick: bool) -> dict[str, Any]:
    plan = QUICK if quick else FULL
    host = make_host(work)
    cc = ccvenv.python() if plan.codecarbon_rates else None
    sink_port = free_port()
    stats = work / "sink-stats.json"
    sink = Proc(
        [PYTHON, "-m", "wlbench.sink", "--listen", f"127.0.0.1:{sink_port}", "--stats", str(stats)],
        work / "sink.log",
    )
    result: dict[str, Any] = {
        "plan": {"rates_hz": plan.rates, "window_s": plan.window_s, "replicas": plan.replicas},
        "codecarbon": "measured" if cc else ccvenv.why_missing(),
    }
    with running([sink]):
        wait_port(sink_port, sink)
        result["rates"] = {f"{r:g}": run_rate(r, plan, host, sink_port, work, cc) for r in plan.rates}
        result["back_to_back"] = back_to_back(plan, host, sink_port, work)
    received = json.loads(stats.read_text())["by_host"] if stats.exists() else {}
    result["samples_received"] = sum(received.values())
    return result
