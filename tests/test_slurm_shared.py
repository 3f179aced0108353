"""Two Slurm jobs sharing a node (README "Slurm", shared nodes): the agent reads each job's
cgroup CPU time in recorded trees (cgroup v1, v2, Slurm 26.05's SLUID folders: layouts in
tests/fixtures/cgroup_slurm/SOURCE.md) whose counters the test advances at known rates, and
sends ``cpu-time`` USE events; with samples at a known power each job must get its share of
the node's CPU energy within 1 % under the default share rule, and the node's energy must be
the jobs' plus the unattributed rest. A job's GPUs (``SLURM_JOB_GPUS``) are claimed by the
UUIDs the agent leaves the prolog (NVML stand-in)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from nvml_stub.build import build_stub
from slurm_node_files import node_config, slurmd_proc

from wattline import wire
from wattline.agent import holders, slurm_node
from wattline.agent.slurm_watch import SlurmWatcher
from wattline.collector.stores.sqlite import SqliteStore
from wattline.workloads import slurm
from wattline.workloads.attribution import ChannelEnergy, JobWindow, UseInterval, UseTimeline, split_shared
from wattline.workloads.events import EventBuilder, JobSpec
from wattline.workloads.report import build_report
from wattline.workloads.report_model import ReportSettings
from wattline.workloads.window_energy import Interval

S = 10**9
T0 = 1_767_225_600 * S
LENGTH_S = 60
CPU_W = 100.0
#: Cores each job keeps busy, and the whole node (the rest: system processes, node energy).
CORES = {"101": 2.0, "102": 1.0}
NODE_CORES = 5.0
UID = os.getuid()
SLUIDS = {"101": "s5K1KKYAYG5D00", "102": "s5K1KKYAYG5D01", "999": "s5K1KKYAYG5CZZ"}  # 999: not ours


def cgroup_tree(root: Path, layout: str) -> dict[str, Path]:
    """The node's cgroup folders by job ("" the root), laid out as ``layout`` says; 26.05's
    SLUID folders hold a step's slurmstepd, whose title names the job."""
    base = root / "sys/fs/cgroup"
    if layout == "v1":
        base = base / "cpu,cpuacct"
        dirs = {job: base / f"slurm/uid_{UID}/job_{job}" for job in CORES}
    else:
        (base / "system.slice").mkdir(parents=True)
        (base / "cgroup.controllers").write_text("cpu io memory pids\n")
        scope = base / "system.slice/slurmstepd.scope"
        if layout == "v2":
            dirs = {job: scope / f"job_{job}" for job in CORES}
        else:
            dirs = {job: scope / SLUIDS[job] for job in CORES}
            for n, (job, sluid) in enumerate(SLUIDS.items()):
                leaf = scope / sluid / "step_extern/slurm"
                leaf.mkdir(parents=True)
                (leaf / "cgroup.procs").write_text(f"{4000 + n}\n")
                (root / f"proc/{4000 + n}").mkdir(parents=True)
                (root / f"proc/{4000 + n}/cmdline").write_bytes(f"slurmstepd: [{job}.extern]".encode().ljust(64, b"\0"))
    for directory in dirs.values():
        directory.mkdir(parents=True, exist_ok=True)
    dirs = {**dirs, "": base}
    advance(dirs, 0, layout)
    return dirs


def advance(dirs: dict[str, Path], t_s: float, layout: str) -> None:
    """Every cgroup's CPU time at ``t_s`` s after T0 (the root counts the whole node)."""
    for job, directory in dirs.items():
        cores = NODE_CORES if job == "" else CORES[job]
        name, text = (
            ("cpuacct.usage", f"{int(cores * t_s * 1e9)}\n")
            if layout == "v1"
            else ("cpu.stat", f"usage_usec {int(cores * t_s * 1e6)}\nuser_usec 0\nsystem_usec 0\n")
        )
        temporary = directory / f"{name}.new"  # replaced whole: a reader never sees half a file
        temporary.write_text(text)
        temporary.replace(directory / name)


