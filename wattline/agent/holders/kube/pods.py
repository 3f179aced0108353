"""A node's pod list, parsed: which pods are jobs, under which id, and how each pod ended.

The same ``v1.PodList`` JSON comes from the kubelet (``GET /pods``) and from the API server
(``GET /api/v1/pods?fieldSelector=spec.nodeName=NODE``). Every value is written by whoever
may create pods, so each is checked and bounded here: a pod whose names do not parse is no
job (one warning line), never a traceback, and no pod can name a job of another namespace
(the namespace is part of every job id).

Job ids (docs/operations/kubernetes.md), the same on every node of a distributed job:

- a pod annotated ``wattline.io/job: NAME``: ``k8s:NAMESPACE/NAME`` (every pod of the
  namespace with that annotation is one job, on one node or several);
- owned by a PyTorchJob, MPIJob (``kubeflow.org``) or a batch Job: ``k8s:NAMESPACE/OWNER:UID8``
  (the owner's name and the first 8 characters of its uid: names are reused, uids not);
- a JobSet's pod (label ``jobset.sigs.k8s.io/jobset-name``, under its Job):
  ``k8s:NAMESPACE/JOBSET:UID8`` with the label ``jobset.sigs.k8s.io/jobset-uid``, else
  ``k8s:NAMESPACE/JOBSET``;
- a LeaderWorkerSet's pod (label ``leaderworkerset.sigs.k8s.io/name``): one job per group,
  ``k8s:NAMESPACE/LWS-GROUP``.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import re
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: The annotation that makes any pod a job, its value the job's name.
JOB_ANNOTATION = "wattline.io/job"
#: Owners whose pods are jobs by default: (API group, kind).
JOB_OWNERS = frozenset({("batch", "Job"), ("kubeflow.org", "PyTorchJob"), ("kubeflow.org", "MPIJob")})
JOBSET_NAME, JOBSET_UID = "jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/jobset-uid"
LWS_NAME, LWS_GROUP = "leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/group-index"
#: The label naming a pod job's namespace (``wattline jobs --mine`` selects by it).
NAMESPACE_LABEL = "namespace"
#: Most pods one list may hold (a node runs at most a few hundred; more is not a pod list).
MAX_PODS = 5000

#: A DNS-1123 label (namespaces) and subdomain (object names), as the API server checks them.
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
#: A job name given in the annotation: short, printable, no separator of ours.
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_UID = re.compile(r"[0-9a-f-]{8,64}")
_CONTAINER_ID = re.compile(r"[a-z0-9-]{1,32}://([0-9a-f]{64})")
_LABEL_KEY = re.compile(r"[^A-Za-z0-9_]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Longest label value kept.
MAX_LABEL_CHARS = 256


class PodListError(ValueError):
    """A reply that is not a pod list, in one line."""


@dataclass(frozen=True)
class Container:
    """One container's status: its runtime id (64 hex, no ``runtime://``), and how it ended if it did."""

    name: str
    container_id: str = ""
    running_since_ns: int = 0
    exit_code: int | None = None
    reason: str = ""
    finished_ns: int = 0


@dataclass(frozen=True)
class Pod:
    """What the watcher needs of one pod."""

    uid: str
    namespace: str
    name: str
    phase: str
    qos: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owner: tuple[str, str, str, str]  #: (API group, kind, name, uid) of the controller; empty strings if none
    reason: str = ""
    started_ns: int = 0
    containers: tuple[Container, ...] = ()
    ip: str = ""  #: ``status.podIP``, checked (a service pod's metrics are scraped there); empty: none yet

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def started(self) -> bool:
        """A container runs or ran: the pod's work has begun."""
        return any(c.running_since_ns or c.exit_code is not None for c in self.containers)


@dataclass(frozen=True)
class JobOf:
    """The job a pod belongs to."""

    job_id: str
    name: str
    labels: dict[str, str] = field(default_factory=dict)


def _time_ns(value: object) -> int:
    """An RFC 3339 time (``2026-03-02T10:15:41Z``) in ns since the epoch; 0 if absent or bad."""
    if not isinstance(value, str) or not value:
        return 0
    try:
        return int(datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1e9)
    except ValueError:
        return 0


