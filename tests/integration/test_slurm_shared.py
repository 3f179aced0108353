"""Two Slurm jobs sharing a node (README "Slurm", shared nodes): the agent reads each job's
cgroup CPU time in recorded trees (cgroup v1, v2, Slurm 26.05's SLUID folders: layouts in
tests/fixtures/cgroup_slurm/SOURCE.md) whose counters the test advances at known rates, and
sends ``cpu-time`` USE events; with samples at a known power each job must get its share of
the node's CPU energy within 1 % under the default share rule, and the node's energy must be
the jobs' plus the unattributed rest. A job's GPUs (``SLURM_JOB_GPUS``) are claimed by the
UUIDs the agent leaves the prolog (NVML stand-in). A GPU time-sliced by two jobs and by
processes of no job (``/proc/PID/cgroup`` in each layout, per-process use at known SM %):
each job gets its use share of the GPU's energy within 1 %, the others' use stays
unattributed."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from nvml_stub.build import build_stub
from slurm_node_files import node_config, slurmd_proc

from wattline import wire
from wattline.accounting.attribution import ChannelEnergy, JobWindow, UseInterval, UseTimeline, split_shared
from wattline.accounting.window_energy import Interval
from wattline.agent.holders import registry as holders
from wattline.agent.holders.slurm import node as slurm_node
from wattline.agent.holders.slurm import records as slurm_records
from wattline.agent.holders.slurm.watch import SlurmWatcher
from wattline.agent.sources.use import DeviceUse
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.jobs.wrappers import slurm_hooks
from wattline.reports.build import build_report
from wattline.reports.model import ReportSettings
from wattline.stores.sqlite.store import SqliteStore

S = 10**9
T0 = 1_767_225_600 * S
LENGTH_S = 60
CPU_W = 100.0
#: Cores each job keeps busy, and the whole node (the rest: system processes, node energy).
CORES = {"101": 2.0, "102": 1.0}
NODE_CORES = 5.0
UID = os.getuid()
SLUIDS = {"101": "s5K1KKYAYG5D00", "102": "s5K1KKYAYG5D01", "103": "s5K1KKYAYG5D02", "999": "s5K1KKYAYG5CZZ"}
#: 999: a job on the node that the agent has not opened (no note: not ours).


def cgroup_tree(root: Path, layout: str, cores: dict[str, float] = CORES) -> dict[str, Path]:
    """The node's cgroup folders by job ("" the root), laid out as ``layout`` says; 26.05's
    SLUID folders hold a step's slurmstepd, whose title names the job."""
    base = root / "sys/fs/cgroup"
    if layout == "v1":
        base = base / "cpu,cpuacct"
        dirs = {job: base / f"slurm/uid_{UID}/job_{job}" for job in cores}
    else:
        (base / "system.slice").mkdir(parents=True)
        (base / "cgroup.controllers").write_text("cpu io memory pids\n")
        scope = base / "system.slice/slurmstepd.scope"
        if layout == "v2":
            dirs = {job: scope / f"job_{job}" for job in cores}
        else:
            dirs = {job: scope / SLUIDS[job] for job in cores}
            for n, (job, sluid) in enumerate(SLUIDS.items()):
                leaf = scope / sluid / "step_extern/slurm"
                leaf.mkdir(parents=True)
                (leaf / "cgroup.procs").write_text(f"{4000 + n}\n")
                (root / f"proc/{4000 + n}").mkdir(parents=True)
                (root / f"proc/{4000 + n}/cmdline").write_bytes(f"slurmstepd: [{job}.extern]".encode().ljust(64, b"\0"))
    for directory in dirs.values():
        directory.mkdir(parents=True, exist_ok=True)
    dirs = {**dirs, "": base}
    advance(dirs, 0, layout, cores)
    return dirs


