"""Pods as jobs (README "Kubernetes pods"), at the kubelet's real interfaces.

A recorded node: pod lists served over HTTP by the test as the kubelet's ``/pods`` returns
them, the kubelet's pod-resources v1 service (from its proto) on a Unix socket, a cgroup v2
tree (systemd driver, containerd and CRI-O leaves) whose ``cpu.stat`` the test advances at
known rates, ``/proc/PID/cgroup`` of the GPU processes, and per-process GPU use at known
shares. The watcher's events and samples at known power go to a SQLite store; each pod's
job must get its constructed share within 1 % and the node's energy must be conserved.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from procs import start_collector, start_rapl_agent
from servers import free_port
from sysfs_trees import PowerAdvancer, Zone, powercap_tree
from typer.testing import CliRunner

from wattline import wire
from wattline.agent.kube.podlist import KubeSettings
from wattline.agent.kube.pods import job_of, parse_pod_list, pod_end
from wattline.agent.kube.watcher import PodWatcher
from wattline.agent.sources.use import DeviceUse
from wattline.cli.main import app
from wattline.collector.stores.sqlite import SqliteStore
from wattline.v1 import podresources_pb2 as pr
from wattline.v1 import podresources_pb2_grpc as pr_grpc
from wattline.workloads import Job
from wattline.workloads.report import build_report
from wattline.workloads.report_model import ReportSettings

S = 10**9
T0 = 1_767_225_600 * S
NODE = "gpu-node-7"
CPU_W, GPU_A_W, GPU_B_W = 100.0, 200.0, 300.0
#: Cores each pod keeps busy, and the whole node (the rest: system processes, node energy).
CORES = {"pt": 2.0, "batch": 1.0, "note": 0.5, "ts1": 0.25, "ts2": 0.25}
NODE_CORES = 5.0
GPU_B_USE = {"ts1": 30.0, "ts2": 10.0}  #: SM % of the time-sliced GPU per pod
LENGTH_S = 60
UIDS = {name: f"{n:08x}-0000-4000-8000-{n:012x}" for n, name in enumerate([*CORES, "web"], start=1)}
PIDS = {"ts1": 101, "ts2": 102}


def rfc3339(t_ns: int) -> str:
    """A Kubernetes time stamp (with the fraction the end-to-end test's clock needs)."""
    return datetime.datetime.fromtimestamp(t_ns / S, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _pod(
    name: str, owner: tuple[str, str, str] | None, annotations: dict[str, str], phase: str,
    start_ns: int = T0, end_ns: int = T0 + LENGTH_S * S,
) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": UIDS[name], "annotations": annotations}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": owner[0], "kind": owner[1], "name": owner[2],
                                    "uid": "25a8decc-c279-4939-8a78-2c1d60675542", "controller": True}]  # fmt: skip
    stamp = rfc3339(start_ns)
    state: dict[str, Any] = {"running": {"startedAt": stamp}}
    if phase != "Running":
        state = {"terminated": {"exitCode": 0 if phase == "Succeeded" else 137, "startedAt": stamp,
                                "reason": "Completed" if phase == "Succeeded" else "OOMKilled",
                                "finishedAt": rfc3339(end_ns)}}  # fmt: skip
    status = {"phase": phase, "qosClass": "Burstable", "startTime": stamp, "containerStatuses": [
        {"name": "main", "containerID": "containerd://" + "f9" * 32, "restartCount": 0, "state": state}]}  # fmt: skip
    return {"metadata": meta, "spec": {"nodeName": NODE}, "status": status}


def pod_list(phase: str, start_ns: int = T0, end_ns: int = T0 + LENGTH_S * S) -> dict[str, Any]:
    """The node's /pods: a PyTorchJob worker, a batch Job pod, an annotated notebook, two pods
    time-slicing one GPU (annotated), and a Deployment's pod that stays node energy."""
    times = (start_ns, end_ns)
    items = [
        _pod("pt", ("kubeflow.org/v1", "PyTorchJob", "llama-ft"), {}, phase, *times),
        _pod("batch", ("batch/v1", "Job", "embed-batch"), {}, "Failed" if phase != "Running" else phase, *times),
        _pod("note", None, {"wattline.io/job": "nb-alice"}, phase, *times),
        _pod("ts1", None, {"wattline.io/job": "infer-1"}, phase, *times),
        _pod("ts2", None, {"wattline.io/job": "infer-2"}, phase, *times),
        _pod("web", ("apps/v1", "ReplicaSet", "web-7d9"), {}, "Running", *times),
    ]
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}


