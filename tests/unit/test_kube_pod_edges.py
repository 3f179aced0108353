"""Pod-jobs that start and end between two looks at the pod list (issue #42, item 2): each is
charged its CPU share from its first container's start to its end, at the default 5 s poll.

A recorded node (tests/e2e/test_kube_pods.py's kubelet over HTTPS, cgroup v2 tree) on the
watcher's own clock: the test sets each pod's life (created, started, ended: succeeded,
OOM-killed, or deleted with its cgroup gone at once) between looks, and each cgroup's CPU time
at every look from known rates (the system's processes at ``SYSTEM_CORES`` all along). The
node draws ``CPU_W``; a pod-job's truth is ``CPU_W`` x its CPUs over every busy CPU, integrated
over its window (its start to its end; a deleted pod's window ends when the list no longer
has it, and it used nothing after its deletion). Within 1 % where its CPU time was read to its
end; where it could not be (a deleted pod's last stretch), within the report's bound, and the
bound no wider than that stretch's energy.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_kube_pods import CPU_W, NODE, UIDS, Kubelet, _pod, kubelet_pki, rfc3339

from wattline import wire
from wattline.agent.holders.kube.settings import KubeSettings
from wattline.agent.holders.kube.watcher import PodWatcher
from wattline.reports.build import build_report
from wattline.reports.model import ReportSettings
from wattline.stores.sqlite.store import SqliteStore

__all__ = ["kubelet_pki"]  # the fixture the test uses, from tests/e2e/test_kube_pods.py

S = 10**9
T0 = 1_767_225_600 * S
POLL_S = 5.0  #: the default poll (kubernetes.poll_interval)
SYSTEM_CORES = 0.5
LENGTH_S = 150


@dataclass(frozen=True)
class Life:
    """A pod's life, seconds after T0: listed from ``created``, its container from ``started``
    to ``ended`` at ``cores`` CPUs; ``end`` how it ended (succeeded, oom, deleted)."""

    name: str
    created: float
    started: float
    ended: float
    cores: float
    end: str = "succeeded"


#: Each start and end between two looks; "alone" runs on after the others ended.
LIVES = [
    Life("pt", -2.0, 1.3, 91.7, 1.0),  # pending at the look of 0 s
    Life("batch", 6.0, 7.2, 76.4, 0.5, "oom"),  # not listed at the look of 5 s: new since
    Life("note", 2.1, 2.6, 63.1, 0.75, "deleted"),  # its cgroup gone at once: its last stretch unread
    Life("ts1", 3.0, 3.9, 133.3, 0.25),  # alone from 91.7 s
]
JOB_OF = {"pt": "k8s:team-a/edge-pt", "batch": "k8s:team-a/edge-batch", "note": "k8s:team-a/edge-note",
          "ts1": "k8s:team-a/edge-ts1"}  # fmt: skip


def busy(life: Life, t: float) -> float:
    """The pod's CPUs at ``t`` (s)."""
    return life.cores if life.started <= t < life.ended else 0.0


def cpu_s(life: Life, t: float) -> float:
    """The pod's CPU seconds by ``t``."""
    return life.cores * max(0.0, min(t, life.ended) - life.started)


def truth_j(life: Life, until: float) -> float:
    """``CPU_W`` x the pod's CPUs over every busy CPU, integrated from its start to ``until``,
    exactly: the rates change only where a pod starts or ends."""
    edges = sorted({life.started, until, *(x for o in LIVES for x in (o.started, o.ended) if life.started < x < until)})
    total = 0.0
    for a, b in itertools.pairwise(edges):
        mid = (a + b) / 2
        node = SYSTEM_CORES + sum(busy(o, mid) for o in LIVES)
        total += CPU_W * busy(life, mid) / node * (b - a)
    return total


def listing(t: float) -> dict[str, Any]:
    """The node's /pods at ``t``."""
    items = []
    for life in LIVES:
        if t < life.created or (life.end == "deleted" and t >= life.ended):
            continue
        phase = "Pending" if t < life.started else "Running"
        pod = _pod(life.name, None, {"wattline.io/job": JOB_OF[life.name].split("/")[1]}, "Running",
                   T0 + round(life.started * S), T0 + round(life.ended * S))  # fmt: skip
        status = pod["status"]
        if phase == "Pending":
            status.update(phase="Pending")
            status["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
        elif t >= life.ended:
            terminated = {"exitCode": 0 if life.end == "succeeded" else 137, "startedAt": rfc3339(T0 + round(life.started * S)),
                          "reason": "Completed" if life.end == "succeeded" else "OOMKilled",
                          "finishedAt": rfc3339(T0 + round(life.ended * S))}  # fmt: skip
            status.update(phase="Succeeded" if life.end == "succeeded" else "Failed")
            status["containerStatuses"][0]["state"] = {"terminated": terminated}
        items.append(pod)
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}


