"""Part "pods": what a pod that is not selected costs the pod watcher per tick (issue #31).

One node's pod list served over local HTTP as the kubelet's ``/pods`` (each item in the shape
a kubelet serves, about 2 KiB: labels, owner, spec, status with one container), with
``JOBS`` selected pods (batch Jobs) and 0 or N other pods (a Deployment's, node energy).
The watcher (``PodWatcher.poll``: fetch, parse, track, CPU time of the jobs' cgroups, events)
polls it back to back; its own thread's CPU time per poll (``time.thread_time``: the server's
thread is not counted) is the figure, the median of ``REPEATS`` runs of ``POLLS`` polls.
Side by side: no other pod vs N, their ratio, and the cost of one more unselected pod
against the yardstick no watcher of this list can avoid, measured the same way: the GET
and ``json.loads`` of its share of the reply (the kubelet's ``/pods`` has no selector)
plus one set lookup.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.agent.holders.kube.settings import KubeSettings
from wattline.agent.holders.kube.watcher import PodWatcher

JOBS = 5
OTHERS = (0, 100, 500)
POLLS, REPEATS = 60, 3
NS = 10**9


def uid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def item(n: int, selected: bool) -> dict[str, Any]:
    """Pod ``n`` as the kubelet lists it: a batch Job's (selected) or a Deployment's."""
    owner = ("batch/v1", "Job", f"train-{n}") if selected else ("apps/v1", "ReplicaSet", f"web-{n % 7}-5f7d8c9b6")
    labels = {"app": "web", "pod-template-hash": "5f7d8c9b6", "team": "a"} if not selected else {"job-name": owner[2]}
    cid = "containerd://" + f"{n:064x}"
    return {
        "metadata": {
            "name": f"{owner[2]}-{n:05d}", "namespace": "team-a", "uid": uid(n), "labels": labels,
            "annotations": {"kubernetes.io/config.seen": "2026-03-02T10:15:02.118Z",
                            "kubernetes.io/config.source": "api"},
            "ownerReferences": [{"apiVersion": owner[0], "kind": owner[1], "name": owner[2], "uid": uid(10**6 + n),
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"nodeName": "node-1", "restartPolicy": "Always", "serviceAccountName": "default",
                 "containers": [{"name": "main", "image": "registry.local/app:1", "resources": {
                     "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}}]},
        "status": {"phase": "Running", "qosClass": "Burstable", "hostIP": "10.0.0.1", "podIP": "10.244.0.9",
                   "startTime": "2026-03-02T10:15:03Z",
                   "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-03-02T10:15:09Z"}
                                  for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                            "PodScheduled")],
                   "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "started": True,
                                          "image": "registry.local/app:1",
                                          "imageID": "registry.local/app@sha256:" + "ab" * 32, "containerID": cid,
                                          "state": {"running": {"startedAt": "2026-03-02T10:15:41Z"}}}]},
    }  # fmt: skip


def node(root: Path, others: int) -> tuple[bytes, list[str]]:
    """The /pods reply and a cgroup v2 tree (systemd driver) with every pod's cgroup."""
    base = root / "sys/fs/cgroup"
    base.mkdir(parents=True, exist_ok=True)
    (base / "cgroup.controllers").write_text("cpu memory\n")
    (base / "cpu.stat").write_text("usage_usec 1000000\n")
    items = [item(n, n < JOBS) for n in range(JOBS + others)]
    for n in range(JOBS + others):
        pod = base / f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid(n).replace('-', '_')}.slice"
        pod.mkdir(parents=True, exist_ok=True)
        (pod / "cpu.stat").write_text("usage_usec 1000\n")
    body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}).encode()
    return body, [uid(n) for n in range(JOBS + others)]


def serve(body: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def per_poll_ms(root: Path, url: str, polls: int) -> float:
    """The watcher thread's CPU ms per poll, after three polls that open the jobs."""
    settings = KubeSettings(pods=True, pod_list_url=url, token_file="", pod_resources_socket="").validate()
    watcher = PodWatcher(settings, wire.Host(host_id="node-1"), root, lambda _h, _e: None)
    t = time.time_ns()
    for i in range(3):
        watcher.poll(t + i * NS)
    assert len(watcher.jobs) == JOBS, watcher.errors
    start = time.thread_time()
    for i in range(polls):
        watcher.poll(t + (3 + i) * NS)
    return (time.thread_time() - start) / polls * 1e3


def floor_us(url: str, uids: list[str], loops: int) -> float:
    """µs per poll no watcher of this list avoids: the GET, decoding the reply, one set lookup per pod."""
    known = set(uids)
    start = time.thread_time()
    for _ in range(loops):
        with urllib.request.urlopen(url, timeout=10) as reply:
            doc = json.loads(reply.read())
        sum(1 for i in doc["items"] if i["metadata"]["uid"] in known)
    return (time.thread_time() - start) / loops * 1e6


def run(work: Path, quick: bool) -> dict[str, Any]:
    polls = 20 if quick else POLLS
    out: dict[str, Any] = {"jobs": JOBS, "polls": polls, "repeats": REPEATS, "others": {}}
    for others in OTHERS:
        root = work / f"node-{others}"
        body, uids = node(root, others)
        server = serve(body)
        url = f"http://127.0.0.1:{server.server_port}/pods"
        try:  # alternated, so that a busy moment of the machine hits both
            ms_runs, floor_runs = [], []
            for _ in range(REPEATS):
                ms_runs.append(per_poll_ms(root, url, polls))
                floor_runs.append(floor_us(url, uids, polls))
        finally:
            server.shutdown()
            server.server_close()
        ms, floor = statistics.median(ms_runs), statistics.median(floor_runs)
        out["others"][str(others)] = {"poll_ms": ms, "list_bytes": len(body), "decode_and_lookup_us": floor}
    none = out["others"]["0"]
    for key, d in out["others"].items():
        n = int(key)
        d["ratio_to_none"] = d["poll_ms"] / none["poll_ms"]
        if n:
            d["us_per_other_pod"] = (d["poll_ms"] - none["poll_ms"]) * 1e3 / n
            d["floor_us_per_other_pod"] = (d["decode_and_lookup_us"] - none["decode_and_lookup_us"]) / n
    return out