class Kubelet:
    """The kubelet's /pods over HTTP (the test sets what it lists) and its pod-resources socket."""

    def __init__(self, socket: Path) -> None:
        self.reply: dict[str, Any] = pod_list("Running")
        #: When set, each request's reply is made at the request (the end-to-end test's clock).
        self.make_reply: Callable[[], dict[str, Any]] | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(outer.make_reply() if outer.make_reply else outer.reply).encode()
                ok = self.path == "/pods" and self.headers.get("Authorization") == "Bearer sa-token"
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body if ok else b"Unauthorized")

            def log_message(self, *_: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_port}/pods"
        self.grpc = grpc.server(futures.ThreadPoolExecutor(2))
        pr_grpc.add_PodResourcesListerServicer_to_server(Lister(), self.grpc)  # type: ignore[no-untyped-call]
        self.grpc.add_insecure_port(f"unix://{socket}")
        self.grpc.start()

    def close(self) -> None:
        self.http.shutdown()
        self.grpc.stop(None)


class Lister(pr_grpc.PodResourcesListerServicer):
    """pod-resources v1 List: llama-ft holds GPU-a whole; the two inference pods a replica each of GPU-b."""

    def List(self, request: pr.ListPodResourcesRequest, context: object) -> pr.ListPodResourcesResponse:
        def pod(name: str, resource: str, ids: list[str]) -> pr.PodResources:
            devices = [pr.ContainerDevices(resource_name=resource, device_ids=ids)]
            return pr.PodResources(
                name=name, namespace="team-a", containers=[pr.ContainerResources(name="main", devices=devices)]
            )

        return pr.ListPodResourcesResponse(pod_resources=[
            pod("pt", "nvidia.com/gpu", ["GPU-a"]),
            pod("ts1", "nvidia.com/gpu", ["GPU-b::1"]),
            pod("ts2", "nvidia.com/gpu", ["GPU-b::2"]),
        ])  # fmt: skip


class GpuUse:
    """Per-process use as the NVML source gives it: GPU-b time-sliced at known SM %, GPU-a idle."""

    def process_use(self, since_us: int | None = None) -> list[DeviceUse]:
        use = {PIDS[name]: value for name, value in GPU_B_USE.items()}
        return [
            DeviceUse("gpu", "GPU-b", "sm", frozenset(use), use),
            DeviceUse("gpu", "GPU-a", "sm", frozenset(), {}),
        ]


def cgroup_tree(root: Path) -> dict[str, Path]:
    """A cgroup v2 tree, systemd driver: each pod's cgroup with a containerd (or CRI-O) leaf."""
    base = root / "sys/fs/cgroup"
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("cpu io memory pids\n")
    dirs = {}
    for n, (name, uid) in enumerate(UIDS.items()):
        under = uid.replace("-", "_")
        pod = base / f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice"
        leaf = pod / (f"cri-containerd-{'f9' * 32}.scope" if n % 2 else f"crio-{'ab' * 32}.scope")
        leaf.mkdir(parents=True)
        dirs[name] = pod
        if name in PIDS:
            proc = root / "proc" / str(PIDS[name])
            proc.mkdir(parents=True)
            (proc / "cgroup").write_text(f"0::/{leaf.relative_to(base)}\n")
    dirs[""] = base
    return dirs