def advance(dirs: dict[str, Path], t_s: float, layout: str, cores_of: dict[str, float] = CORES) -> None:
    """Every cgroup's CPU time at ``t_s`` s after T0 (the root counts the whole node)."""
    for job, directory in dirs.items():
        cores = NODE_CORES if job == "" else cores_of[job]
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
        assert slurm_hooks.prolog(env, config, proc) == []
        events = EventBuilder(JobSpec(job_id, job_id), base=slurm_node.seq_base(job_id, "n1"))
        windows += [events.open(T0), events.close(0, T0 + LENGTH_S * S)]
    return Node(tmp_path / "outbox", tmp_path / "slurm", wire.Host(host_id="n1")), windows


def store_with(path: Path, events: list[wire.pb.JobEvent], gpus: dict[str, float] | None = None) -> SqliteStore:
    """Samples at CPU_W and each of ``gpus`` (UUID -> W) at its power (1 s, T0-5 s .. end+5 s) and the events."""
    store = SqliteStore(path)
    batch = wire.Batch(stream_id="agent", seq=1, sent_ns=T0)
    batch.host.host_id = "n1"
    series = [("rapl", "cpu_package", "package-0", CPU_W), *(("nvml", "gpu", u, w) for u, w in (gpus or {}).items())]
    for (source, component, device, watts), i in itertools.product(series, range(-5, LENGTH_S + 5)):
        batch.samples.add(source=source, component=component, device=device, quality=wire.QUALITY_COUNTER,
                          healthy=True, start_ns=T0 + i * S, end_ns=T0 + (i + 1) * S, energy_j=watts,
                          power_w=watts, cumulative_j=watts * (i + 6))  # fmt: skip
    batch.job_events.extend(events)
    assert store.write(batch).rejected == 0
    return store


