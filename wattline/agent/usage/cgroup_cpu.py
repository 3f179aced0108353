"""CPU time of a cgroup, as the kernel counts it (cgroup v2 ``cpu.stat``, v1 ``cpuacct.usage``).

One reader for every holder that knows its job's cgroup (the pod watcher, the Slurm watcher through
:mod:`.slurm_cgroups`): the time is cumulative and hierarchical (a cgroup counts its
children), so a job's CPU seconds over a period are the difference of two reads.
"""

from __future__ import annotations

from pathlib import Path

#: The USE events' device and metric for a job's CPU time against the node's (the
#: ``cpu-time`` share rule reads these, :data:`wattline.accounting.attribution.CPU_TIME_KEYS`).
CPU_DEVICE, CPU_METRIC = "cpu:host", "cpu-time"


def mount(cgroup_root: Path) -> tuple[Path, int] | None:
    """Where CPU time is accounted under ``cgroup_root`` (``/sys/fs/cgroup``) and the cgroup
    version: the unified tree (v2), else the v1 ``cpu,cpuacct`` (or ``cpuacct``) hierarchy."""
    if (cgroup_root / "cgroup.controllers").is_file():
        return cgroup_root, 2
    for name in ("cpu,cpuacct", "cpuacct", "cpuacct,cpu"):
        if (cgroup_root / name / "cpuacct.usage").is_file():
            return cgroup_root / name, 1
    return None


def usage_ns(directory: Path, version: int) -> int | None:
    """CPU time of the cgroup at ``directory`` in ns since it was made; None when unreadable (gone)."""
    try:
        if version == 1:
            return int((directory / "cpuacct.usage").read_text())
        for line in (directory / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) * 1000
    except (OSError, ValueError):
        return None
    return None
