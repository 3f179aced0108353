"""What a Slurm node's Prolog and Epilog leave its agent (docs/operations/slurm.md).

Every job start waits for the Prolog, so a hook only notes what Slurm told it: one small
file, ``<job>.open`` (Prolog) or ``<job>.close`` (Epilog), in ``slurm_dir``, a directory of
root's that users can read but not change, replaced whole. The node's agent
(:mod:`.slurm_jobs`) makes the job's events from it: it asks the controller what the hook's
environment lacks, claims the job's GPUs by UUID, keeps the holder record, delivers the
events through the outbox, then removes the file. An event's identity is fixed by (job,
host) and its place, so a file read twice stores nothing twice; while the agent is down
the files wait for it.

The hooks load this module and nothing of the wire types or the config machinery: the
standard library's json, os, pathlib, re, stat, time and tomllib only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from pathlib import Path

from wattline import toml_file
from wattline.agent.usage import proc_identity

TYPE_CHECKING = False  # typing's own flag costs a hook the typing module
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

#: The agent config's ``slurm_dir`` where it names none.
DEFAULT_DIR = "/run/wattline/slurm"
#: What a record keeps of a hook's environment; the rest is none of ours.
KEPT_ENV = (
    "SLURM_JOB_ID",
    "SLURM_JOB_UID",
    "SLURM_JOB_GID",
    "SLURM_JOB_USER",
    "SLURM_JOB_PARTITION",
    "SLURM_NODELIST",
    "SLURM_CLUSTER_NAME",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_JOB_GPUS",
    "SLURM_JOB_EXIT_CODE2",
    "SLURM_CONF",
)
KINDS = ("open", "close")
#: Longest value kept of one variable, and the largest record read back.
MAX_VALUE_CHARS, MAX_RECORD_BYTES = 4096, 64 << 10

_JOB_ID = re.compile(r"[0-9]{1,20}")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_RECORD = re.compile(r"([0-9]{1,20})\.(open|close)")


class SlurmError(ValueError):
    """What a hook could not do, in one line."""


def job_id_of(env: Mapping[str, str]) -> str:
    job_id = env.get("SLURM_JOB_ID", "")
    if not _JOB_ID.fullmatch(job_id):
        raise SlurmError(f"SLURM_JOB_ID {job_id[:100]!r} is not a Slurm job id")
    return job_id


def node_dir(config: str | Path | None, env: Mapping[str, str]) -> Path:
    """``[agent] slurm_dir`` of the node's agent config (``{node}`` in its path is
    ``$SLURMD_NODENAME``: several slurmd on one machine); never from the environment, which
    Slurm does not give a Prolog."""
    if config is None:
        return Path(DEFAULT_DIR)
    config = str(config)
    if "{node}" in config:
        node = env.get("SLURMD_NODENAME", "")
        if not _NODE.fullmatch(node):
            raise SlurmError(f"SLURMD_NODENAME {node[:100]!r} is not a node name")
        config = config.replace("{node}", node)
    try:
        doc = toml_file.load(config)
    except toml_file.TomlFileError as exc:
        raise SlurmError(str(exc)) from None
    agent = doc.get("agent", {})
    value = agent.get("slurm_dir", DEFAULT_DIR) if isinstance(agent, dict) else None
    if not isinstance(value, str) or not value.startswith("/"):
        raise SlurmError(f"config file {config}: [agent] slurm_dir must be an absolute path")
    return Path(value)


def events_path(slurm_dir: Path, job_id: str) -> Path:
    """The job's events file (its tasks' ``WATTLINE_EVENTS``)."""
    return slurm_dir / f"{job_id}.events"


def root_dir(directory: Path, make: bool = False) -> None:
    """SlurmError unless ``directory`` is this user's and nobody else can change it (made, mode
    0755, when ``make``): nothing in one a user could write counts."""
    if make:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise SlurmError(f"{directory}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SlurmError(f"{directory} is not a directory of this user's that others cannot write: not used")


def slurmd(proc: Path = Path("/proc")) -> dict[str, Any] | None:
    """The slurmd that runs this hook (the nearest ancestor named ``slurmd``: the hook's shell
    and ``timeout`` stand between) as the holder record names it; None when there is none."""
    pid = os.getpid()
    for _ in range(8):
        try:
            parsed = proc_identity.parse_stat((proc / str(pid) / "stat").read_text())
        except OSError:
            return None
        if parsed is None:
            return None
        name, parent, ticks = parsed
        if name == "slurmd" and pid != os.getpid():
            return {
                "pid": pid,
                "start_ticks": ticks,
                "boot_id": proc_identity.boot_id(proc),
                "pid_ns": proc_identity.pid_ns(proc, pid),
            }
        if parent <= 1:
            return None
        pid = parent
    return None


def note(kind: str, directory: Path, env: Mapping[str, str], holder: dict[str, Any] | None = None) -> Path:
    """Leave the agent a ``kind`` record of the job in ``env``, at this instant; returns its path."""
    job_id = job_id_of(env)
    record = {
        "time_ns": time.time_ns(),
        "env": {k: env[k][:MAX_VALUE_CHARS] for k in KEPT_ENV if k in env},
        "slurmd": holder,
    }
    root_dir(directory, make=True)
    return write_json(directory / f"{job_id}.{kind}", record)


def write_json(path: Path, data: object) -> Path:
    """``data`` as JSON in ``path`` (mode 0600), replaced whole: a reader never sees half of it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()  # a dead writer's with this pid
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(data).encode())
    finally:
        os.close(fd)
    os.replace(temporary, path)
    return path


def pending(directory: Path) -> list[tuple[str, str, Path]]:
    """(job id, kind, path) of every record in ``directory``: every open before any close."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [(m.group(2) != "open", int(m.group(1)), m.group(2)) for n in names if (m := _RECORD.fullmatch(n))]
    return [(str(job), kind, directory / f"{job}.{kind}") for _, job, kind in sorted(found)]


def read_json(path: Path) -> object:
    """What :func:`write_json` wrote in ``path``; None for anything but a regular file of this
    user's alone (never through a link), at most MAX_RECORD_BYTES of JSON."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        if st.st_size > MAX_RECORD_BYTES:
            return None
        return json.loads(os.read(fd, MAX_RECORD_BYTES))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def read(path: Path) -> dict[str, Any] | None:
    """A record as :func:`note` writes it; None for anything else (a link, a file that is not
    this user's alone, not that shape)."""
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("time_ns"), int) or not isinstance(data.get("env"), dict):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in data["env"].items()):
        return None
    holder = data.get("slurmd")
    if holder is not None and not (
        isinstance(holder, dict) and all(isinstance(holder.get(k), int) for k in ("pid", "start_ticks", "pid_ns"))
    ):
        return None
    return data