@pytest.mark.parametrize("layout", ["v1", "v2", "26.05"])
def test_two_jobs_on_one_node_get_their_cpu_time_shares(
    layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dirs = cgroup_tree(tmp_path / "host", layout)
    node, windows = open_jobs(tmp_path, monkeypatch)
    deliveries: list[list[wire.pb.JobEvent]] = []
    watcher = SlurmWatcher(
        node.outbox, node.slurm_dir, node.host, lambda _h, ev: deliveries.append(ev), tmp_path / "host"
    )
    for t in range(LENGTH_S + 1):
        advance(dirs, t, layout)
        watcher.poll(T0 + t * S)
    uses = [e for batch in deliveries for e in batch if e.kind == wire.pb.JobEvent.KIND_USE]
    assert {e.job_id for e in uses} == set(CORES) and len(uses) == 2 * LENGTH_S // 5  # one per job and period
    # one outbox delivery per period for every job (each delivery is an outbox directory of its own)
    assert all(
        {e.job_id for e in batch} == set(CORES) for batch in deliveries if batch[0].kind == wire.pb.JobEvent.KIND_USE
    )
    assert len({(e.job_id, e.event_seq) for e in uses}) == len(uses)
    assert all(e.use_device == "cpu:host" and e.use_metric == "cpu-time" for e in uses)

    store = store_with(tmp_path / "w.db", [*windows, *uses])
    attributed = 0.0
    for job_id, cores in CORES.items():
        report = build_report(store, job_id, ReportSettings(), now_ns=T0 + 120 * S)  # the default rule
        got = sum(c.energy_j for w in (report.warmup, report.saturated_window) for c in w.components.values())
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
    gpu_processes(tmp_path / "host", "v2")
    node, _ = open_jobs(tmp_path, monkeypatch)
    runs: list[list[wire.pb.JobEvent]] = [[], []]
    for sent, gpus in zip(runs, ({0: GPU_A, 1: GPU_B}, {1: GPU_B, 0: GPU_A}), strict=True):
        watcher = SlurmWatcher(
            node.outbox, node.slurm_dir, node.host, lambda _h, ev, s=sent: s.extend(ev), tmp_path / "host",
            gpus=lambda g=gpus: g, use_sources=lambda: [GpuUse(SHARED_SM)],
        )  # fmt: skip
        for t in (0, 5, 10):
            advance(dirs, t, "v2")
            watcher.poll(T0 + t * S)
    assert [e.kind for e in runs[0][:2]] == [wire.pb.JobEvent.KIND_OPEN] * 2  # the first agent took the notes
    uses = [[(e.job_id, e.event_seq, e.job_use) for e in run if e.kind == wire.pb.JobEvent.KIND_USE] for run in runs]
    assert uses[0] == uses[1] and len(uses[0]) == 2 * 2 * 2  # 2 jobs, 2 periods, CPU and GPU_A
    assert all(seq & 0xFFFFFFFF >= 1 << 30 for _, seq, _ in uses[0])  # the USE places of the block
    holders.drop(node.outbox, "101", "n1")


#: The agent's side, with the NVML stand-in: discovers the GPUs and runs one watcher pass,
#: printing the devices of the open events it made.
AGENT_PASS = """
import sys
from pathlib import Path
from wattline import wire
from wattline.agent.holders.slurm import node as slurm_node
from wattline.agent.holders.slurm.watch import SlurmWatcher, gpu_uuids
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
    scenario = Path(__file__).parents[1] / "nvml_stub/scenarios/two_gpus.txt"
    shown = []
    for nvml in (True, False):  # an agent without NVML claims them by index
        assert slurm_hooks.prolog(env, config, proc) == []
        stub = {"LD_LIBRARY_PATH": str(build_stub()), "WATTLINE_NVML_SCENARIO": str(scenario)} if nvml else {}
        done = subprocess.run(
            [sys.executable, "-c", AGENT_PASS, str(tmp_path / "outbox"), str(tmp_path / "slurm")],
            env={**os.environ, **stub}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        shown.append(done.stdout.strip())
    uuid = "GPU-0a1b2c3d-0000-4000-8000-00000000000"
    assert shown == [f"gpu:{uuid}1,gpu:{uuid}0", "gpu:1,gpu:0"]


#: The shared-GPU node: GPU_A time-sliced by job 101 (SLURM_JOB_GPUS=0 claims it), job 102
#: (given none: a shard, or a node whose devices are not constrained), a process of no Slurm
#: job and one of a job the agent did not open (999); GPU_B idle, its per-process use read;
#: job 103 uses CPU only.
GPU_A, GPU_B = "GPU-5f1c0e2a-0000-4000-8000-00000000000a", "GPU-5f1c0e2a-0000-4000-8000-00000000000b"
GPU_W = {GPU_A: 300.0, GPU_B: 60.0}
GPU_JOBS = {"101": 2.0, "102": 1.0, "103": 1.0}  #: cores each job keeps busy
#: Each GPU process's job ("": none) and the SM % of GPU_A it uses, per scenario.
OWNER = {7101: "101", 7102: "102", 7103: "", 7999: "999"}
SHARED_SM = {7101: 60.0, 7102: 20.0, 7103: 10.0, 7999: 5.0}


class GpuUse:
    """Per-process use as the NVML source gives it (:meth:`NvmlSource.process_use`): ``sm`` on GPU_A, GPU_B idle."""

    def __init__(self, sm: dict[int, float]) -> None:
        self.sm = sm

    def process_use(self, since_us: int | None = None) -> list[DeviceUse]:
        return [
            DeviceUse("gpu", GPU_A, "sm", frozenset(self.sm), dict(self.sm)),
            DeviceUse("gpu", GPU_B, "sm", frozenset(), {}),
        ]


def gpu_processes(root: Path, layout: str) -> None:
    """``/proc/PID/cgroup`` of the GPU processes as the kernel writes it for each layout."""
    for pid, job in OWNER.items():
        if not job:
            paths = ["user.slice/user-1000.slice/session-3.scope"]
        elif layout == "v1":
            paths = [f"slurm/uid_{UID}/job_{job}/step_0/task_0"]
        else:
            paths = [
                f"system.slice/slurmstepd.scope/{SLUIDS[job] if layout == '26.05' else f'job_{job}'}/step_0/user/task_0"
            ]
        text = (
            f"12:memory:/{paths[0]}\n5:cpu,cpuacct:/{paths[0]}\n1:name=systemd:/system.slice/slurmd.service\n"
            if layout == "v1"
            else f"0::/{paths[0]}\n"
        )
        (root / f"proc/{pid}").mkdir(parents=True, exist_ok=True)
        (root / f"proc/{pid}/cgroup").write_text(text)


def noted_at(path: Path, time_ns: int) -> None:
    """The hook's note as if written at ``time_ns`` (the scenario's clock)."""
    data = slurm_records.read_json(path)
    assert isinstance(data, dict)
    slurm_records.write_json(path, {**data, "time_ns": time_ns})


def open_gpu_jobs(config: Path, proc: Path) -> list[dict[str, str]]:
    """GPU_JOBS opened by the real prolog (101 given GPU 0); their hooks' environments."""
    envs = [
        {"SLURM_JOB_ID": job, "SLURM_JOB_UID": str(UID), "SLURMD_NODENAME": "n1"}
        | ({"SLURM_JOB_GPUS": "0"} if job == "101" else {})
        for job in GPU_JOBS
    ]
    for env in envs:
        assert slurm_hooks.prolog(env, config, proc) == []
    return envs