def advance(dirs: dict[str, Path], t_s: float) -> None:
    """Every cgroup's CPU time at ``t_s`` s after T0 (the root counts the whole node)."""
    for name, directory in dirs.items():
        cores = NODE_CORES if name == "" else CORES.get(name, 0.0)
        # Replaced whole (rename): a reader never sees a half-written file.
        temporary = directory / "cpu.stat.new"
        temporary.write_text(f"usage_usec {int(cores * t_s * 1e6)}\nuser_usec 0\nsystem_usec 0\n")
        temporary.replace(directory / "cpu.stat")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Kubelet, PodWatcher, dict[str, Path], list[wire.pb.JobEvent]]]:
    root = tmp_path / "host"
    dirs = cgroup_tree(root)
    (tmp_path / "token").write_text("sa-token\n")
    kubelet = Kubelet(tmp_path / "kubelet.sock")
    settings = KubeSettings(
        pods=True, pod_list_url=kubelet.url, token_file=str(tmp_path / "token"),
        pod_resources_socket=str(tmp_path / "kubelet.sock"),
    )  # fmt: skip
    sent: list[wire.pb.JobEvent] = []
    watcher = PodWatcher(settings.validate(), wire.Host(host_id=NODE), root, lambda _h, ev: sent.extend(ev),
                         lambda: [GpuUse()])  # fmt: skip
    yield kubelet, watcher, dirs, sent
    kubelet.close()


def run_node(kubelet: Kubelet, watcher: PodWatcher, dirs: dict[str, Path], end_phase: str = "Succeeded") -> None:
    for t in range(0, LENGTH_S + 1, 5):
        advance(dirs, t)
        watcher.poll(T0 + t * S)
    kubelet.reply = pod_list(end_phase)
    watcher.poll(T0 + (LENGTH_S + 5) * S)


def store_with(path: Path, events: list[wire.pb.JobEvent]) -> SqliteStore:
    """Samples at known power (1 s, T0-5 s .. end+5 s) and the watcher's events."""
    store = SqliteStore(path)
    batch = wire.Batch(stream_id="agent", seq=1, sent_ns=T0)
    batch.host.host_id = NODE
    series = [("rapl", "cpu_package", "package-0", CPU_W), ("nvml", "gpu", "GPU-a", GPU_A_W),
              ("nvml", "gpu", "GPU-b", GPU_B_W)]  # fmt: skip
    for source, component, device, watts in series:
        for i in range(-5, LENGTH_S + 10):
            batch.samples.add(source=source, component=component, device=device, quality=wire.QUALITY_COUNTER,
                              healthy=True, start_ns=T0 + i * S, end_ns=T0 + (i + 1) * S, energy_j=watts,
                              power_w=watts, cumulative_j=watts * (i + 6))  # fmt: skip
    batch.job_events.extend(events)
    assert store.write(batch).rejected == 0
    return store


def total_j(store: SqliteStore, job_id: str) -> tuple[float, dict[str, float]]:
    report = build_report(store, job_id, ReportSettings(share_rule="cpu-time"), now_ns=T0 + 120 * S)  # type: ignore[arg-type]
    parts: dict[str, float] = {}
    for window in (report.warmup, report.measured):
        for name, comp in window.components.items():
            parts[name] = parts.get(name, 0.0) + comp.energy_j
    return sum(parts.values()), parts


