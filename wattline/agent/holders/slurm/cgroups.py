"""Where a Slurm job's cgroup is on this node, for its CPU time (docs/operations/slurm.md, shared nodes).

Slurm's cgroup plugins put a job's processes under one folder per job (tests/fixtures/
cgroup_slurm/SOURCE.md says where each layout is documented):

- cgroup v1: ``<cpuacct hierarchy>/slurm/uid_<U>/job_<J>`` (``slurm_<node>`` when slurmd
  was built for several per host);
- cgroup v2: ``system.slice/slurmstepd.scope/job_<J>`` (``<node>_slurmstepd.scope``);
- cgroup v2 from Slurm 26.05: the folder is named by the job's SLUID, not ``job_<J>``,
  unless ``CgroupJobIdPaths=yes``. The SLUID is in no hook's environment we can rely on, so
  the folder is found by who runs in it: each step's ``slurm`` leaf holds its slurmstepd,
  whose process title is ``slurmstepd: [<J>.<step>]``.

Paths are found again on every miss (a job's folder appears when its first step starts) and
kept while they resolve; a folder that is gone reads as "no CPU time", never as 0.

A process's job (for its GPU use) is the job whose folder holds its cgroup in
``/proc/PID/cgroup`` (v1: the line of any hierarchy, each mirrors Slurm's folders); only
the open jobs' folders are looked for, so a process of any other cgroup is no job's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from wattline.agent.usage import cgroup_cpu

CGROUP_DIR = "sys/fs/cgroup"
PROC_DIR = "proc"
#: slurmstepd's process title (it rewrites its argv), e.g. ``slurmstepd: [1234.extern]``.
_STEPD_TITLE = re.compile(rb"^slurmstepd: \[([0-9]{1,20})\.")
#: A folder name that cannot be a job's by number (``job_J``) nor a step's; a SLUID candidate.
_NOT_SLUID = re.compile(r"^(job_|step_|cgroup\.|cpu\.|memory\.|io\.|pids\.|system$)")


class SlurmCgroups:
    """The CPU time of this node's Slurm jobs, read under ``root`` (``/`` or a recorded tree)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        found = cgroup_cpu.mount(root / CGROUP_DIR)
        self.base: Path | None = found[0] if found else None
        self.version = found[1] if found else 0
        self._dirs: dict[str, Path] = {}

    def host_cpu_ns(self) -> int | None:
        """Every process's CPU time (the root cgroup's); None where the root does not account it."""
        return None if self.base is None else cgroup_cpu.usage_ns(self.base, self.version)

    def job_cpu_ns(self, job_id: str, uid: int) -> int | None:
        """CPU time of job ``job_id`` (of user ``uid``) on this node; None while it has no cgroup here."""
        directory = self._dirs.get(job_id)
        value = cgroup_cpu.usage_ns(directory, self.version) if directory is not None else None
        if value is None:
            directory = self.job_dir(job_id, uid)
            value = cgroup_cpu.usage_ns(directory, self.version) if directory is not None else None
            if value is not None and directory is not None:
                self._dirs[job_id] = directory
        return value

    def forget(self, job_id: str) -> None:
        self._dirs.pop(job_id, None)

    def job_folders(self, jobs: Mapping[str, int]) -> dict[str, str]:
        """The cgroup folders of ``jobs`` (job -> its user's uid) that are there, as
        ``/proc/PID/cgroup`` names them (relative to the hierarchy's root) -> job."""
        found = {}
        for job_id, uid in jobs.items():
            directory = self._dirs.get(job_id)
            if directory is None or not directory.is_dir():
                directory = self.job_dir(job_id, uid)
            if directory is not None and self.base is not None:
                self._dirs[job_id] = directory
                found[directory.relative_to(self.base).as_posix()] = job_id
        return found

    def job_of_pid(self, pid: int, folders: Mapping[str, str]) -> str | None:
        """The job of ``folders`` (:meth:`job_folders`) process ``pid`` runs in; None for any other."""
        try:
            text = (self.root / PROC_DIR / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            parts = line.split(":", 2)[-1].strip("/").split("/")
            for depth in range(1, len(parts) + 1):
                job_id = folders.get("/".join(parts[:depth]))
                if job_id is not None:
                    return job_id
        return None

    def job_dir(self, job_id: str, uid: int) -> Path | None:
        """The job's cgroup folder, in any of the layouts of the module doc; None when there is none."""
        if self.base is None:
            return None
        if self.version == 1:
            found: Path | None = next(
                (d for d in sorted(self.base.glob(f"slurm*/uid_{uid}/job_{job_id}")) if d.is_dir()), None
            )
            return found
        for scope in sorted(self.base.glob("system.slice/*slurmstepd.scope")):
            by_id: Path = scope / f"job_{job_id}"
            if by_id.is_dir():
                return by_id
            for folder in sorted(scope.iterdir()):
                if folder.is_dir() and not _NOT_SLUID.match(folder.name) and self._stepd_job(folder) == job_id:
                    return folder
        return None

    def _stepd_job(self, folder: Path) -> str | None:
        """The job whose slurmstepd runs in ``folder``'s step leaves (by its process title)."""
        for procs in sorted(folder.glob("step_*/slurm/cgroup.procs")):
            try:
                pids = procs.read_text().split()
            except OSError:
                continue
            for pid in pids:
                try:
                    title = (self.root / PROC_DIR / pid / "cmdline").read_bytes()[:200]
                except OSError:
                    continue
                match = _STEPD_TITLE.match(title)
                if match:
                    return match.group(1).decode()
        return None
