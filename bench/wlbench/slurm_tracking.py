"""Part "slurm-tracking" (issue #28): what tracking 64 open Slurm jobs costs a node's agent,
against the agent alone, side by side in one run.

The node (:mod:`wlbench.slurm_node_tree`): the fixture host's RAPL zones and NICs and a
cgroup v2 tree with 64 job folders under one root, each job opened by the real prolog (its
events file and its open note, from which the agent makes the job's open event and its
holder record; the holder, the slurmd the prolog finds in /proc, is this process, named so
in a /proc of the prologs' own: tests/helpers/slurm_node_files.py); every job's CPU time advanced
once a second. Agents, all running at
once, ``REPLICAS`` copies of each, ``wattline agent -c FILE`` at 1 Hz on RAPL + NIC, shipping
to a null-sink collector (:mod:`wlbench.sink`):

- ``alone``: the same settings, its Slurm directory there and empty: no job;
- ``64 jobs``: the 64 jobs open, their events files quiet (the watcher still looks at each
  file every pass, renews each holder record, heartbeats each job, reads each job's CPU time
  and sends its USE event every period);
- ``64 jobs, lines``: the same, each job appending a ``units N`` line every ``LINE_EVERY_S``.

Figure: each agent's CPU seconds per wall second from ``/proc`` (utime + stime, all its
threads, live or exited) over ``window_s`` after ``SETTLE_S`` (start-up and the opens'
delivery done); medians of the copies; the ratio to ``alone``; and how many more event
directories wait in its outbox at the window's end than at its start (per minute): CPU per
second is the cost only where that stays near 0. In process, same run: one
watcher pass (:meth:`SlurmWatcher.poll`, every tenth with the period's CPU-time reading)
with 64 jobs (their notes taken first) and with none, back to back, delivering into nothing; and what the agent
does with each job's USE event of a period: one outbox directory of its own per event
(:func:`~wattline.agent.spool.outbox.open_outbox`, as ``Agent._to_outbox`` does), then a drainer pass
delivering each directory through an uplink of its own (as the agent's
:class:`~wattline.agent.spool.outbox.OutboxDrainer` does), in this process's CPU time (gRPC as this
process imports it, not the agent's entry point), with the collector idle, and again after
the window while the agents keep it busy.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.agent.holders.slurm.watch import SlurmWatcher
from wattline.agent.spool.outbox import OutboxDrainer, open_outbox
from wattline.agent.uplink import Uplink
from wattline.agent.usage.cgroup_cpu import CPU_DEVICE, CPU_METRIC
from wlbench.agent import wattline_argv
from wlbench.common import PYTHON, Proc, free_port, median, ratio, running, wait_port
from wlbench.fixtures import host_tree
from wlbench.slurm_node_tree import SlurmNode, advance, cgroup_tree, job_ids, node_config

JOBS = 64
KINDS = {"alone": 0, "64 jobs": JOBS, "64 jobs, lines": JOBS}
SLUGS = {"alone": "alone", "64 jobs": "jobs", "64 jobs, lines": "lines"}
LINE_EVERY_S = 10
SETTLE_S = 12.0
#: Watcher passes timed in process per case; its thread polls every 0.5 s.
PASSES = 400
WATCH_EVERY_NS = 500_000_000


def run(work: Path, quick: bool) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    replicas, window_s = (1, 15.0) if quick else (2, 120.0)
    tree = host_tree(work / "tree")
    cgroup_tree(tree, JOBS)
    proc = work / "proc"
    port = free_port()
    collector = f"127.0.0.1:{port}"
    nodes: dict[str, list[SlurmNode]] = {}
    for kind, jobs in KINDS.items():
        nodes[kind] = []
        for i in range(replicas):
            name = f"{SLUGS[kind]}-{i}"
            node = node_config(work / name, name, tree, collector)
            node.open_jobs(jobs, proc)
            nodes[kind].append(node)
    result: dict[str, Any] = {"jobs": JOBS, "replicas": replicas, "window_s": window_s, "line_every_s": LINE_EVERY_S}
    in_process = node_config(work / "in-process", "in-process", tree, collector)
    in_process.open_jobs(JOBS, proc)
    result["watcher_pass"] = watcher_passes(tree, in_process, work / "empty")
    stop = threading.Event()
    ticker = threading.Thread(target=tick, args=(tree, nodes["64 jobs, lines"], stop), daemon=True)
    procs: list[Proc] = []
    cpu: dict[str, list[float]] = {kind: [] for kind in KINDS}
    backlog: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with running(procs):
        sink_argv = [PYTHON, "-m", "wlbench.sink", "--listen", collector, "--stats", str(work / "sink.json")]
        procs.append(Proc(sink_argv, work / "sink.log"))
        wait_port(port, procs[0])
        result["use_delivery"] = use_delivery(work / "delivery", collector)
        ticker.start()
        agents = [
            (kind, Proc([*wattline_argv(), "agent", "-c", str(node.config)], node.config.parent / "agent.log"))
            for kind in KINDS
            for node in nodes[kind]
        ]
        procs += [p for _, p in agents]
        time.sleep(SETTLE_S)
        for _, agent in agents:
            if not agent.alive():
                raise RuntimeError(f"agent exited:\n{agent.tail()}")
        outboxes = [node.outbox for kind in KINDS for node in nodes[kind]]
        c0, t0, w0 = [p.cpu_s() for _, p in agents], time.monotonic(), [waiting(o) for o in outboxes]
        time.sleep(window_s)
        c1, t1, w1 = [p.cpu_s() for _, p in agents], time.monotonic(), [waiting(o) for o in outboxes]
        # the same delivery while the agents keep the collector busy (its commits linger then)
        result["use_delivery_busy"] = use_delivery(work / "delivery-busy", collector)
        stop.set()
        for (kind, _), a, b, before, after in zip(agents, c0, c1, w0, w1, strict=True):
            cpu[kind].append((b - a) / (t1 - t0))
            backlog[kind].append((after - before) / (t1 - t0) * 60)
    result["cpu_s_per_s"] = {kind: median(v) for kind, v in cpu.items()}
    result["runs"] = cpu
    result["outbox_growth_per_min"] = {kind: median(v) for kind, v in backlog.items()}
    result["outbox_growth_runs"] = backlog
    alone = result["cpu_s_per_s"]["alone"]
    result["ratio_to_alone"] = {kind: ratio(v, alone) for kind, v in result["cpu_s_per_s"].items()}
    result["opened_events"] = sum(len(n.jobs) for ns in nodes.values() for n in ns)
    return result


def waiting(outbox: Path) -> int:
    """Event directories in ``outbox`` not delivered yet (the agent's outbox names them ``p<pid>-...``)."""
    return sum(1 for p in outbox.iterdir() if p.name.startswith("p")) if outbox.is_dir() else 0


def tick(tree: Path, writers: list[SlurmNode], stop: threading.Event) -> None:
    """Once a second: every cgroup's CPU time; each job of ``writers`` appends a line every
    LINE_EVERY_S seconds, the jobs spread over them."""
    start = time.monotonic()
    second = 0
    while not stop.wait(max(0.0, start + second + 1 - time.monotonic())):
        second += 1
        advance(tree, JOBS, float(second))
        for node in writers:
            for k, job in enumerate(node.jobs):
                if (second + k) % LINE_EVERY_S == 0:
                    node.append_line(job, 100)


def watcher_passes(tree: Path, node: SlurmNode, empty: Path) -> dict[str, float | None]:
    """CPU ms of one watcher pass with ``node``'s 64 jobs and with none (a Slurm directory
    and outbox of its own, empty), best of three rounds of PASSES passes; every job must have
    had its CPU time read (a USE event)."""
    empty_slurm = empty / "slurm"
    empty_slurm.mkdir(parents=True, exist_ok=True)
    os.chmod(empty_slurm, 0o755)
    cases = {"64 jobs": (node.outbox, node.slurm_dir), "none": (empty / "outbox", empty_slurm)}
    host = wire.Host(host_id=node.host_id)
    out: dict[str, float | None] = {}
    used: set[str] = set()  #: jobs the watcher sent a CPU-time USE event: it read their cgroups

    def deliver(_host: wire.pb.Host, events: list[wire.pb.JobEvent]) -> None:
        used.update(e.job_id for e in events if e.kind == wire.pb.JobEvent.KIND_USE and e.use_device == CPU_DEVICE)

    for name, (outbox, slurm_dir) in cases.items():
        rounds = []
        for _ in range(3):
            watcher = SlurmWatcher(outbox, slurm_dir, host, deliver, tree)
            now = time.time_ns()
            watcher.poll(now - WATCH_EVERY_NS)  # the prolog's notes taken: the jobs' holder records kept
            c0 = time.thread_time()
            for k in range(PASSES):
                watcher.poll(now + k * WATCH_EVERY_NS)
            rounds.append((time.thread_time() - c0) / PASSES * 1e3)
        out[f"{name}_ms"] = min(rounds)
        if name == "64 jobs" and used != set(node.jobs):  # else the tree is not what the agent reads
            raise RuntimeError(f"the watcher read the CPU time of {len(used)} of the {len(node.jobs)} jobs")
    out["per_job_us"] = ((out["64 jobs_ms"] or 0) - (out["none_ms"] or 0)) * 1e3 / JOBS
    return out


def use_delivery(root: Path, collector: str, periods: int = 10) -> dict[str, float]:
    """CPU ms of one use period's USE events of the JOBS jobs, which the watcher hands the outbox
    as one directory: into it, then that directory delivered (a disk spool opened, an uplink
    made, one push, the directory removed), and the delivery's wall time (one drainer delivers
    one directory at a time); best of three rounds of ``periods`` periods."""
    host = wire.Host(host_id="delivery")
    out: dict[str, list[float]] = {"to_outbox_ms": [], "delivered_ms": [], "delivered_wall_ms": []}
    for r in range(3):
        c0 = time.process_time()
        for p in range(periods):
            events = [
                wire.JobEvent(job_id=job, kind=wire.pb.JobEvent.KIND_USE, time_ns=time.time_ns(),
                              event_seq=(r << 40) + (p << 20) + k + 1, use_device=CPU_DEVICE,
                              use_period_ns=5 * 10**9, job_use=25.0, device_use=100.0, use_metric=CPU_METRIC)
                for k, job in enumerate(job_ids(JOBS))
            ]  # fmt: skip
            spool = open_outbox(root, host)
            try:
                spool.add_job_events(events)
            finally:
                spool.close()
        c1, w1 = time.process_time(), time.monotonic()
        drainer = OutboxDrainer(root, host, lambda spool: Uplink(spool, [collector], quiet=True))
        delivered = drainer.drain_once(threading.Event())
        c2, w2 = time.process_time(), time.monotonic()
        if delivered != periods:
            raise RuntimeError(f"outbox: {delivered} of {periods} directories delivered")
        out["to_outbox_ms"].append((c1 - c0) / periods * 1e3)
        out["delivered_ms"].append((c2 - c1) / periods * 1e3)
        out["delivered_wall_ms"].append((w2 - w1) / periods * 1e3)
    return {k: min(v) for k, v in out.items()}
