"""Every Slurm job a wattline job: what the node's Prolog, Epilog and TaskProlog do (README "Slurm").

Slurm runs Prolog and Epilog as root with nothing but ``SLURM_*`` variables, once per job
and node; TaskProlog as the job's user before each task. So:

- **prolog**: opens the job on this host (job id = ``SLURM_JOB_ID``; labels user,
  partition, node list from the environment, name, account, QOS and array ids from the
  controller, asked once and briefly; its GPUs, ``SLURM_JOB_GPUS``, claimed by the UUIDs of
  the agent's map), makes the job's events file (owned by the job's
  user, in ``agent.slurm_dir``, a directory of root's) and records who holds the job here:
  the slurmd that ran the prolog (the extern step's slurmstepd, which lives exactly as long
  as the allocation, does not exist yet when a 22.05 prolog runs, and is gone before the
  epilog). The agent renews that record and heartbeats the job while slurmd lives, and
  ends the job where slurmd was last alive once it is gone without an epilog.
- **task-prolog**: prints ``export WATTLINE_JOB_ID=...`` and ``export WATTLINE_EVENTS=...``.
- **epilog**: turns the events file's lines into UNITS/PHASE events, closes the job with
  its exit status and how Slurm ended it, and drops the record and the file.

Events go to the host's outbox only (never the network); the agent delivers them. Their
event_seq is fixed by (job, host) and the event's place (open, line N, close), so a hook
run again stores nothing twice. Every hook returns normally whatever happens: the command
says what went wrong in one line and exits 0 (a failing Prolog drains the node).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from wattline.agent.outbox import outbox_root
from wattline.agent.settings import AgentSettings
from wattline.agent.slurm_node import (
    ABANDONED_AT,
    BEATS_AT,
    CLOSE_AT,
    MAX_LABEL_CHARS,
    OPEN_AT,
    SlurmError,
    answer,
    ask_controller,
    bounded,
    end_state,
    events_path,
    exit_status,
    gpu_claims,
    new_line_events,
    parse_show_job,
    progress,
    read_events_file,
    read_gpu_map,
    seq_base,
    write_ending,
)
from wattline.config import ConfigError, build, read_toml
from wattline.workloads.job_env import ENV_EVENTS, ENV_JOB_ID

# The prolog and epilog load the events' modules (protobuf's among them) when they run; the
# TaskProlog, which every task of every step waits for, never does.
if TYPE_CHECKING:
    from wattline import wire
    from wattline.workloads.events import EventBuilder

__all__ = ["MAX_LABEL_CHARS", "OPEN_AT", "parse_show_job", "read_events_file"]  # the hooks' guards, tested here

_JOB_ID = re.compile(r"[0-9]{1,20}")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class Node:
    """This node's settings, from the agent's config file."""

    host_id: str
    outbox: Path
    slurm_dir: Path
    labels: dict[str, str] = field(default_factory=dict)

    @functools.cached_property
    def host(self) -> wire.pb.Host:
        from wattline import wire

        return wire.Host(host_id=self.host_id, labels=self.labels)


def node_settings(config: Path | None, env: Mapping[str, str]) -> Node:
    """The node's settings from ``config`` (``{node}`` in it is ``$SLURMD_NODENAME``); never from
    the environment, which Slurm does not give a Prolog."""
    if config is not None and "{node}" in str(config):
        node = env.get("SLURMD_NODENAME", "")
        if not _NODE.fullmatch(node):
            raise SlurmError(f"SLURMD_NODENAME {node[:100]!r} is not a node name")
        config = Path(str(config).replace("{node}", node))
    try:
        settings = build(AgentSettings, "agent", read_toml(config), env={}).validate()
        root = outbox_root(settings.outbox_dir, {})
    except (ConfigError, OSError, RuntimeError) as exc:  # SpoolError is an OSError
        raise SlurmError(str(exc)) from None
    # os.uname() is gethostname() without loading the socket module
    return Node(settings.host_id or os.uname().nodename, root, Path(settings.slurm_dir), dict(settings.labels))


@dataclass(frozen=True)
class SlurmJob:
    """A job as a hook's environment tells it."""

    job_id: str
    uid: int
    gid: int
    labels: dict[str, str]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlurmJob:
        job_id = env.get("SLURM_JOB_ID", "")
        if not _JOB_ID.fullmatch(job_id):
            raise SlurmError(f"SLURM_JOB_ID {job_id[:100]!r} is not a Slurm job id")
        try:
            uid, gid = int(env.get("SLURM_JOB_UID", "")), int(env.get("SLURM_JOB_GID", "0") or 0)
        except ValueError:
            raise SlurmError("SLURM_JOB_UID or SLURM_JOB_GID is not a number") from None
        names = {
            "user": "SLURM_JOB_USER",
            "partition": "SLURM_JOB_PARTITION",
            "nodes": "SLURM_NODELIST",
            "cluster": "SLURM_CLUSTER_NAME",
            "array_job_id": "SLURM_ARRAY_JOB_ID",
            "array_task_id": "SLURM_ARRAY_TASK_ID",
        }
        return cls(job_id, uid, gid, bounded({k: env[v] for k, v in names.items() if env.get(v)}))


