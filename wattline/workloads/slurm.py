"""Every Slurm job a wattline job: what the node's Prolog, Epilog and TaskProlog do (README "Slurm").

Slurm runs Prolog and Epilog as root with nothing but ``SLURM_*`` variables, once per job
and node; TaskProlog as the job's user before each task. So:

- **prolog**: opens the job on this host (job id = ``SLURM_JOB_ID``; labels user,
  partition, node list from the environment, name, account, QOS and array ids from the
  controller, asked once and briefly), makes the job's events file (owned by the job's
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
import hashlib
import os
import re
import socket
import stat
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wattline import wire
from wattline.agent import holders
from wattline.agent.outbox import open_outbox, outbox_root
from wattline.agent.settings import AgentSettings
from wattline.config import ConfigError, build, read_toml
from wattline.workloads.events import ENV_EVENTS, ENV_JOB_ID, EventBuilder, JobSpec, check_storable, parse_event_line

#: The controller is asked for what a 22.05 prolog's environment lacks (name, account, QOS)
#: and, at the epilog, how the job ended; never for longer than this, so a slow controller
#: costs labels, not the job's start.
SCONTROL = "/usr/bin/scontrol"
SCONTROL_TIMEOUT_S = 0.05
#: Most of an events file read: a job counting units twice a second for a week writes less.
MAX_EVENTS_BYTES = 64 << 20
#: Longest label value kept (a job name is the user's input).
MAX_LABEL_CHARS = 256
#: Places in a (job, host) event_seq block: the open, the events file's lines, the agent's
#: heartbeats (holders.tend), the epilog's close; the block's last one is the close made
#: for a dead slurmd (holders.HolderRecord.close_seq).
OPEN_AT, LINES_AT, BEATS_AT, CLOSE_AT, ABANDONED_AT = 1, 1 << 28, 1 << 29, (1 << 32) - 2, (1 << 32) - 1
#: What Slurm's job states become in ``end_state`` (README "Slurm"); others: none.
END_STATES = {
    "CANCELLED": "cancelled",
    "TIMEOUT": "timeout",
    "NODE_FAIL": "node_fail",
    "PREEMPTED": "preempted",
    "OUT_OF_MEMORY": "out_of_memory",
    "DEADLINE": "deadline",
    "BOOT_FAIL": "boot_fail",
}
#: A COMPLETING job's reason that says how it ended.
END_REASONS = {"TimeLimit": "timeout", "NodeDown": "node_fail", "Preempted": "preempted"}

_JOB_ID = re.compile(r"[0-9]{1,20}")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class SlurmError(ValueError):
    """What a hook could not do, in one line."""


@dataclass(frozen=True)
class Node:
    """This node's settings, from the agent's config file."""

    host: wire.pb.Host
    outbox: Path
    slurm_dir: Path


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
    host = wire.Host(host_id=settings.host_id or socket.gethostname(), labels=settings.labels)
    return Node(host, root, Path(settings.slurm_dir))


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


def bounded(labels: Mapping[str, str]) -> dict[str, str]:
    """``labels`` without control characters, each value at most MAX_LABEL_CHARS."""
    return {k: _CONTROL.sub(" ", v)[:MAX_LABEL_CHARS] for k, v in labels.items() if v.strip()}


def controller_view(job_id: str, timeout_s: float = SCONTROL_TIMEOUT_S) -> dict[str, str]:
    """What ``scontrol show job -o`` says of the job (name, account, qos, state, reason,
    exit_code); {} when the controller does not answer in time."""
    try:
        out = subprocess.run(
            [SCONTROL, "show", "job", "-o", job_id],
            capture_output=True,
            timeout=timeout_s,
            env={"PATH": "/usr/bin:/bin", **{k: v for k, v in os.environ.items() if k == "SLURM_CONF"}},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_show_job(out.stdout[: 1 << 20].decode(errors="replace"))


def parse_show_job(text: str) -> dict[str, str]:
    """The fields we use of one ``scontrol show job -o`` line (JobName may hold spaces)."""
    line = text.splitlines()[0] if text else ""
    found: dict[str, str] = {}
    name = re.search(r"\bJobName=(.*?) UserId=", line)
    if name:
        found["name"] = name.group(1)
    keys: tuple[tuple[str, str], ...] = (
        ("Account", "account"),
        ("QOS", "qos"),
        ("JobState", "state"),
        ("Reason", "reason"),
    )
    keys += (("ArrayJobId", "array_job_id"), ("ArrayTaskId", "array_task_id"))  # not in a 22.05 prolog's env
    for key, field in keys:
        match = re.search(rf"\b{key}=(\S+)", line)
        if match and match.group(1) != "(null)":
            found[field] = match.group(1)
    code = re.search(r"\bExitCode=([0-9]+):([0-9]+)", line)
    if code:
        found["exit_code"] = str(exit_status(f"{code.group(1)}:{code.group(2)}"))
    return bounded(found)


def exit_status(exit_code2: str) -> int:
    """Shell convention from Slurm's ``EXIT:SIGNAL`` (``SLURM_JOB_EXIT_CODE2``): 128+N for signal N."""
    code, _, sig = exit_code2.partition(":")
    try:
        number, signal_number = int(code), int(sig or 0)
    except ValueError:
        raise SlurmError(f"SLURM_JOB_EXIT_CODE2 {exit_code2[:50]!r} is not EXIT:SIGNAL") from None
    return 128 + signal_number if signal_number else number