def run_gpu_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, sm: dict[int, float]
) -> list[wire.pb.JobEvent]:
    """GPU_JOBS opened by the real prolog at T0 and closed by the real epilog at T0 + LENGTH_S,
    the watcher polled every second of it; returns what it sent."""
    root, slurm_dir = tmp_path / "host", tmp_path / "slurm"
    dirs = cgroup_tree(root, layout, GPU_JOBS)
    gpu_processes(root, layout)
    config, proc = node_config(tmp_path), slurmd_proc(tmp_path / "proc")
    monkeypatch.setattr(slurm_node, "ask_controller", lambda *a, **k: slurm_node.Asked(None, 0.0))
    envs = open_gpu_jobs(config, proc)
    for env in envs:
        noted_at(slurm_dir / f"{env['SLURM_JOB_ID']}.open", T0)
    sent: list[wire.pb.JobEvent] = []
    watcher = SlurmWatcher(
        tmp_path / "outbox", slurm_dir, wire.Host(host_id="n1"), lambda _h, ev: sent.extend(ev), root,
        gpus=lambda: {0: GPU_A, 1: GPU_B}, use_sources=lambda: [GpuUse(sm)],
    )  # fmt: skip
    for t in range(LENGTH_S + 1):
        advance(dirs, t, layout, GPU_JOBS)
        if t == LENGTH_S:
            for env in envs:
                assert slurm_hooks.epilog(env, config) == []
                noted_at(slurm_dir / f"{env['SLURM_JOB_ID']}.close", T0 + LENGTH_S * S)
        watcher.poll(T0 + t * S)
    return sent


def gpu_truth(sm: dict[int, float], job: str) -> float:
    """The job's part of GPU_A's energy over the run: its processes' part of every process's use."""
    return GPU_W[GPU_A] * LENGTH_S * math.fsum(v for pid, v in sm.items() if OWNER[pid] == job) / math.fsum(sm.values())


def energy_by_component(store: SqliteStore, job_id: str) -> dict[str, float]:
    report = build_report(store, job_id, ReportSettings(), now_ns=T0 + 120 * S)  # the default share rule
    out: dict[str, float] = {}
    for window in (report.warmup, report.saturated_window):
        for name, comp in window.components.items():
            out[name] = out.get(name, 0.0) + comp.energy_j
    return out