class Node(NamedTuple):
    outbox: Path
    slurm_dir: Path
    host: wire.pb.Host


def open_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Node, list[wire.pb.JobEvent]]:
    """Both jobs opened by the real prolog (notes the agent turns into holder records); their
    windows' open and close events made here at T0 and T0 + LENGTH_S."""
    config, proc = node_config(tmp_path), slurmd_proc(tmp_path / "proc")
    monkeypatch.setattr(slurm_node, "ask_controller", lambda *a, **k: slurm_node.Asked(None, 0.0))
    windows: list[wire.pb.JobEvent] = []
    for job_id in CORES:
        env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_UID": str(UID), "SLURMD_NODENAME": "n1"}
        assert slurm.prolog(env, config, proc) == []
        events = EventBuilder(JobSpec(job_id, job_id), base=slurm_node.seq_base(job_id, "n1"))
        windows += [events.open(T0), events.close(0, T0 + LENGTH_S * S)]
    return Node(tmp_path / "outbox", tmp_path / "slurm", wire.Host(host_id="n1")), windows


def store_with(path: Path, events: list[wire.pb.JobEvent]) -> SqliteStore:
    """Samples at CPU_W (1 s, T0-5 s .. end+5 s) and the events."""
    store = SqliteStore(path)
    batch = wire.Batch(stream_id="agent", seq=1, sent_ns=T0)
    batch.host.host_id = "n1"
    for i in range(-5, LENGTH_S + 5):
        batch.samples.add(source="rapl", component="cpu_package", device="package-0", quality=wire.QUALITY_COUNTER,
                          healthy=True, start_ns=T0 + i * S, end_ns=T0 + (i + 1) * S, energy_j=CPU_W,
                          power_w=CPU_W, cumulative_j=CPU_W * (i + 6))  # fmt: skip
    batch.job_events.extend(events)
    assert store.write(batch).rejected == 0
    return store