def end_state(view: Mapping[str, str]) -> str:
    """How Slurm ended the job, from the controller's view at the epilog ("" when on its own)."""
    state = view.get("state", "")
    if state in END_STATES:
        return END_STATES[state]
    return END_REASONS.get(view.get("reason", ""), "") if state == "COMPLETING" else ""


def seq_base(job_id: str, host_id: str) -> int:
    """The (job, host) event_seq block of every hook: the same in every process, as random as
    EventBuilder's own bases (``(1..2**31-1) << 32``) against other writers'."""
    digest = int.from_bytes(hashlib.sha256(f"slurm\0{job_id}\0{host_id}".encode()).digest()[:8], "big")
    return (digest % (2**31 - 1) + 1) << 32


def builder(job: SlurmJob, node: Node, name: str = "", labels: Mapping[str, str] | None = None) -> EventBuilder:
    spec = JobSpec(job.job_id, name or job.job_id, labels={**job.labels, **(labels or {})})
    return EventBuilder(spec, base=seq_base(job.job_id, node.host.host_id))


def send(node: Node, events: list[wire.pb.JobEvent]) -> None:
    """Keep ``events`` in the host's outbox (the agent delivers them)."""
    spool = open_outbox(node.outbox, node.host)
    try:
        spool.add_job_events(events)
    finally:
        spool.close()


def events_path(node: Node, job_id: str) -> Path:
    return node.slurm_dir / f"{job_id}.events"


def _root_dir(directory: Path) -> None:
    """Make ``directory`` (root's, mode 0755) unless it is there; refuse one a user could change."""
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SlurmError(f"{directory} is not a directory of this user's that others cannot write: not used")


def make_events_file(node: Node, job: SlurmJob) -> Path:
    """The job's events file, empty, owned by the job's user (mode 0600), in root's directory."""
    _root_dir(node.slurm_dir)
    path = events_path(node, job.job_id)
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


def read_events_file(path: Path, uid: int) -> list[str]:
    """The lines of the job's events file, refusing a link, anything but a regular file and a
    file not owned by the job's user (nobody else's input counts for the job)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SlurmError(f"events file {path}: {exc.strerror or exc} (a link is not followed)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_nlink != 1:
            raise SlurmError(f"events file {path}: not a regular file of the job's user (uid {uid}): ignored")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(MAX_EVENTS_BYTES)
    finally:
        os.close(fd)
    return data.decode(errors="replace").split("\n")[:-1]  # a last line without its newline is unfinished


def line_events(events: EventBuilder, lines: list[str], now_ns: int) -> tuple[list[wire.pb.JobEvent], int]:
    """UNITS / PHASE events of the events file's ``lines`` (line N at its fixed place; a line
    without a time counts at ``now_ns``), and how many lines were malformed."""
    out, bad = [], 0
    for number, line in enumerate(lines[: BEATS_AT - LINES_AT]):
        try:
            parsed = parse_event_line(line)
        except ValueError:
            bad += 1
            continue
        if parsed is None:
            continue
        verb, arg, stamp = parsed
        kind, fields = (
            (wire.pb.JobEvent.KIND_UNITS, {"units": float(arg)})
            if verb == "units"
            else (wire.pb.JobEvent.KIND_PHASE, {"phase": arg[:MAX_LABEL_CHARS]})
        )
        out.append(events.make(kind, stamp or now_ns, at=LINES_AT + number, **fields))
    return out, bad


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
    problems: list[str] = []
    view = controller_view(job.job_id)
    extra: dict[str, str] = {k: view[k] for k in ("account", "qos", "array_job_id", "array_task_id") if k in view}
    events = builder(job, node, view.get("name", ""), extra)
    try:
        check_storable(events.spec, node.host.host_id, node.host.labels)
    except ValueError as exc:
        problems.append(f"name and labels left out: {exc}")
        events = EventBuilder(JobSpec(job.job_id, job.job_id), base=seq_base(job.job_id, node.host.host_id))
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
    )
    holders.keep(node.outbox, record)
    return problems


def epilog(env: Mapping[str, str], config: Path | None) -> list[str]:
    """Count the events file's lines and close the job on this node; what went wrong, one line each."""
    node, job = node_settings(config, env), SlurmJob.from_env(env)
    problems: list[str] = []
    now_ns = time.time_ns()
    events = builder(job, node)
    path = events_path(node, job.job_id)
    try:
        out, bad = line_events(events, read_events_file(path, job.uid), now_ns)
        if bad:
            problems.append(f"{bad} malformed lines in the events file ignored")
    except SlurmError as exc:
        out = []
        problems.append(str(exc))
    view = controller_view(job.job_id)
    code = view.get("exit_code") or str(exit_status(env.get("SLURM_JOB_EXIT_CODE2", "0:0")))
    out.append(
        events.make(wire.pb.JobEvent.KIND_CLOSE, now_ns, at=CLOSE_AT, exit_code=int(code), end_state=end_state(view))
    )
    send(node, out)
    holders.drop(node.outbox, job.job_id, node.host.host_id)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return problems


def task_prolog(env: Mapping[str, str], config: Path | None) -> list[str]:
    """TaskProlog's output: the lines that set the task's job id and events file."""
    node, job = node_settings(config, env), SlurmJob.from_env(env)
    lines = [f"export {ENV_JOB_ID}={job.job_id}"]
    path = events_path(node, job.job_id)
    if path.exists() and re.fullmatch(r"[A-Za-z0-9/._-]+", str(path)):  # TaskProlog does no quoting
        lines.append(f"export {ENV_EVENTS}={path}")
    return lines