@pytest.mark.parametrize("layout", ["v1", "v2", "26.05"])
def test_jobs_sharing_a_gpu_get_their_measured_shares(
    layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = run_gpu_node(tmp_path, monkeypatch, layout, SHARED_SM)
    opens = {e.job_id: e for e in sent if e.kind == wire.pb.JobEvent.KIND_OPEN}
    closes = {e.job_id: e for e in sent if e.kind == wire.pb.JobEvent.KIND_CLOSE}
    assert list(opens["101"].devices) == [f"gpu:{GPU_A}"] and not opens["102"].devices
    assert all(list(c.use_scope) == sorted(f"gpu:{u}" for u in GPU_W) for c in closes.values())
    gpu_uses = [e for e in sent if e.kind == wire.pb.JobEvent.KIND_USE and e.use_device != "cpu:host"]
    assert {e.use_device for e in gpu_uses} == {f"gpu:{GPU_A}"}  # nobody's processes ran on GPU_B
    for job in ("101", "102"):
        mine = [e for e in gpu_uses if e.job_id == job]
        assert len(mine) == LENGTH_S // 5  # one a period, the last one sent with the close
        assert sent.index(mine[-1]) < sent.index(closes[job])
        share = math.fsum(v for pid, v in SHARED_SM.items() if OWNER[pid] == job) / math.fsum(SHARED_SM.values())
        assert all(e.job_use / e.device_use == pytest.approx(share, rel=1e-9) for e in mine)
    assert len({(e.job_id, e.event_seq) for e in sent}) == len(sent)  # each event has a place of its own

    store = store_with(tmp_path / "w.db", sent, GPU_W)
    attributed = 0.0
    for job, cores in GPU_JOBS.items():
        got = energy_by_component(store, job)
        cpu_truth = CPU_W * LENGTH_S * cores / NODE_CORES
        assert got.get("cpu_package", 0.0) == pytest.approx(cpu_truth, rel=0.01), (layout, job, got)
        assert got.get("gpu", 0.0) == pytest.approx(gpu_truth(SHARED_SM, job), rel=0.01, abs=0.01), (layout, job, got)
        attributed += math.fsum(got.values())
    # The node's energy = the jobs' + what no job used: the other cores, GPU_A's other processes, GPU_B.
    node_j = (CPU_W + math.fsum(GPU_W.values())) * LENGTH_S
    rest = CPU_W * LENGTH_S * (NODE_CORES - sum(GPU_JOBS.values())) / NODE_CORES
    rest += gpu_truth(SHARED_SM, "") + gpu_truth(SHARED_SM, "999") + GPU_W[GPU_B] * LENGTH_S
    assert attributed + rest == pytest.approx(node_j, rel=0.01)
    report = build_report(store, "101", ReportSettings(), now_ns=T0 + 120 * S)
    [share_a] = [d for d in report.device_shares if d.device == GPU_A]
    assert share_a.basis == "measured share"
    assert share_a.unattributed_j == pytest.approx(gpu_truth(SHARED_SM, "") + gpu_truth(SHARED_SM, "999"), rel=0.01)


def test_a_process_of_no_slurm_job_counts_to_nobody(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a process outside every job uses GPU_A: not even job 101, which Slurm gave it, is charged it."""
    sent = run_gpu_node(tmp_path, monkeypatch, "v2", {7103: 30.0})
    gpu_uses = [e for e in sent if e.kind == wire.pb.JobEvent.KIND_USE and e.use_device != "cpu:host"]
    assert {e.job_id for e in gpu_uses} == {"101"} and all(e.job_use == 0 and e.device_use == 30 for e in gpu_uses)
    store = store_with(tmp_path / "w.db", sent, GPU_W)
    for job in GPU_JOBS:
        assert energy_by_component(store, job).get("gpu", 0.0) == pytest.approx(0.0, abs=0.01), job


#: The agent's side with the NVML stand-in's live processes: the watcher polled at the
#: scenario's seconds (a few ms apart in real time: the driver's samples are 20 ms apart),
#: the jobs closed by the epilog at the last; prints the GPU USE events and the closes.
STUB_PASS = """
import json, sys, time
from pathlib import Path
from wattline import wire
from wattline.agent.holders.slurm import node as slurm_node
from wattline.agent.usage.process_use import use_sources
from wattline.agent.holders.slurm.watch import SlurmWatcher, gpu_uuids
from wattline.agent.sources.nvml import NvmlSource
from wattline.jobs.wrappers import slurm_hooks
slurm_node.ask_controller = lambda *a, **k: slurm_node.Asked(None, 0.0)
tmp, root, config, envs, t0 = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4]), int(sys.argv[5])
src = NvmlSource()
channels = src.discover()
sent = []
watcher = SlurmWatcher(tmp / "outbox", tmp / "slurm", wire.Host(host_id="n1"), lambda h, ev: sent.extend(ev), root,
                       gpus=lambda: gpu_uuids(channels), use_sources=lambda: use_sources([src]))
