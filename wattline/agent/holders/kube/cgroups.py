"""Pods' cgroups on this node: where each pod's cgroup is, and which pod a process is in.

The kubelet puts a pod's cgroup under its QoS class (Guaranteed directly under ``kubepods``,
the others under ``burstable``/``besteffort``), named by the pod's UID; the systemd driver
writes the UID with ``_`` for ``-`` and nests slices (``kubepods.slice/kubepods-burstable.slice/
kubepods-burstable-pod<uid_>.slice``), cgroupfs plain directories (``kubepods/burstable/
pod<uid>``). The container leaves below (containerd ``cri-containerd-<id>.scope`` or ``<id>``,
CRI-O ``crio-<id>.scope`` or ``crio-<id>``, and the sandbox's) all count in the pod's cgroup,
whose CPU time is therefore the pod's. Paths are read under the agent's ``--sysfs-root``.
"""

from __future__ import annotations

import re
from pathlib import Path

from wattline.agent.usage import cgroup_cpu

#: Where the node's cgroup tree and processes are, under the sysfs root (the DaemonSet mounts both).
CGROUP_DIR, PROC_DIR = "sys/fs/cgroup", "proc"
_QOS = ("", "burstable", "besteffort")
#: A pod UID in a /proc/PID/cgroup line, below a kubepods level (either driver's spelling).
_POD_IN_PATH = re.compile(r"kubepods.*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def candidates(uid: str) -> list[str]:
    """Relative paths a pod's cgroup may have (both drivers, every QoS class)."""
    under = uid.replace("-", "_")
    paths = []
    for qos in _QOS:
        if qos:
            paths.append(f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{under}.slice")
            paths.append(f"kubepods/{qos}/pod{uid}")
        else:
            paths.append(f"kubepods.slice/kubepods-pod{under}.slice")
            paths.append(f"kubepods/pod{uid}")
    return paths


class PodCgroups:
    """Finds pods' cgroups and reads their CPU time; ``root`` is the agent's sysfs root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        found = cgroup_cpu.mount(root / CGROUP_DIR)
        self.base: Path | None = found[0] if found else None
        self.version = found[1] if found else 0
        self._dirs: dict[str, Path] = {}

    def pod_dir(self, uid: str) -> Path | None:
        """The pod's cgroup directory (looked up once, then remembered while it exists)."""
        if self.base is None:
            return None
        known = self._dirs.get(uid)
        if known is not None and known.is_dir():
            return known
        for relative in candidates(uid):
            if (self.base / relative).is_dir():
                self._dirs[uid] = self.base / relative
                return self._dirs[uid]
        return None

    def pod_cpu_ns(self, uid: str) -> int | None:
        """The pod's CPU time so far (ns); None when its cgroup is not found (not started, gone)."""
        directory = self.pod_dir(uid)
        return None if directory is None else cgroup_cpu.usage_ns(directory, self.version)

    def host_cpu_ns(self) -> int | None:
        """Every process's CPU time (the root cgroup's); None where the root does not account it."""
        return None if self.base is None else cgroup_cpu.usage_ns(self.base, self.version)

    def forget(self, uid: str) -> None:
        self._dirs.pop(uid, None)

    def pod_of_pid(self, pid: int) -> str | None:
        """The UID of the pod process ``pid`` runs in (from ``/proc/PID/cgroup``), or None."""
        try:
            text = (self.root / PROC_DIR / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        match = _POD_IN_PATH.search(text)
        return match.group(1).replace("_", "-") if match else None
