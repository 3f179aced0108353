"""A Slurm node with many open jobs, for the agent to track: its cgroup v2 tree, each job
opened by the real prolog (its events file and its open note, which the agent turns into the
job's open event and holder record), the jobs' CPU time and events-file lines advanced as
they run.

The tree has the shape Slurm's cgroup/v2 plugin gives it (tests/fixtures/cgroup_slurm/
SOURCE.md), under the same root as the fixture host's powercap and NIC trees: the root's
``cgroup.controllers`` and ``cpu.stat``, and per job ``system.slice/slurmstepd.scope/job_<J>``
with its ``cpu.stat`` and the steps below it (``step_extern/slurm``, ``step_batch/slurm``,
``step_batch/user/task_0``), each with ``cgroup.procs`` and ``cpu.stat``. Counters are
replaced whole once a second (the kernel's counting: not the agent's cost).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from slurm_node_files import slurmd_proc  # tests/helpers/slurm_node_files.py

from wattline.jobs.wrappers import slurm_hooks

#: The first job's id; the others follow.
FIRST_JOB = 5001
CPU_STAT = (
    "usage_usec {usage}\nuser_usec {user}\nsystem_usec {system}\ncore_sched.force_idle_usec 0\n"
    "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0\n"
)
STEPS = ("step_extern/slurm", "step_batch/slurm", "step_batch/user/task_0")


def scope(root: Path) -> Path:
    return root / "sys/fs/cgroup/system.slice/slurmstepd.scope"


def job_ids(jobs: int) -> list[str]:
    return [str(FIRST_JOB + k) for k in range(jobs)]


def cgroup_tree(root: Path, jobs: int) -> None:
    """The node's cgroup v2 tree with ``jobs`` job folders (CPU time 0)."""
    base = root / "sys/fs/cgroup"
    base.mkdir(parents=True, exist_ok=True)
    (base / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    for n, job in enumerate(job_ids(jobs)):
        folder = scope(root) / f"job_{job}"
        for step in STEPS:
            (folder / step).mkdir(parents=True, exist_ok=True)
            (folder / step / "cgroup.procs").write_text(f"{10_000 + 4 * n + STEPS.index(step)}\n")
        (folder / "cgroup.procs").write_text("")
    advance(root, jobs, 0.0)


def _write_stat(directory: Path, usage_s: float) -> None:
    usec = int(usage_s * 1e6)
    tmp = directory / "cpu.stat.new"
    tmp.write_text(CPU_STAT.format(usage=usec, user=usec * 9 // 10, system=usec - usec * 9 // 10))
    tmp.replace(directory / "cpu.stat")  # a reader never sees half a file


def advance(root: Path, jobs: int, t_s: float) -> None:
    """Every cgroup's CPU time ``t_s`` seconds in: job k keeps 0.25 + k % 4 x 0.25 cores busy
    (in its batch step's task), the node one core more."""
    total = 0.0
    for k, job in enumerate(job_ids(jobs)):
        used = (0.25 + (k % 4) * 0.25) * t_s
        total += used
        folder = scope(root) / f"job_{job}"
        for directory in (folder, folder / "step_batch/user/task_0"):
            _write_stat(directory, used)
    _write_stat(root / "sys/fs/cgroup", total + t_s)


@dataclass
class SlurmNode:
    """One agent's node settings (its config file) and the jobs opened there."""

    host_id: str
    config: Path
    outbox: Path
    slurm_dir: Path
    jobs: list[str] = field(default_factory=list)

    def open_jobs(self, jobs: int, proc: Path) -> None:
        """Run the real prolog of ``jobs`` jobs in a child process whose parent, this process, is
        the slurmd it finds (named so in ``proc``, a /proc of its own: tests/helpers/slurm_node_files.py),
        so their holder lives as long as the benchmark; any problem fails the run."""
        argv = [sys.executable, "-m", "wlbench.slurm_node_tree", str(self.config), str(jobs), str(proc)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"prologs failed: {done.stderr[-1000:]}")
        self.jobs += job_ids(jobs)

    def append_line(self, job: str, units: int) -> None:
        """A ``units N`` line in the job's events file, as a job's shell step writes it."""
        with open(self.slurm_dir / f"{job}.events", "a") as fh:
            fh.write(f"units {units}\n")


def node_config(work: Path, host_id: str, tree: Path, collector: str) -> SlurmNode:
    """The config file an agent and its prologs share: 1 Hz, RAPL + NIC of ``tree``."""
    work.mkdir(parents=True, exist_ok=True)
    outbox, slurm_dir = work / "outbox", work / "slurm"
    slurm_dir.mkdir(mode=0o755, exist_ok=True)
    os.chmod(slurm_dir, 0o755)  # mkdir's mode is masked by the umask; the watcher wants 0755
    config = work / "agent.toml"
    config.write_text(
        f'[agent]\nhost_id = "{host_id}"\noutbox_dir = "{outbox}"\nslurm_dir = "{slurm_dir}"\n'
        f'sysfs_root = "{tree}"\ninterval = 1.0\nsources = ["rapl", "nic"]\ncollectors = ["{collector}"]\n'
        'edge_socket = "off"\n'
    )
    return SlurmNode(host_id, config, outbox, slurm_dir)


def prologs(config: Path, jobs: int, proc: Path) -> None:
    """The prolog of each of ``jobs`` jobs, as Slurm runs it under this process's parent."""
    slurmd_proc(proc)
    for job in job_ids(jobs):
        env = {"SLURM_JOB_ID": job, "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GID": str(os.getgid()),
               "SLURM_JOB_USER": "bench", "SLURM_JOB_PARTITION": "cpu", "SLURMD_NODENAME": "n1"}  # fmt: skip
        problems = slurm_hooks.prolog(env, config, proc)
        if problems:
            raise SystemExit(f"prolog of job {job}: {problems}")


if __name__ == "__main__":
    prologs(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