for t in range(16):
    if t == 15:
        for env in envs:
            slurm_hooks.epilog(env, config)
    watcher.poll(t0 + t * 10**9)
    time.sleep(0.05)
src.close()
for e in sent:
    if e.kind == wire.pb.JobEvent.KIND_USE and e.use_device != "cpu:host":
        print(json.dumps(["use", e.job_id, e.use_device, e.job_use, e.device_use]))
    elif e.kind == wire.pb.JobEvent.KIND_CLOSE:
        print(json.dumps(["close", e.job_id, list(e.use_scope)]))
"""


def test_the_nvml_sources_processes_are_found_in_their_jobs(tmp_path: Path) -> None:
    """The real NVML source (stand-in library): live processes of jobs 101, 102 and of no job
    time-slice GPU_A at known SM %; each job's USE events give its part, each close the scope."""
    root = tmp_path / "host"
    cgroup_tree(root, "v2", GPU_JOBS)
    config, proc = node_config(tmp_path), slurmd_proc(tmp_path / "proc")
    sleepers = {owner: subprocess.Popen(["sleep", "60"]) for owner in ("101", "102", "")}
    sm = {"101": 60.0, "102": 20.0, "": 10.0}
    try:
        for owner, p in sleepers.items():
            path = f"system.slice/slurmstepd.scope/job_{owner}/step_0/user/task_0" if owner else "user.slice"
            (root / f"proc/{p.pid}").mkdir(parents=True)
            (root / f"proc/{p.pid}/cgroup").write_text(f"0::/{path}\n")
        procs = tmp_path / "procs.txt"
        procs.write_text("".join(f"0 {p.pid} {sm[o]} 5 {time.time() - 10} -\n" for o, p in sleepers.items()))
        scenario = tmp_path / "gpus.txt"
        scenario.write_text(
            "driver 550.54.15\n"
            f"gpu {GPU_A} NVIDIA H100 80GB HBM3\nenergy_model 100 1 {time.time()}\nsample_period_ms 20\n"
            f"gpu {GPU_B} NVIDIA H100 80GB HBM3\nenergy_model 60 0 {time.time()}\n"
        )
        envs = open_gpu_jobs(config, proc)
        stub = {"LD_LIBRARY_PATH": str(build_stub()), "WATTLINE_NVML_SCENARIO": str(scenario),
                "WATTLINE_NVML_PROCS": str(procs)}  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", STUB_PASS, str(tmp_path), str(root), str(config), json.dumps(envs), str(T0)],
            env={**os.environ, **stub}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        for p in sleepers.values():
            p.kill()
            p.wait()
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    uses = [line[1:] for line in lines if line[0] == "use"]
    assert {(job, device) for job, device, *_ in uses} == {("101", f"gpu:{GPU_A}"), ("102", f"gpu:{GPU_A}")}
    for job, _, job_use, device_use in uses:
        assert job_use / device_use == pytest.approx(sm[job] / math.fsum(sm.values()), rel=1e-6)
    assert len(uses) == 2 * 3  # one a period (5 s), the last one with the close
    closes = {line[1]: line[2] for line in lines if line[0] == "close"}
    assert closes == {job: sorted(f"gpu:{u}" for u in GPU_W) for job in GPU_JOBS}
