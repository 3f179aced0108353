"""Service pods (#44): a pod opted in by annotations is a service job whose units are counted
from its own Prometheus endpoint, scraped by the agent's pod watcher at every look.

The node's pod list is served over HTTPS (a test CA) as the kubelet serves ``/pods``, its pod
copied from the recorded v1.34 list (fixtures/kubernetes/podlists) and made a Deployment's
vLLM pod whose IP is this machine's loopback; a real HTTP server there exposes vLLM's
``vllm:request_success_total`` (the shape of fixtures/served_metrics/vllm_two_models_*.txt),
which the test advances by known numbers of requests, restarts (its counter lower, or a new
``_created``) and makes fail. The watcher's events go to a SQLite store; the job read back
must count exactly the requests the test served while an agent watched.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import json
import logging
import re
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pki import make_ca, make_cert
from procs import Proc, start_collector
from servers import free_port
from sysfs_trees import Zone, powercap_tree
from waits import wait_until

from wattline import wire
from wattline.agent.holders.kube.pod_units import endpoint_of
from wattline.agent.holders.kube.settings import KubeSettings
from wattline.agent.holders.kube.watcher import PodWatcher
from wattline.jobs.jobs_view import JobView, build_view
from wattline.stores.sqlite.store import SqliteStore

S = 10**9
T0 = 1_767_225_600 * S
NODE = "trn-node-2"
JOB = "k8s:serving/llama-chat"
RECORDED = Path(__file__).parents[1] / "fixtures/kubernetes/podlists/v1.34-kubelet.json"
GUIDE = Path(__file__).resolve().parents[2] / "docs/operations/kubernetes.md"
Kind = wire.pb.JobEvent
SERVICE_POD_UID = "5e1f7a2c-0b3d-4c8e-9f61-2a7d4b9c0e15"


def rfc3339(t_ns: int) -> str:
    return datetime.datetime.fromtimestamp(t_ns / S, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def service_pod(annotations: dict[str, str], started_ns: int | None, name: str = "llama-chat-7c9d8f6b5-x2x9z",
                uid: str = SERVICE_POD_UID) -> dict[str, Any]:  # fmt: skip
    """The recorded list's first pod made a Deployment's vLLM pod: running since ``started_ns``
    (None: pending, its container being created), its IP this machine's loopback."""
    pod = copy.deepcopy(json.loads(RECORDED.read_text())["items"][0])
    pod["metadata"].update(
        name=name, namespace="serving", uid=uid, labels={"app": "llama-chat", "pod-template-hash": "7c9d8f6b5"},
        annotations={"kubernetes.io/config.source": "api", "wattline.io/job": "llama-chat", **annotations},
        ownerReferences=[{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "llama-chat-7c9d8f6b5",
                          "uid": "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d", "controller": True}],
    )  # fmt: skip
    status = pod["status"]
    status.pop("initContainerStatuses", None)
    status["podIP"], status["podIPs"] = "127.0.0.1", [{"ip": "127.0.0.1"}]
    container = status["containerStatuses"][0]
    container["name"] = "vllm"
    if started_ns is None:
        status["phase"] = "Pending"
        container["state"] = {"waiting": {"reason": "ContainerCreating"}}
        container.pop("containerID")
    else:
        container["state"] = {"running": {"startedAt": rfc3339(started_ns)}}
    return pod


class Kubelet:
    """``GET /pods`` over HTTPS with the service account's token, listing ``items``."""

    def __init__(self, pki: Path) -> None:
        self.items: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ok = self.path == "/pods" and self.headers.get("Authorization") == "Bearer sa-token"
                body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": outer.items})
                self.send_response(200 if ok else 401)
                self.end_headers()
                self.wfile.write(body.encode() if ok else b"Unauthorized")

            def log_message(self, *_: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(pki / "kubelet.pem", pki / "kubelet.key")
        self.http.socket = tls.wrap_socket(self.http.socket, server_side=True)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.http.server_port}/pods"