def test_pods_become_jobs_with_their_constructed_shares(
    node: tuple[Kubelet, PodWatcher, dict[str, Path], list[wire.pb.JobEvent]], tmp_path: Path
) -> None:
    kubelet, watcher, dirs, sent = node
    run_node(kubelet, watcher, dirs)
    opens = {e.job_id: e for e in sent if e.kind == wire.pb.JobEvent.KIND_OPEN}
    closes = {e.job_id: e for e in sent if e.kind == wire.pb.JobEvent.KIND_CLOSE}
    ids = {"pt": "k8s:team-a/llama-ft:25a8decc", "batch": "k8s:team-a/embed-batch:25a8decc",
           "note": "k8s:team-a/nb-alice", "ts1": "k8s:team-a/infer-1", "ts2": "k8s:team-a/infer-2"}  # fmt: skip
    assert set(opens) == set(ids.values()) == set(closes)  # the Deployment's pod is no job
    assert opens[ids["pt"]].labels["owner_kind"] == "PyTorchJob" and list(opens[ids["pt"]].devices) == ["gpu:GPU-a"]
    assert list(opens[ids["ts1"]].devices) == []  # a replica is a share, not a claim
    assert closes[ids["batch"]].pod_end == "oom_killed" and closes[ids["batch"]].exit_code == 137
    assert closes[ids["pt"]].pod_end == "succeeded" and closes[ids["pt"]].time_ns == T0 + LENGTH_S * S
    assert len({(e.job_id, e.event_seq) for e in sent}) == len(sent)  # each event once
    store = store_with(tmp_path / "w.db", sent)
    jobs_cores = sum(CORES.values())
    attributed = 0.0
    for name, job_id in ids.items():
        got, parts = total_j(store, job_id)
        truth = CPU_W * LENGTH_S * CORES[name] / NODE_CORES
        truth += GPU_A_W * LENGTH_S if name == "pt" else 0.0
        truth += GPU_B_W * LENGTH_S * GPU_B_USE[name] / sum(GPU_B_USE.values()) if name in GPU_B_USE else 0.0
        assert got == pytest.approx(truth, rel=0.01), (name, parts)
        attributed += got
    node_j = (CPU_W + GPU_A_W + GPU_B_W) * LENGTH_S
    unattributed = CPU_W * LENGTH_S * (NODE_CORES - jobs_cores) / NODE_CORES
    assert attributed + unattributed == pytest.approx(node_j, rel=1e-6)


def test_a_restarted_agent_sends_the_same_events(
    node: tuple[Kubelet, PodWatcher, dict[str, Path], list[wire.pb.JobEvent]], tmp_path: Path
) -> None:
    _kubelet, watcher, dirs, sent = node
    advance(dirs, 0)
    watcher.poll(T0 + 2 * S)
    again: list[wire.pb.JobEvent] = []
    restarted = PodWatcher(watcher.settings, watcher.host, watcher.root, lambda _h, ev: again.extend(ev))
    restarted.poll(T0 + 3 * S)
    key = {(e.job_id, e.kind, e.event_seq, e.time_ns) for e in sent if e.kind != wire.pb.JobEvent.KIND_USE}
    assert key == {(e.job_id, e.kind, e.event_seq, e.time_ns) for e in again if e.kind != wire.pb.JobEvent.KIND_USE}


def test_a_failing_pod_list_is_one_line_and_jobs_keep_their_lease(
    node: tuple[Kubelet, PodWatcher, dict[str, Path], list[wire.pb.JobEvent]], caplog: pytest.LogCaptureFixture
) -> None:
    kubelet, watcher, _dirs, sent = node
    watcher.poll(T0)
    kubelet.reply = {"kind": "Status"}  # not a pod list
    for t in (31, 62):
        watcher.poll(T0 + t * S)
    assert [r.message for r in caplog.records if "not a PodList" in r.message][:1]
    assert sum(1 for r in caplog.records if "not a PodList" in r.message) == 1
    beats = [e for e in sent if e.kind == wire.pb.JobEvent.KIND_HEARTBEAT]
    assert len(beats) == 5 * 3 and not [e for e in sent if e.kind == wire.pb.JobEvent.KIND_CLOSE]


def test_deleted_and_evicted_pods_and_bad_names() -> None:
    doc = pod_list("Running")
    doc["items"][0]["metadata"]["namespace"] = "Bad_NS"  # not a namespace the API server allows: skipped
    doc["items"][2]["metadata"]["annotations"]["wattline.io/job"] = "x" * 100  # not a job name: no job
    pods = parse_pod_list(doc)
    assert [p.name for p in pods] == ["batch", "note", "ts1", "ts2", "web"]
    assert job_of(pods[1]) is None
    deleted = pod_end(pods[0], vanished=True, now_ns=T0)
    assert (deleted.state, deleted.exit_code, deleted.time_ns) == ("deleted", 143, T0)
    evicted = dict(doc["items"][1], status={"phase": "Failed", "reason": "Evicted"})
    assert pod_end(parse_pod_list({"items": [evicted]})[0], False, T0).state == "evicted"
    with pytest.raises(ValueError, match="not a PodList"):
        parse_pod_list({"kind": "Status"})