def cgroups(root: Path, t: float) -> None:
    """Each pod's cgroup (systemd driver) from its creation to its end (a deleted pod's goes at
    once; the others' stay, their counters frozen), and the root's: every process's CPU time."""
    base = root / "sys/fs/cgroup"
    base.mkdir(parents=True, exist_ok=True)
    (base / "cgroup.controllers").write_text("cpu io memory pids\n")
    for life in LIVES:
        pod = (
            base
            / f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UIDS[life.name].replace('-', '_')}.slice"
        )
        gone = life.end == "deleted" and t >= life.ended
        if t < life.created or gone:
            if pod.exists():
                (pod / "cpu.stat").unlink()
                pod.rmdir()
            continue
        pod.mkdir(parents=True, exist_ok=True)
        write_usage(pod, cpu_s(life, t))
    write_usage(base, SYSTEM_CORES * (t + 10) + sum(cpu_s(life, t) for life in LIVES))


def write_usage(directory: Path, seconds: float) -> None:
    temporary = directory / "cpu.stat.new"
    temporary.write_text(f"usage_usec {round(seconds * 1e6)}\nuser_usec 0\nsystem_usec 0\n")
    temporary.replace(directory / "cpu.stat")


def store_with(path: Path, events: list[wire.pb.JobEvent]) -> SqliteStore:
    """The node's CPU package at CPU_W in 1 s samples from before the first look to after the
    last, and the watcher's events."""
    store = SqliteStore(path)
    batch = wire.Batch(stream_id="agent", seq=1, sent_ns=T0)
    batch.host.host_id = NODE
    for i in range(-15, LENGTH_S + 15):
        batch.samples.add(source="rapl", component="cpu_package", device="package-0", quality=wire.QUALITY_COUNTER,
                          healthy=True, start_ns=T0 + i * S, end_ns=T0 + (i + 1) * S, energy_j=CPU_W, power_w=CPU_W,
                          cumulative_j=CPU_W * (i + 16))  # fmt: skip
    batch.job_events.extend(events)
    assert store.write(batch).rejected == 0
    return store


def test_pods_starting_and_ending_between_looks_are_charged_their_cpu_share(tmp_path: Path, kubelet_pki: Path) -> None:
    root = tmp_path / "host"
    (tmp_path / "token").write_text("sa-token\n")
    kubelet = Kubelet(tmp_path / "kubelet.sock", kubelet_pki)
    settings = KubeSettings(pods=True, pod_list_url=kubelet.url, token_file=str(tmp_path / "token"),
                            ca_file=str(kubelet_pki / "ca.pem"))  # fmt: skip
    assert settings.poll_interval == POLL_S  # the default
    sent: list[wire.pb.JobEvent] = []
    cgroups(root, -10.0)
    watcher = PodWatcher(settings.validate(), wire.Host(host_id=NODE), root, lambda _h, ev: sent.extend(ev))
    try:
        t = -10.0
        while t <= LENGTH_S + POLL_S:
            cgroups(root, t)
            kubelet.reply = listing(t)
            watcher.poll(T0 + round(t * S))
            t += POLL_S
    finally:
        kubelet.close()
    closes = {e.job_id: e.time_ns for e in sent if e.kind == wire.pb.JobEvent.KIND_CLOSE}
    assert set(closes) == set(JOB_OF.values())
    store = store_with(tmp_path / "w.db", sent)
    by_job = {}
    for life in LIVES:
        job = JOB_OF[life.name]
        report = build_report(store, job, ReportSettings(share_rule="cpu-time"), now_ns=T0 + 1000 * S)  # type: ignore[arg-type]
        got = report.warmup.energy_j + report.saturated_window.energy_j
        bound = (report.warmup.bound + report.saturated_window.bound).total_j
        opened = (report.job.start_ns - T0) / S
        assert opened == pytest.approx(life.started, abs=1e-6), life.name  # the window opens at its start
        closed = (closes[job] - T0) / S
        truth = truth_j(life, closed)
        by_job[life.name] = (got, truth, bound)
        if life.end == "deleted":
            # its window ends where the list no longer had it; its last stretch, from the look
            # before its deletion, was not read: the bound holds the truth, and is no wider than
            # the node's energy over that stretch
            look_before = math.floor(life.ended / POLL_S) * POLL_S
            assert closed == math.ceil(life.ended / POLL_S) * POLL_S
            assert abs(got - truth) <= bound, (life.name, got, truth, bound)
            assert bound <= CPU_W * (closed - look_before) + 1e-6, (life.name, bound)
        else:
            assert closed == pytest.approx(life.ended, abs=1e-6), life.name  # closes at its end
            assert got == pytest.approx(truth, rel=0.01), (life.name, got, truth, bound)
    print({name: f"{got:.2f} J of {truth:.2f} J (± {bound:.2f})" for name, (got, truth, bound) in by_job.items()})