class Vllm:
    """A vLLM server's /metrics: finished requests by reason for one model, as the test serves them.

    :meth:`serve` adds requests; :meth:`restart` starts the counters again (from 0, with a new
    ``_created``, or without ``_created`` at all); ``status`` other than 200 fails the scrape."""

    MODEL = "meta-llama/Llama-3.1-8B-Instruct"

    def __init__(self, created_s: float | None) -> None:
        self.counts = {"stop": 0, "length": 0}
        self.created_s = created_s
        self.status = 200
        self.delay_s = 0.0  #: how long it takes to answer
        self.served = 0  #: every request finished, across restarts: what the test expects counted
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                time.sleep(outer.delay_s)
                body = outer.exposition().encode()
                self.send_response(outer.status if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.end_headers()
                with contextlib.suppress(OSError):  # the scrape gave up waiting (a slow server)
                    self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.port = self.http.server_port

    def serve(self, stop: int, length: int = 0) -> None:
        self.counts["stop"] += stop
        self.counts["length"] += length
        self.served += stop + length

    def restart(self, created_s: float | None) -> None:
        self.counts = dict.fromkeys(self.counts, 0)
        self.created_s = created_s

    def exposition(self) -> str:
        name = "vllm:request_success"
        lines = [f"# HELP {name}_total Count of successfully processed requests.", f"# TYPE {name}_total counter"]
        labels = [f'engine="0",finished_reason="{reason}",model_name="{self.MODEL}"' for reason in self.counts]
        lines += [f"{name}_total{{{label}}} {float(n)}" for label, n in zip(labels, self.counts.values(), strict=True)]
        if self.created_s is not None:
            lines += [
                f"# HELP {name}_created Count of successfully processed requests.",
                f"# TYPE {name}_created gauge",
            ]
            lines += [f"{name}_created{{{label}}} {self.created_s}" for label in labels]
        return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def kubelet_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("kubelet-pki")
    make_ca(d, "ca")
    make_cert(d, "kubelet", "ca", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    return d


@pytest.fixture
def node(tmp_path: Path, kubelet_pki: Path) -> Iterator[tuple[Kubelet, KubeSettings]]:
    (tmp_path / "token").write_text("sa-token\n")
    kubelet = Kubelet(kubelet_pki)
    settings = KubeSettings(
        pods=True, pod_list_url=kubelet.url, token_file=str(tmp_path / "token"), ca_file=str(kubelet_pki / "ca.pem"),
        pod_resources_socket="",
    )  # fmt: skip
    yield kubelet, settings.validate()
    kubelet.http.shutdown()


def watcher(settings: KubeSettings, root: Path, sent: list[wire.pb.JobEvent]) -> PodWatcher:
    return PodWatcher(settings, wire.Host(host_id=NODE), root, lambda _h, events: sent.extend(events))


def stored(path: Path, events: list[wire.pb.JobEvent]) -> JobView:
    """The job as a report reads it back from a SQLite store given ``events``."""
    store = SqliteStore(path)
    batch = wire.Batch(stream_id="agent", seq=1, sent_ns=T0)
    batch.host.host_id = NODE
    batch.job_events.extend(events)
    assert store.write(batch).rejected == 0
    return build_view(JOB, store.job_events(JOB))


def units_of(events: list[wire.pb.JobEvent]) -> list[tuple[int, float]]:
    return [((e.time_ns - T0) // S, e.units) for e in events if e.kind == Kind.KIND_UNITS]


def test_a_service_pod_counts_its_servers_requests_through_restarts_and_a_failed_scrape(
    node: tuple[Kubelet, KubeSettings], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen pending, the pod's server is counted from 0 (3 requests before the first scrape);
    a failed scrape's requests count at the next good one; a restart (the counter lower, then
    higher but with a new ``_created``) loses and doubles nothing: the stored units are every
    request served, each scrape's what the server finished since the previous scrape."""
    kubelet, settings = node
    vllm = Vllm(created_s=(T0 + 2 * S) / S)
    pod = {"wattline.io/preset": "vllm", "wattline.io/metrics": f"{vllm.port}/metrics"}
    sent: list[wire.pb.JobEvent] = []
    w = watcher(settings, tmp_path / "host", sent)
    kubelet.items = [service_pod(pod, None)]
    w.poll(T0)
    kubelet.items = [service_pod(pod, T0 + 2 * S)]
    steps: list[tuple[int, Any]] = [
        (5, lambda: vllm.serve(3)),  # before the first scrape: the server started after the agent saw its pod
        (10, lambda: vllm.serve(4, 1)),
        (15, lambda: (vllm.serve(5, 1), setattr(vllm, "status", 503))),  # finished, but the scrape fails
        (20, lambda: (setattr(vllm, "status", 200), vllm.serve(2))),
        (25, lambda: (vllm.restart((T0 + 22 * S) / S), vllm.serve(1))),  # restarted: lower than before
        (30, lambda: vllm.serve(2)),
        (35, lambda: (vllm.restart((T0 + 31 * S) / S), vllm.serve(10, 5))),  # restarted: higher, new _created
    ]
    for t, step in steps:
        step()
        w.poll(T0 + t * S)
    vllm.serve(2)  # finished just before the pod's delete: counted by its last scrape, before the close
    kubelet.items = []  # deleted
    w.poll(T0 + 40 * S)

    (open_,) = [e for e in sent if e.kind == Kind.KIND_OPEN]
    assert open_.service and open_.unit_name == "requests" and open_.time_ns == T0 + 2 * S
    assert units_of(sent) == [(5, 3), (10, 5), (20, 6 + 2), (25, 1), (30, 2), (35, 15), (40, 2)]
    job = stored(tmp_path / "w.db", sent)
    assert job.service and job.unit_name == "requests"
    assert job.units_total == vllm.served == 36
    assert job.unit_intervals[0][:2] == (T0 + 2 * S, T0 + 5 * S)  # the first covers the time since the open
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("HTTP 503" in line for line in lines) == 1 and all("\n" not in line for line in lines)
    assert sum("reset" in line for line in lines) == 2, lines


def test_a_restarted_agent_counts_no_request_twice(
    node: tuple[Kubelet, KubeSettings], tmp_path: Path
) -> None:  # fmt: skip
    """A pod already serving when an agent first sees it is a baseline: its past requests are
    not counted, by the first agent nor by one restarted in the same look period (its first
    scrape, a baseline too, must not take the place of the last one before the restart); the
    requests served while no agent ran are lost, never doubled."""
    kubelet, settings = node
    vllm = Vllm(created_s=(T0 - 600 * S) / S)
    vllm.serve(100, 7)  # served before any agent watched
    kubelet.items = [service_pod({"wattline.io/count": "requests=vllm:request_success_total"}, T0 - 600 * S)]
    kubelet.items[0]["metadata"]["annotations"]["prometheus.io/port"] = str(vllm.port)
    sent: list[wire.pb.JobEvent] = []
    first = watcher(settings, tmp_path / "host", sent)
    counted = 0
    for t, n in ((0, 0), (5, 7), (10, 3)):
        vllm.serve(n)
        counted += n
        first.poll(T0 + t * S)
    vllm.serve(20)  # while no agent runs
    restarted = watcher(settings, tmp_path / "host", sent)
    for t, n in ((12, 0), (17, 4)):
        vllm.serve(n)
        counted += n
        restarted.poll(T0 + t * S)

    assert units_of(sent) == [(0, 0), (5, 7), (10, 3), (12, 0), (17, 4)]
    assert stored(tmp_path / "w.db", sent).units_total == counted == 14


def test_a_slow_endpoint_delays_a_look_by_half_the_poll_interval_at_most(
    node: tuple[Kubelet, KubeSettings], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On the clock (the agent's own looks): a server slower than the scrape's timeout (half a
    1 s poll interval) costs the look that much, is one line, and what it served counts at the
    next good scrape."""
    kubelet, settings = node
    vllm = Vllm(created_s=None)
    vllm.serve(40)  # before the agent: a baseline
    pod = {"wattline.io/preset": "vllm", "wattline.io/metrics": f"{vllm.port}/metrics"}
    kubelet.items = [service_pod(pod, time.time_ns() - 60 * S)]
    sent: list[wire.pb.JobEvent] = []
    w = watcher(dataclasses.replace(settings, poll_interval=1.0), tmp_path / "host", sent)
    w.poll()
    vllm.serve(5)
    vllm.delay_s = 1.5
    began = time.monotonic()
    w.poll()
    took = time.monotonic() - began
    vllm.delay_s = 0.0
    vllm.serve(2)
    w.poll()
    assert 0.5 <= took < 1.2, took
    assert [e.units for e in sent if e.kind == Kind.KIND_UNITS] == [0, 7]
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "timed out" in lines[0], lines


def test_replicas_on_one_node_are_one_job_counting_one_unit(
    node: tuple[Kubelet, KubeSettings], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two replicas of the Deployment on the node: one UNITS event per look with both servers'
    requests; a third pod of the job that counts another unit is one line and not counted."""
    kubelet, settings = node
    servers = [Vllm(created_s=None) for _ in range(3)]
    for server in servers:
        server.serve(50)  # before the agent
    count = ["requests=vllm:request_success_total"] * 2 + ["tokens=vllm:request_success_total"]
    kubelet.items = [
        service_pod({"wattline.io/count": spec, "wattline.io/metrics": str(server.port)}, T0 - 60 * S,
                    name=f"llama-chat-7c9d8f6b5-{n}", uid=SERVICE_POD_UID[:-1] + str(n))
        for n, (spec, server) in enumerate(zip(count, servers, strict=True))
    ]  # fmt: skip
    sent: list[wire.pb.JobEvent] = []
    w = watcher(settings, tmp_path / "host", sent)
    w.poll(T0)
    for server, n in zip(servers, (3, 4, 100), strict=True):
        server.serve(n)
    w.poll(T0 + 5 * S)
    assert units_of(sent) == [(0, 0), (5, 3 + 4)]
    # the first look's baselines take a place of their own (odd), the later looks' the other
    assert [e.event_seq & 1 for e in sent if e.kind == Kind.KIND_UNITS] == [1, 0]
    (open_,) = [e for e in sent if e.kind == Kind.KIND_OPEN]
    assert open_.unit_name == "requests"
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "llama-chat-7c9d8f6b5-2 counts tokens but its job counts requests" in lines[0], lines


@pytest.mark.parametrize(
    ("annotations", "said"),
    [
        ({"wattline.io/count": "requests=vllm:request_success_total by"}, "unit spec"),
        ({"wattline.io/preset": "vllm", "wattline.io/count": "r=x"}, "both are given"),
        ({"wattline.io/preset": "nginx", "wattline.io/metrics": "8000"}, "no preset 'nginx'"),
        ({"wattline.io/preset": "vllm", "wattline.io/metrics": "http://169.254.169.254/metrics"}, "PORT[/PATH]"),
        ({"wattline.io/preset": "vllm"}, "where are the metrics"),
        ({"wattline.io/metrics": "8000/metrics"}, "neither is given"),
    ],
)
def test_a_bad_annotation_is_one_line_and_the_job_is_still_made(
    node: tuple[Kubelet, KubeSettings], tmp_path: Path, caplog: pytest.LogCaptureFixture,
    annotations: dict[str, str], said: str,
) -> None:  # fmt: skip
    kubelet, settings = node
    sent: list[wire.pb.JobEvent] = []
    w = watcher(settings, tmp_path / "host", sent)
    kubelet.items = [service_pod(annotations, T0)]
    for t in (0, 5, 10):
        w.poll(T0 + t * S)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and said in lines[0] and "serving/llama-chat-7c9d8f6b5-x2x9z" in lines[0], lines
    (open_,) = [e for e in sent if e.kind == Kind.KIND_OPEN]
    assert open_.job_id == JOB and open_.service and not units_of(sent)


@pytest.mark.parametrize(
    ("annotations", "url"),
    [
        ({"wattline.io/metrics": "8000/metrics"}, "http://10.244.2.9:8000/metrics"),
        ({"wattline.io/metrics": ":8000/metrics/"}, "http://10.244.2.9:8000/metrics/"),
        ({"wattline.io/metrics": "9400"}, "http://10.244.2.9:9400/metrics"),
        ({"prometheus.io/port": "8080", "prometheus.io/path": "stats/prometheus"}, "http://10.244.2.9:8080/stats/prometheus"),
        ({"prometheus.io/port": "8080", "wattline.io/metrics": "8000"}, "http://10.244.2.9:8000/metrics"),
    ],
)  # fmt: skip
def test_where_a_service_pod_is_scraped(annotations: dict[str, str], url: str) -> None:
    found = endpoint_of({"wattline.io/count": "requests=vllm:request_success_total", **annotations})
    assert found is not None and found.url("10.244.2.9") == url
    assert found.url("fd00::9") == url.replace("10.244.2.9", "[fd00::9]")


def test_no_service_annotation_is_no_service() -> None:
    assert endpoint_of({"wattline.io/job": "x", "prometheus.io/port": "8000"}) is None
    with pytest.raises(ValueError, match="only http"):
        endpoint_of({"wattline.io/preset": "vllm", "prometheus.io/port": "8443", "prometheus.io/scheme": "https"})
    with pytest.raises(ValueError, match="PORT"):
        endpoint_of({"wattline.io/preset": "vllm", "wattline.io/metrics": "70000/metrics"})


def test_the_guides_deployment_is_a_service_and_its_policy_admits_the_agent_on_its_port() -> None:
    """The section's manifests are valid objects (strict schema), the Deployment's pods are a
    service counting vLLM's requests on the port its container opens, and the NetworkPolicy
    admits the agent's pods (labels of deploy/kubernetes) to exactly that port of them."""
    section = GUIDE.read_text().partition("## Services: units from a pod's own metrics")[2]
    docs = {
        doc["kind"]: doc for block in re.findall(r"```yaml\n(.*?)```", section, re.S) if (doc := yaml.safe_load(block))
    }
    for doc in docs.values():
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    template = docs["Deployment"]["spec"]["template"]
    found = endpoint_of(template["metadata"]["annotations"])
    assert found is not None and found.spec.name == "requests" and found.path == "/metrics"
    assert [p["containerPort"] for p in template["spec"]["containers"][0]["ports"]] == [found.port]
    policy = docs["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": found.port}]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "wattline-agent"}
    assert source["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "wattline"}


def test_an_agent_killed_and_restarted_while_a_service_pods_job_is_open_loses_and_doubles_nothing(
    tmp_path: Path, kubelet_pki: Path
) -> None:
    """The real agent (SIGKILL, then a new one on the same outbox) -> a real collector -> SQLite,
    the service pod's job open throughout: the restarted agent's running totals start again
    from 0 under the job's same event numbering, and the store still counts every request
    served while an agent watched, once (those served while none ran are not counted)."""
    kubelet = Kubelet(kubelet_pki)
    vllm = Vllm(created_s=time.time())
    (tmp_path / "token").write_text("sa-token\n")
    annotations = {"wattline.io/preset": "vllm", "wattline.io/metrics": f"{vllm.port}/metrics"}
    kubelet.items = [service_pod(annotations, None)]  # pending: its server is counted from 0
    root = powercap_tree(tmp_path / "host", [Zone("intel-rapl:0", "package-0")])
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[kubernetes]\npods = true\npod_list_url = "{kubelet.url}"\npoll_interval = 1\n'
        f'token_file = "{tmp_path / "token"}"\nca_file = "{kubelet_pki / "ca.pem"}"\npod_resources_socket = ""\n'
    )
    port, db = free_port(), tmp_path / "w.db"
    collector = start_collector(port, ["--store", f"sqlite:///{db}"], tmp_path / "collector.log")
    args = ["agent", "--config", str(config), "--host-id", NODE, "--sysfs-root", str(root), "--source", "rapl",
            "--interval", "0.25", "--batch-interval", "0.25", f"--collector=127.0.0.1:{port}",
            "--outbox-dir", str(tmp_path / "outbox"), "--edge-socket", "off", "--spool-dir", "memory"]  # fmt: skip

    def events(kind: str) -> list[Any]:
        return [e for e in SqliteStore(db).job_events(JOB) if e.event == kind]

    def units() -> float:
        return build_view(JOB, SqliteStore(db).job_events(JOB)).units_total

    agents = [Proc(args, tmp_path / "agent-1.log")]
    try:
        wait_until(lambda: "pod" in agents[0].log() or "sampling" in agents[0].log(), agents[0].log, timeout_s=30)
        time.sleep(1.5)  # a look sees it pending
        kubelet.items = [service_pod(annotations, time.time_ns())]
        vllm.serve(5)
        wait_until(lambda: events("open") and units() == 5, lambda: agents[0].log()[-2000:], timeout_s=30)
        agents[0].kill9()
        counted = 5
        vllm.serve(20)  # while no agent runs: not counted
        before = len(events("units"))
        agents.append(Proc(args, tmp_path / "agent-2.log"))
        wait_until(lambda: len(events("units")) > before, lambda: agents[1].log()[-2000:], timeout_s=30)  # its baseline
        vllm.serve(7)
        counted += 7
        wait_until(lambda: units() >= counted, lambda: agents[1].log()[-2000:], timeout_s=30)
        kubelet.items = []  # deleted: its job closes
        wait_until(lambda: events("close"), lambda: agents[1].log()[-2000:], timeout_s=30)
    finally:
        for agent in agents:
            if agent.alive():
                agent.terminate()
        collector.terminate()
        kubelet.http.shutdown()
        vllm.http.shutdown()
    assert len(events("open")) == 1  # one job across the restart
    # the reader counts from running totals only where they say it (they fell at the restart:
    # each event's own count then), so the 5 before and the 7 after, not 5 + 7 + 5
    assert units() == counted == 12
