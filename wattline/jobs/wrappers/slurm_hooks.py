"""Every Slurm job a wattline job: what the node's Prolog, Epilog and TaskProlog do (docs/operations/slurm.md).

Slurm runs Prolog and Epilog as root with nothing but ``SLURM_*`` variables, once per job
and node; TaskProlog as the job's user before each task. Every job start waits for them,
so each does only what cannot wait:

- **prolog**: makes the job's events file (owned by the job's user, in ``agent.slurm_dir``,
  a directory of root's) and notes the job's start for the agent (``<job>.open``,
  :mod:`wattline.agent.holders.slurm.records`), with the slurmd that ran it: the job's holder (the
  extern step's slurmstepd, which lives exactly as long as the allocation, does not exist
  yet when a 22.05 prolog runs, and is gone before the epilog).
- **task-prolog**: prints ``export WATTLINE_JOB_ID=...`` and ``export WATTLINE_EVENTS=...``.
- **epilog**: notes the job's end and exit status (``<job>.close``).

The node's agent makes the events from the notes (:mod:`wattline.agent.holders.slurm.jobs`): it asks
the controller for the name, account and QOS, claims the GPUs, opens the job, reads the events
file's lines, closes the job with how Slurm ended it. Nothing here waits on the network or
the controller, and nothing loads the wire types. Every hook returns normally whatever
happens: the command says what went wrong in one line and exits 0 (a failing Prolog drains
the node).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from wattline.agent.holders.slurm.records import SlurmError, events_path, job_id_of, node_dir, note, root_dir, slurmd
from wattline.jobs.job_env import ENV_EVENTS, ENV_JOB_ID

TYPE_CHECKING = False  # typing's own flag costs a hook the typing module
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["SlurmError", "epilog", "prolog", "task_prolog"]


def make_events_file(slurm_dir: Path, job_id: str, env: Mapping[str, str]) -> Path:
    """The job's events file, empty, owned by the job's user (mode 0600), in root's directory."""
    try:
        uid, gid = int(env.get("SLURM_JOB_UID", "")), int(env.get("SLURM_JOB_GID", "0") or 0)
    except ValueError:
        raise SlurmError("SLURM_JOB_UID or SLURM_JOB_GID is not a number") from None
    root_dir(slurm_dir, make=True)
    path = events_path(slurm_dir, job_id)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:  # a prolog run again: start over
        path.unlink()
        fd = os.open(path, flags, 0o600)
    try:
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)
    return path


def prolog(env: Mapping[str, str], config: Path | None, proc: Path = Path("/proc")) -> list[str]:
    """Make the events file and note the job's start; returns what went wrong but did not stop
    it (one line each)."""
    directory, job_id = node_dir(config, env), job_id_of(env)
    problems = []
    try:
        make_events_file(directory, job_id, env)
    except (OSError, SlurmError) as exc:
        problems.append(f"no events file: {exc}")
    holder = slurmd(proc)
    note("open", directory, env, holder)
    if holder is None:
        problems.append("slurmd not found in /proc: the lease ends the job if no epilog runs")
    return problems


def epilog(env: Mapping[str, str], config: Path | None) -> list[str]:
    """Note the job's end (the agent reads the events file's last lines and closes the job)."""
    note("close", node_dir(config, env), env)
    return []


def task_prolog(env: Mapping[str, str], config: Path | None) -> list[str]:
    """TaskProlog's output: the lines that set the task's job id and events file."""
    directory, job_id = node_dir(config, env), job_id_of(env)
    lines = [f"export {ENV_JOB_ID}={job_id}"]
    path = events_path(directory, job_id)
    if path.exists() and re.fullmatch(r"[A-Za-z0-9/._-]+", str(path)):  # TaskProlog does no quoting
        lines.append(f"export {ENV_EVENTS}={path}")
    return lines