@pytest.mark.parametrize("layout", ["v1", "v2", "26.05"])
def test_two_jobs_on_one_node_get_their_cpu_time_shares(
    layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dirs = cgroup_tree(tmp_path / "host", layout)
    node, windows = open_jobs(tmp_path, monkeypatch)
    sent: list[wire.pb.JobEvent] = []
    watcher = SlurmWatcher(node.outbox, node.slurm_dir, node.host, lambda _h, ev: sent.extend(ev), tmp_path / "host")
    for t in range(LENGTH_S + 1):
        advance(dirs, t, layout)
        watcher.poll(T0 + t * S)
    uses = [e for e in sent if e.kind == wire.pb.JobEvent.KIND_USE]
    assert {e.job_id for e in uses} == set(CORES) and len(uses) == 2 * LENGTH_S // 5  # one per job and period
    assert len({(e.job_id, e.event_seq) for e in uses}) == len(uses)
    assert all(e.use_device == "cpu:host" and e.use_metric == "cpu-time" for e in uses)

    store = store_with(tmp_path / "w.db", [*windows, *uses])
    attributed = 0.0
    for job_id, cores in CORES.items():
        report = build_report(store, job_id, ReportSettings(), now_ns=T0 + 120 * S)  # the default rule
        got = sum(c.energy_j for w in (report.warmup, report.measured) for c in w.components.values())
        assert got == pytest.approx(CPU_W * LENGTH_S * cores / NODE_CORES, rel=0.01), (layout, job_id)
        attributed += got
    # Conservation, from the attribution of the same events: node = jobs + unattributed.
    samples = [Interval(T0 + i * S, T0 + (i + 1) * S, CPU_W) for i in range(-5, LENGTH_S + 5)]
    channel = ChannelEnergy("n1", "cpu_package", "package-0", wire.QUALITY_COUNTER, samples)
    jobs = [
        JobWindow(job_id, "n1", T0, T0 + LENGTH_S * S, uses={"cpu:host": UseTimeline(
            UseInterval(e.time_ns - e.use_period_ns, e.time_ns, e.job_use, e.device_use) for e in uses if e.job_id == job_id
        )})
        for job_id in CORES
    ]  # fmt: skip
    split = split_shared([channel], jobs, "cpu-time")
    assert split.node_total_j("n1") == pytest.approx(math.fsum(i.energy_j for i in samples), rel=1e-9)
    assert math.fsum(split.by_job("n1").values()) + split.unattributed_j("n1") == pytest.approx(
        split.node_total_j("n1"), rel=1e-9
    )
    assert math.fsum(split.by_job("n1").values()) == pytest.approx(attributed, rel=0.01)


def test_a_restarted_agent_numbers_a_period_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = cgroup_tree(tmp_path / "host", "v2")
    node, _ = open_jobs(tmp_path, monkeypatch)
    runs: list[list[wire.pb.JobEvent]] = [[], []]
    for sent in runs:
        watcher = SlurmWatcher(
            node.outbox, node.slurm_dir, node.host, lambda _h, ev, s=sent: s.extend(ev), tmp_path / "host"
        )
        for t in (0, 5, 10):
            advance(dirs, t, "v2")
            watcher.poll(T0 + t * S)
    assert [e.kind for e in runs[0][:2]] == [wire.pb.JobEvent.KIND_OPEN] * 2  # the first agent took the notes
    uses = [[(e.job_id, e.event_seq, e.job_use) for e in run if e.kind == wire.pb.JobEvent.KIND_USE] for run in runs]
    assert uses[0] == uses[1] and len(uses[0]) == 4
    assert all(seq & 0xFFFFFFFF >= 1 << 30 for _, seq, _ in uses[0])  # the USE places of the block
    holders.drop(node.outbox, "101", "n1")


#: The agent's side, with the NVML stand-in: discovers the GPUs and runs one watcher pass,
#: printing the devices of the open events it made.
AGENT_PASS = """
import sys
from pathlib import Path
from wattline import wire
from wattline.agent import slurm_node
from wattline.agent.slurm_watch import SlurmWatcher, gpu_uuids
from wattline.agent.sources.nvml import NvmlSource
slurm_node.ask_controller = lambda *a, **k: slurm_node.Asked(None, 0.0)
from wattline.agent.sources.base import SourceUnavailable
src = NvmlSource()
try:
    channels = src.discover()
except SourceUnavailable:
    channels = []
outbox, slurm_dir = Path(sys.argv[1]), Path(sys.argv[2])
show = lambda h, events: [print(",".join(e.devices)) for e in events if e.kind == wire.pb.JobEvent.KIND_OPEN]
SlurmWatcher(outbox, slurm_dir, wire.Host(host_id="n1"), show, gpus=lambda: gpu_uuids(channels)).poll()
src.close()
"""


def test_slurm_gpus_are_claimed_by_uuid_from_the_agents_gpu_sources(tmp_path: Path) -> None:
    config, proc = node_config(tmp_path), slurmd_proc(tmp_path / "proc")
    env = {"SLURM_JOB_ID": "301", "SLURM_JOB_UID": str(UID), "SLURM_JOB_GPUS": "1,0", "SLURMD_NODENAME": "n1"}
    scenario = Path(__file__).parent / "nvml_stub/scenarios/two_gpus.txt"
    shown = []
    for nvml in (True, False):  # an agent without NVML claims them by index
        assert slurm.prolog(env, config, proc) == []
        stub = {"LD_LIBRARY_PATH": str(build_stub()), "WATTLINE_NVML_SCENARIO": str(scenario)} if nvml else {}
        done = subprocess.run(
            [sys.executable, "-c", AGENT_PASS, str(tmp_path / "outbox"), str(tmp_path / "slurm")],
            env={**os.environ, **stub}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        shown.append(done.stdout.strip())
    uuid = "GPU-0a1b2c3d-0000-4000-8000-00000000000"
    assert shown == [f"gpu:{uuid}1,gpu:{uuid}0", "gpu:1,gpu:0"]