def _str(d: Mapping[str, Any], key: str) -> str:
    value = d.get(key, "")
    return value if isinstance(value, str) else ""


def _map(d: Mapping[str, Any], key: str) -> dict[str, str]:
    value = d.get(key) or {}
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


def _container(status: Mapping[str, Any]) -> Container:
    state = status.get("state") or {}
    running, terminated = state.get("running") or {}, state.get("terminated") or {}
    match = _CONTAINER_ID.fullmatch(_str(status, "containerID"))
    code = terminated.get("exitCode") if isinstance(terminated, dict) else None
    return Container(
        name=_str(status, "name")[:253],
        container_id=match.group(1) if match else "",
        running_since_ns=_time_ns(running.get("startedAt")) if isinstance(running, dict) else 0,
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        reason=_CONTROL.sub(" ", _str(terminated, "reason"))[:64] if isinstance(terminated, dict) else "",
        finished_ns=_time_ns(terminated.get("finishedAt")) if isinstance(terminated, dict) else 0,
    )


def _owner(meta: Mapping[str, Any]) -> tuple[str, str, str, str]:
    refs = meta.get("ownerReferences") or []
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            group = _str(ref, "apiVersion").rpartition("/")[0]
            return group, _str(ref, "kind"), _str(ref, "name"), _str(ref, "uid")
    return "", "", "", ""


def parse_pod(item: Mapping[str, Any]) -> Pod | None:
    """One ``items[]`` entry; None when its uid, namespace or name is not one the API server allows."""
    meta, status = item.get("metadata") or {}, item.get("status") or {}
    if not isinstance(meta, dict) or not isinstance(status, dict):
        return None
    uid, namespace, name = _str(meta, "uid"), _str(meta, "namespace"), _str(meta, "name")
    if not (_UID.fullmatch(uid) and _LABEL.fullmatch(namespace) and _NAME.fullmatch(name)):
        return None
    statuses = status.get("containerStatuses") or []
    containers = tuple(_container(s) for s in statuses if isinstance(s, dict)) if isinstance(statuses, list) else ()
    started = [c.running_since_ns for c in containers if c.running_since_ns]
    return Pod(
        uid=uid,
        namespace=namespace,
        name=name,
        phase=_str(status, "phase"),
        qos=_str(status, "qosClass"),
        labels=_map(meta, "labels"),
        annotations=_map(meta, "annotations"),
        owner=_owner(meta),
        reason=_str(status, "reason")[:64],
        started_ns=min(started) if started else _time_ns(status.get("startTime")),
        containers=containers,
        ip=_ip(_str(status, "podIP")),
    )


def _ip(value: str) -> str:
    """``value`` as an IP address (v4 or v6), else "": never a host name to resolve."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return ""


def parse_pod_list(doc: object, known: Set[str] = frozenset(), listed: set[str] | None = None) -> list[Pod]:
    """The pods of a ``PodList`` document (items that do not parse are skipped).

    An item whose uid is in ``known`` (a pod already judged, e.g. no job) is not parsed
    again: a node's many other pods then cost one lookup each per poll, not a parse. Every
    listed pod's uid, parsed or not, is added to ``listed`` when given."""
    if not isinstance(doc, dict) or doc.get("kind") not in ("PodList", None) or not isinstance(doc.get("items"), list):
        raise PodListError("not a PodList (no 'items' list)")
    items = doc["items"]
    if len(items) > MAX_PODS:
        raise PodListError(f"{len(items)} pods in one list: more than {MAX_PODS}, not read")
    pods = []
    for item in items:
        if not isinstance(item, dict):
            continue
        meta = item.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if isinstance(uid, str) and uid in known:  # known uids were checked when first parsed
            if listed is not None:
                listed.add(uid)
            continue
        pod = parse_pod(item)
        if pod is not None:
            pods.append(pod)
            if listed is not None:
                listed.add(pod.uid)
    return pods


