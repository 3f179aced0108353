"""**Slurm hooks.** What wattline's Prolog, Epilog and TaskProlog cost a job: a real ``srun``
round trip (allocation, PrologFlags=Alloc prolog, task prolog, the task, the step's end) on
the test cluster of tests/helpers/slurm_cluster.py (Debian's Slurm, loopback, one agent per node),
with the hooks and, in clusters started the same way, without hooks (the yardstick) and with
hooks that only exit 0 (what Slurm's running of any Prolog/TaskProlog costs, apart from
wattline's code); medians of repeated ``srun``, each started once the node is idle again (its
epilog done). And each hook alone: the deploy/slurm script as slurm.conf names it, run with
only the ``SLURM_*`` variables Slurm gives it. Needs root and the Slurm binaries; skipped
(with why) otherwise.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import slurm_cluster  # tests/helpers/slurm_cluster.py

from wlbench.common import median


def _round_trips(cluster: slurm_cluster.Cluster, repeats: int) -> list[float]:
    """Milliseconds of ``srun -w n1 /bin/true``, each started on an idle node."""
    out = []
    for _ in range(repeats):
        _idle(cluster)
        t0 = time.perf_counter()
        cluster.run("srun", "-N1", "-w", "n1", "/bin/true", timeout=60)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _idle(cluster: slurm_cluster.Cluster, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = cluster.run("sinfo", "-h", "-n", "n1", "-o", "%t").stdout.split()
        if states == ["idle"]:
            return
        time.sleep(0.05)
    raise RuntimeError("node n1 not idle again within 30 s")


def _hook_ms(cluster: slurm_cluster.Cluster, name: str, repeats: int) -> float | None:
    """Median ms of one hook script as Slurm runs it (job 999999: a job the controller does not know)."""
    env = {
        "SLURM_JOB_ID": "999999",
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()),
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_EXIT_CODE2": "0:0",
        "SLURM_CONF": cluster.env["SLURM_CONF"],
    }
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([str(cluster.root / name)], env=env, capture_output=True, timeout=30, check=False)
        times.append((time.perf_counter() - t0) * 1000)
    return median(times)


def run(work: Path, quick: bool) -> dict[str, Any]:
    why = slurm_cluster.missing()
    if why:
        return {"skipped": why}
    repeats = 5 if quick else 20
    result: dict[str, Any] = {"repeats": repeats}
    for hooks, key in (("none", "without_hooks_ms"), ("noop", "noop_hooks_ms"), ("wattline", "with_hooks_ms")):
        cluster = slurm_cluster.start({"n1": 50.0}, hooks=hooks)
        try:
            _round_trips(cluster, 2)  # warm: first-job costs (munge credentials, page cache)
            result[key] = median(_round_trips(cluster, repeats))
            if hooks == "wattline":
                result["hook_ms"] = {h: _hook_ms(cluster, h, repeats) for h in ("prolog", "task-prolog", "epilog")}
        finally:
            cluster.stop()
    result["added_ms"] = result["with_hooks_ms"] - result["without_hooks_ms"]
    result["added_by_wattline_ms"] = result["with_hooks_ms"] - result["noop_hooks_ms"]
    return result