def builder(
    job: SlurmJob, node: Node, name: str = "", labels: Mapping[str, str] | None = None, devices: list[str] | None = None
) -> EventBuilder:
    from wattline.workloads.events import EventBuilder, JobSpec

    spec = JobSpec(job.job_id, name or job.job_id, labels={**job.labels, **(labels or {})}, devices=devices or [])
    return EventBuilder(spec, base=seq_base(job.job_id, node.host.host_id))


def send(node: Node, events: list[wire.pb.JobEvent]) -> None:
    """Keep ``events`` in the host's outbox (the agent delivers them)."""
    from wattline.agent.outbox import open_outbox

    spool = open_outbox(node.outbox, node.host)
    try:
        spool.add_job_events(events)
    finally:
        spool.close()


def _root_dir(directory: Path) -> None:
    """Make ``directory`` (root's, mode 0755) unless it is there; refuse one a user could change."""
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SlurmError(f"{directory} is not a directory of this user's that others cannot write: not used")


def make_events_file(node: Node, job: SlurmJob) -> Path:
    """The job's events file, empty, owned by the job's user (mode 0600), in root's directory."""
    _root_dir(node.slurm_dir)
    path = events_path(node.slurm_dir, job.job_id)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:  # a prolog run again: start over
        path.unlink()
        fd = os.open(path, flags, 0o600)
    try:
        os.fchown(fd, job.uid, job.gid)
    finally:
        os.close(fd)
    return path


def slurmd_pid(proc: Path = Path("/proc")) -> int | None:
    """The slurmd that runs this hook: the nearest ancestor named ``slurmd`` (the hook's shell
    and ``timeout`` stand between), None when there is none."""
    pid = os.getpid()
    for _ in range(8):
        try:
            stat_text = (proc / str(pid) / "stat").read_text()
        except OSError:
            return None
        name, _, rest = stat_text.partition("(")[2].rpartition(")")
        if name == "slurmd" and pid != os.getpid():
            return pid
        try:
            pid = int(rest.split()[1])
        except (IndexError, ValueError):
            return None
        if pid <= 1:
            return None
    return None