def _short(uid: str) -> str:
    return uid.replace("-", "")[:8]


def namespace_ok(value: str) -> bool:
    """Whether ``value`` is a namespace name the API server allows (a DNS-1123 label)."""
    return bool(_LABEL.fullmatch(value))


def _ok_name(value: str) -> bool:
    return bool(_NAME.fullmatch(value))


def job_of(pod: Pod, label_keys: Iterable[str] = ()) -> JobOf | None:
    """The job ``pod`` belongs to, or None: it stays node energy (see the module doc)."""
    group, kind, owner, owner_uid = pod.owner
    ns, labels = pod.namespace, pod.labels
    given = pod.annotations.get(JOB_ANNOTATION)
    if given is not None:
        if not _JOB_NAME.fullmatch(given):
            log.warning("pod %s/%s: %s %r is not a job name: not a job", ns, pod.name, JOB_ANNOTATION, given[:80])
            return None
        job = JobOf(f"k8s:{ns}/{given}", given)
    elif _ok_name(labels.get(JOBSET_NAME, "")):
        name, uid = labels[JOBSET_NAME], labels.get(JOBSET_UID, "")
        job_id = f"k8s:{ns}/{name}:{_short(uid)}" if _UID.fullmatch(uid) else f"k8s:{ns}/{name}"
        job, kind, owner = JobOf(job_id, name), "JobSet", name
    elif _ok_name(labels.get(LWS_NAME, "")) and labels.get(LWS_GROUP, "").isdigit():
        name = f"{labels[LWS_NAME]}-{int(labels[LWS_GROUP])}"
        job, kind, owner = JobOf(f"k8s:{ns}/{name}", name), "LeaderWorkerSet", labels[LWS_NAME]
    elif (group, kind) in JOB_OWNERS and _ok_name(owner) and _UID.fullmatch(owner_uid):
        job = JobOf(f"k8s:{ns}/{owner}:{_short(owner_uid)}", owner)
    else:
        return None
    job.labels.update({NAMESPACE_LABEL: ns, "pod": pod.name})
    if kind:
        job.labels.update(owner_kind=kind, owner_name=owner)
    for key in label_keys:
        if key in labels:
            job.labels[f"pod_{_LABEL_KEY.sub('_', key)}"] = _CONTROL.sub(" ", labels[key])[:MAX_LABEL_CHARS]
    return job


#: How a pod ended, worst first: a job's close says the worst of its pods on the host.
PRECEDENCE = ("oom_killed", "evicted", "shutdown", "failed", "deleted", "succeeded")
#: Exit status taken for a pod deleted before any of its containers' end was listed: the
#: kubelet stops them with SIGTERM (shell convention 128 + 15).
DELETED_EXIT = 143


@dataclass(frozen=True)
class PodEnd:
    """How a pod ended: ``pod_end`` of the close, its exit status, the containers' reasons, when."""

    state: str
    exit_code: int
    containers: str
    time_ns: int


def pod_end(pod: Pod, vanished: bool, now_ns: int) -> PodEnd:
    """How ``pod`` ended (``vanished``: it left the node's list while not terminal)."""
    done = [c for c in pod.containers if c.exit_code is not None]
    failing = [c.exit_code for c in done if c.exit_code]
    if any(c.reason == "OOMKilled" for c in done):
        state = "oom_killed"
    elif pod.reason == "Evicted":
        state = "evicted"
    elif pod.reason in ("Terminated", "Shutdown"):
        state = "shutdown"
    elif vanished and not pod.terminal:
        state = "deleted"
    else:
        state = "succeeded" if pod.phase == "Succeeded" else "failed"
    code = failing[0] if failing else (DELETED_EXIT if state == "deleted" and not done else 0)
    if state in ("failed", "evicted", "shutdown") and not code:
        code = 1  # the pod failed though no container said how: never shown as a success
    finished = [c.finished_ns for c in done if c.finished_ns]
    text = ",".join(f"{c.name}={c.reason or 'Terminated'}:{c.exit_code}" for c in done)
    return PodEnd(state, code, text[:1024], max(finished) if finished else now_ns)