def events_file(root: Path, name: str) -> Path:
    """Where pod ``name``'s emptyDir "wattline" keeps its events file on the node (the kubelet's layout)."""
    directory = root / "var/lib/kubelet/pods" / UIDS[name] / "volumes/kubernetes.io~empty-dir/wattline"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / "events"


#: The annotated notebook pod's container environment, as its spec sets it (README "Units from inside").
POD_ENV = [
    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    {"name": "WATTLINE_JOB", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['wattline.io/job']"}}},
    {"name": "WATTLINE_JOB_ID", "value": "k8s:$(POD_NAMESPACE)/$(WATTLINE_JOB)"},
    {"name": "WATTLINE_EVENTS", "value": "/wattline/events"},
]


def test_a_pod_counts_its_own_units_from_inside(
    node: tuple[Kubelet, PodWatcher, dict[str, Path], list[wire.pb.JobEvent]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The notebook pod writes ``units`` lines at known times and runs ``Job(...)``; two other
    pods try to reach it (a symlink to its file, a FIFO): only the notebook's job counts units."""
    kubelet, watcher, dirs, sent = node
    advance(dirs, 0)
    watcher.poll(T0)
    note = events_file(watcher.root, "note")
    with note.open("a") as fh:  # as `echo "units N T" >> $WATTLINE_EVENTS` in the pod
        fh.write(f"units 10 {(T0 + 10 * S) / S}\nunits 5 {(T0 + 20 * S) / S}\nunits 7")  # the last line unfinished
    events_file(watcher.root, "ts1").symlink_to(note)
    os.mkfifo(events_file(watcher.root, "ts2"))
    polled = threading.Thread(target=watcher.poll, args=(T0 + 25 * S,), daemon=True)
    polled.start()
    polled.join(10)
    assert not polled.is_alive(), "a FIFO blocked the watcher"
    with note.open("a") as fh:
        fh.write(f" {(T0 + 27 * S) / S}\n")

    # The pod's own Python: Job(...) with the environment its spec gives (downward API).
    downward = {"metadata.namespace": "team-a", "metadata.annotations['wattline.io/job']": "nb-alice"}
    env: dict[str, str] = {}
    for e in POD_ENV:  # as the kubelet builds it: fieldRefs, then $(VAR) of the variables above
        ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        env[e["name"]] = downward[ref] if ref else re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
        monkeypatch.setenv(e["name"], env[e["name"]])
    monkeypatch.setenv("WATTLINE_EVENTS", str(note))  # /wattline/events inside the pod
    with Job("notebook") as job:
        job.add_units(3)
    assert job.job_id == "k8s:team-a/nb-alice"  # the id the agent gives the pod's job
    assert os.stat(note).st_mode & 0o004  # the agent, another user, can read what Job wrote
    watcher.poll(T0 + 30 * S)
    kubelet.reply = pod_list("Succeeded")
    watcher.poll(T0 + 65 * S)

    units = [(e.job_id, e.units, e.time_ns) for e in sent if e.kind == wire.pb.JobEvent.KIND_UNITS]
    assert {u[0] for u in units} == {"k8s:team-a/nb-alice"}  # no other pod reached it
    assert [(u[1], u[2]) for u in units[:3]] == [(10, T0 + 10 * S), (5, T0 + 20 * S), (7, T0 + 27 * S)]
    assert [u[1] for u in units[3:]] == [3]
    store = store_with(tmp_path / "w.db", sent)
    report = build_report(store, "k8s:team-a/nb-alice", ReportSettings(share_rule="cpu-time"), now_ns=T0 + 120 * S)  # type: ignore[arg-type]
    assert report.units_warmup + report.units_measured == 25


def test_pod_jobs_end_to_end_through_agent_collector_and_store(tmp_path: Path) -> None:
    """The real ``wattline agent`` (RAPL at a known power, its pod watcher on the recorded
    node) -> a real collector -> SQLite; ``wattline report`` gives each pod-job its CPU-time
    share of the package energy within 1 %, ``wattline jobs`` lists them with how they ended."""
    root = tmp_path / "host"
    dirs = cgroup_tree(root)
    powercap_tree(root, [Zone("intel-rapl:0", "package-0", 0)])
    power = PowerAdvancer(root, {"intel-rapl:0": CPU_W})
    (tmp_path / "token").write_text("sa-token\n")
    kubelet = Kubelet(tmp_path / "kubelet.sock")
    # The clock of the recorded pods: they start at the agent's first look at the list, and
    # end at its last look before the test ends them (each look also reads their CPU time).
    seen: list[int] = []
    span: dict[str, int] = {}

    def reply() -> dict[str, Any]:
        now = time.time_ns()
        if "end" in span:
            return pod_list("Succeeded", span["start"], span["end"])
        span.setdefault("start", now)
        seen.append(now)
        return pod_list("Running", span["start"])

    kubelet.make_reply = reply
    stop = threading.Event()

    def cpu() -> None:  # each cgroup's counter at its constant rate since the pods started
        while not stop.wait(0.02):
            if "start" in span:
                advance(dirs, (time.time_ns() - span["start"]) / S)

    advance(dirs, 0)  # the cgroups exist with their counters before the agent first looks
    threading.Thread(target=cpu, daemon=True).start()
    (tmp_path / "wattline.toml").write_text(
        f'[agent]\noutbox_dir = "{tmp_path / "outbox"}"\n'
        f'[kubernetes]\npods = true\npod_list_url = "{kubelet.url}"\npoll_interval = 1\n'
        f'token_file = "{tmp_path / "token"}"\npod_resources_socket = "{tmp_path / "kubelet.sock"}"\n'
    )
    port = free_port()
    store = f"sqlite:///{tmp_path / 'w.db'}"
    collector = start_collector(port, ["--store", store], tmp_path / "collector.log")
    agent = start_rapl_agent(NODE, root, port, 0.5, tmp_path / "agent.log", "--config", str(tmp_path / "wattline.toml"))
    try:
        deadline = time.monotonic() + 60
        while len(seen) < 12 and time.monotonic() < deadline:  # about 11 s of measured pods
            time.sleep(0.1)
        assert len(seen) >= 12, agent.log()[-3000:]
        span["end"] = seen[-1]
        while time.monotonic() < deadline and not _closed(store, 5):
            time.sleep(0.5)
        time.sleep(2)  # the samples up to the close reach the store (batches every 0.5 s)
    finally:
        stop.set()
        agent.terminate()
        collector.terminate()
        power.close()
        kubelet.close()
    length_s = (span["end"] - span["start"]) / S
    runner = CliRunner()
    ids = {"pt": "k8s:team-a/llama-ft:25a8decc", "batch": "k8s:team-a/embed-batch:25a8decc",
           "note": "k8s:team-a/nb-alice", "ts1": "k8s:team-a/infer-1", "ts2": "k8s:team-a/infer-2"}  # fmt: skip
    for name, job_id in ids.items():
        result = runner.invoke(app, ["report", job_id, "--store", store, "--share-rule", "cpu-time", "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        truth = CPU_W * length_s * CORES[name] / NODE_CORES
        got = doc["measured"]["energy_j"] + doc["warmup"]["energy_j"]
        assert got == pytest.approx(truth, rel=0.01), (name, got, truth)
    result = runner.invoke(app, ["jobs", "--store", store, "--json", "--no-energy"])
    assert result.exit_code == 0, result.output
    listed = {j["id"]: j for j in json.loads(result.output)}
    assert set(listed) == set(ids.values())  # the Deployment's pod is no job
    for name, job_id in ids.items():
        job = listed[job_id]
        assert (job["labels"]["namespace"], job["labels"]["pod"]) == ("team-a", name)
        assert (job["status"], job["exit_code"]) == ("closed", 137 if name == "batch" else 0)


def _closed(store: str, count: int) -> bool:
    """Whether ``count`` job closes are in the SQLite store yet."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{store.removeprefix('sqlite:///')}?mode=ro", uri=True) as db:
            return int(db.execute("SELECT count(*) FROM job_events WHERE event = 'close'").fetchone()[0]) >= count
    except sqlite3.Error:
        return False