def prolog(env: Mapping[str, str], config: Path | None, parent: int | None = None) -> list[str]:
    """Open the job on this node; returns what went wrong but did not stop it (one line each)."""
    node, job = node_settings(config, env), SlurmJob.from_env(env)
    asked = ask_controller(job.job_id)  # answered while the event modules load
    from wattline.agent import holders
    from wattline.workloads.events import EventBuilder, JobSpec, check_storable

    problems: list[str] = []
    view = answer(asked)
    extra: dict[str, str] = {k: view[k] for k in ("account", "qos", "array_job_id", "array_task_id") if k in view}
    devices, by_index = gpu_claims(env.get("SLURM_JOB_GPUS", ""), read_gpu_map(node.slurm_dir))
    if by_index:
        problems.append(f"GPUs {','.join(by_index)} claimed by index: no agent's GPU map names them")
    events = builder(job, node, view.get("name", ""), extra, devices)
    try:
        check_storable(events.spec, node.host.host_id, node.host.labels)
    except ValueError as exc:
        problems.append(f"name and labels left out: {exc}")
        spec = JobSpec(job.job_id, job.job_id, devices=devices)
        events = EventBuilder(spec, base=seq_base(job.job_id, node.host.host_id))
    holder = slurmd_pid() if parent is None else parent
    slurmd = holders.identity(holder) if holder else None
    open_event = events.open(holder=slurmd)
    try:
        make_events_file(node, job)
    except (OSError, SlurmError) as exc:
        problems.append(f"no events file: {exc}")
    send(node, [open_event])
    if slurmd is None:
        problems.append("slurmd not found in /proc: the lease ends the job if no epilog runs")
        return problems
    base = seq_base(job.job_id, node.host.host_id)
    record = holders.HolderRecord(
        job.job_id,
        node.host.host_id,
        "collector",
        slurmd.pid,
        slurmd.start_ticks,
        slurmd.boot_id,
        slurmd.pid_ns,
        open_event.time_ns,
        base | ABANDONED_AT,
        dict(node.host.labels),
        beat_seq=base | BEATS_AT,
        holder_name="slurmd",
        owner_uid=job.uid,
    )
    holders.keep(node.outbox, record)
    return problems


def epilog(env: Mapping[str, str], config: Path | None) -> list[str]:
    """Count the events file's lines the agent has not, close the job on this node and, where
    the controller cannot say yet how the job ended, leave the agent a request to ask it
    later (:func:`~wattline.agent.slurm_node.write_ending`); what went wrong, one line each."""
    node, job = node_settings(config, env), SlurmJob.from_env(env)
    now_ns = time.time_ns()
    asked = ask_controller(job.job_id)  # answered while the event modules load
    from wattline import wire
    from wattline.agent import holders

    problems: list[str] = []
    base = seq_base(job.job_id, node.host.host_id)
    view = answer(asked)
    code = int(view.get("exit_code") or exit_status(env.get("SLURM_JOB_EXIT_CODE2", "0:0")))
    learnt = bounded({"name": view.get("name", ""), **{k: view.get(k, "") for k in ("account", "qos")}})
    close = wire.JobEvent(
        job_id=job.job_id,
        kind=wire.pb.JobEvent.KIND_CLOSE,
        time_ns=now_ns,
        event_seq=base | CLOSE_AT,
        exit_code=code,
        end_state=end_state(view),
        # what the prolog could not learn when the controller was slow: readers take it from here
        name=learnt.pop("name", ""),
        labels=learnt,
    )
    path = events_path(node.slurm_dir, job.job_id)
    sent = False
    try:
        with progress(node.slurm_dir, job.job_id) as state:
            out, bad = new_line_events(job.job_id, base, read_events_file(path, job.uid, state[0]), state, now_ns)
            if bad:
                problems.append(f"{bad} malformed lines in the events file ignored")
            send(node, [*out, close])  # under the lock: the agent sends none of these lines again
            sent = True
    except (OSError, SlurmError) as exc:
        problems.append(str(exc))
    if not sent:
        send(node, [close])
    holders.drop(node.outbox, job.job_id, node.host.host_id)
    if not close.end_state and code:  # on 22.05 a cancelled job is COMPLETING until its epilogs end
        try:
            write_ending(node.slurm_dir, close, node.host, os.environ.get("SLURM_CONF", ""))
        except OSError as exc:
            problems.append(f"how the job ended is not asked later: {exc}")
    for leftover in (path, path.with_suffix(".read")):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
    return problems


def task_prolog(env: Mapping[str, str], config: Path | None) -> list[str]:
    """TaskProlog's output: the lines that set the task's job id and events file."""
    node, job = node_settings(config, env), SlurmJob.from_env(env)
    lines = [f"export {ENV_JOB_ID}={job.job_id}"]
    path = events_path(node.slurm_dir, job.job_id)
    if path.exists() and re.fullmatch(r"[A-Za-z0-9/._-]+", str(path)):  # TaskProlog does no quoting
        lines.append(f"export {ENV_EVENTS}={path}")
    return lines
