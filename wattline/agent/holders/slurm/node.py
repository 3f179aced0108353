"""What the agent makes of a Slurm job (docs/operations/slurm.md): the (job, host) event_seq block and
the places in it, the events file's lines as events, what the controller says of a job and
of how it ended, the job's GPUs.

The events file is the job's user's input and the agent runs as root: it is opened without
following a link and counts only while its user owns it. The agent reads an open job's
file as it grows and what is left once the epilog noted the end, keeping the reader's
progress (byte offset, line number) in ``<job>.read`` beside the file under an exclusive
lock from reading the lines to handing their events over, so a line is sent once, at the
time it was first read, also across an agent's restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from wattline import wire
from wattline.agent.holders import event_lines
from wattline.agent.holders.slurm import records as slurm_records
from wattline.agent.holders.slurm.records import SlurmError

#: The controller is asked for what a 22.05 prolog's environment lacks (name, account, QOS)
#: and how the job ended, by the agent (no hook waits for it), never for longer than this.
SCONTROL = "/usr/bin/scontrol"
SCONTROL_TIMEOUT_S = 2.0
#: Most of an events file read: a job counting units twice a second for a week writes less.
MAX_EVENTS_BYTES = 64 << 20
#: Longest label value kept (a job name is the user's input).
MAX_LABEL_CHARS = 256
#: Places in a (job, host) event_seq block: the open, the events file's lines, the agent's
#: heartbeats (holders.tend), its CPU-time USE periods, the epilog's close; the block's last
#: one is the close made for a dead slurmd (holders.HolderRecord.close_seq).
OPEN_AT, LINES_AT, BEATS_AT, USE_AT = 1, 1 << 28, 1 << 29, 1 << 30
CLOSE_AT, ABANDONED_AT = (1 << 32) - 2, (1 << 32) - 1
#: USE places: USE_SLOTS devices per use period (slot 0: ``cpu:host``), USE_PERIODS periods
#: before the numbers wrap (2**30 places from USE_AT: below CLOSE_AT).
USE_SLOTS, USE_PERIODS = 64, 1 << 24
#: What Slurm's job states become in ``end_state`` (docs/operations/slurm.md); others: none.
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
#: Job states of a job whose end the controller has not settled yet.
UNSETTLED = frozenset({"COMPLETING", "RUNNING", "PENDING", "CONFIGURING", "SUSPENDED", "STAGE_OUT"})

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def seq_base(job_id: str, host_id: str) -> int:
    """The (job, host) event_seq block of every hook and the agent: the same in every process,
    as random as EventBuilder's own bases (``(1..2**31-1) << 32``) against other writers'."""
    digest = int.from_bytes(hashlib.sha256(f"slurm\0{job_id}\0{host_id}".encode()).digest()[:8], "big")
    return (digest % (2**31 - 1) + 1) << 32


def use_place(period: int, slot: int) -> int:
    """The place of a USE event of use period number ``period`` (time // period length), device ``slot``."""
    return USE_AT + (period % USE_PERIODS) * USE_SLOTS + slot % USE_SLOTS


def bounded(labels: Mapping[str, str]) -> dict[str, str]:
    """``labels`` without control characters, each value at most MAX_LABEL_CHARS."""
    return {k: _CONTROL.sub(" ", v)[:MAX_LABEL_CHARS] for k, v in labels.items() if v.strip()}


# --------------------------------------------------------------------- the controller


@dataclass
class Asked:
    """A ``scontrol show job`` under way (:func:`ask_controller`), answered by :func:`answer`."""

    proc: subprocess.Popen[bytes] | None
    deadline: float  #: time.monotonic() after which the answer is not waited for


def ask_controller(job_id: str, timeout_s: float = SCONTROL_TIMEOUT_S, conf: str = "") -> Asked:
    """Start asking ``scontrol show job -o`` about the job (several jobs are asked at once).
    ``conf``: the slurm.conf (default: ``$SLURM_CONF``, else Slurm's own)."""
    conf = conf or os.environ.get("SLURM_CONF", "")
    deadline = time.monotonic() + timeout_s
    try:
        proc = subprocess.Popen(
            [SCONTROL, "show", "job", "-o", job_id],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", **({"SLURM_CONF": conf} if conf else {})},
        )
    except OSError:
        proc = None
    return Asked(proc, deadline)


def answer(asked: Asked) -> dict[str, str]:
    """What the controller said of the job (name, account, qos, state, reason, exit_code); {}
    when it did not answer by the deadline (then scontrol is ended)."""
    if asked.proc is None:
        return {}
    try:
        out, _ = asked.proc.communicate(timeout=max(0.0, asked.deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        asked.proc.kill()
        asked.proc.communicate()
        return {}
    return parse_show_job(out[: 1 << 20].decode(errors="replace"))


def controller_view(job_id: str, timeout_s: float = SCONTROL_TIMEOUT_S, conf: str = "") -> dict[str, str]:
    """:func:`answer` to :func:`ask_controller`, waited for at once."""
    return answer(ask_controller(job_id, timeout_s, conf))


def parse_show_job(text: str) -> dict[str, str]:
    """The fields we use of one ``scontrol show job -o`` line (JobName may hold spaces)."""
    line = text.splitlines()[0] if text else ""
    found: dict[str, str] = {}
    name = re.search(r"\bJobName=(.*?) UserId=", line)
    if name:
        found["name"] = name.group(1)
    keys = (
        ("Account", "account"),
        ("QOS", "qos"),
        ("JobState", "state"),
        ("Reason", "reason"),
        ("ArrayJobId", "array_job_id"),  # not in a 22.05 prolog's env
        ("ArrayTaskId", "array_task_id"),
    )
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
    """How Slurm ended the job, from the controller's view ("" when on its own, or not known yet)."""
    state = view.get("state", "")
    if state in END_STATES:
        return END_STATES[state]
    return END_REASONS.get(view.get("reason", ""), "") if state == "COMPLETING" else ""


# --------------------------------------------------------------------- the events file


@contextlib.contextmanager
def progress(slurm_dir: Path, job_id: str, wait_s: float = 0.2) -> Iterator[list[int]]:
    """The events file's reader progress ``[offset, line number]``, locked against the other
    reader; what the caller leaves in the list is kept. Waits at most ``wait_s`` for the lock
    (then goes on without it: a hook is never held up for long)."""
    path = slurm_dir / f"{job_id}.read"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.005)
        try:
            offset, number = (int(x) for x in os.pread(fd, 64, 0).split())
        except ValueError:  # new, or not ours to trust: from the start
            offset, number = 0, 0
        state = [offset, number]
        yield state
        if state != [offset, number]:
            data = f"{state[0]} {state[1]}\n".encode()
            os.pwrite(fd, data.ljust(64), 0)
    finally:
        os.close(fd)  # releases the lock


def read_events_file(path: Path, uid: int, offset: int = 0) -> bytes:
    """The events file's bytes from ``offset``, refusing a link, anything but a regular file and
    a file not owned by the job's user (nobody else's input counts for the job)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return b""
    except OSError as exc:
        raise SlurmError(f"events file {path}: {exc.strerror or exc} (a link is not followed)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_nlink != 1:
            raise SlurmError(f"events file {path}: not a regular file of the job's user (uid {uid}): ignored")
        return os.pread(fd, max(0, MAX_EVENTS_BYTES - offset), offset)
    finally:
        os.close(fd)


def new_line_events(
    job_id: str, base: int, data: bytes, state: list[int], now_ns: int
) -> tuple[list[wire.pb.JobEvent], int]:
    """UNITS / PHASE events of the complete lines in ``data`` (the file from ``state``'s offset),
    line N at its fixed place, a line without a time at ``now_ns``; advances ``state`` past
    them. Returns the events and how many lines were bad (each said once per kind of problem,
    :data:`~wattline.agent.holders.event_lines.AGENT_BAD_LINES`; blank, ``#`` and ``latency`` lines are
    good, and make no event)."""
    complete = data[: data.rfind(b"\n") + 1]  # a last line without its newline is unfinished
    out, bad = [], 0
    for raw in complete.split(b"\n")[:-1]:
        number = state[1]
        state[1] += 1
        try:
            parsed = event_lines.parse_line(raw.decode(errors="replace"))
        except event_lines.BadLine as exc:
            bad += 1
            event_lines.AGENT_BAD_LINES.report(f"slurm job {job_id[:100]}: events file", exc)
            continue
        event = event_lines.job_event(parsed) if parsed is not None else None
        if event is None or number >= BEATS_AT - LINES_AT:
            continue  # no event, or past the block's room for lines
        kind, fields, stamp = event
        out.append(
            wire.JobEvent(
                job_id=job_id, kind=kind, time_ns=stamp or now_ns, event_seq=base | (LINES_AT + number), **fields
            )
        )
    state[0] += len(complete)
    return out, bad


# --------------------------------------------------------------------- the job's GPUs


def gpu_claims(job_gpus: str, uuids: Mapping[int, str]) -> tuple[list[str], list[str]]:
    """Device claims of ``SLURM_JOB_GPUS`` (host indices, ``0,2``): ``gpu:<UUID>`` by the
    agent's GPUs (index -> UUID), ``gpu:<index>`` where it has none; and the indices left by number."""
    claims, by_index = [], []
    for index in (i.strip() for i in job_gpus.split(",")):
        if not re.fullmatch(r"[0-9]{1,4}", index):
            continue  # not a host index (empty, or something Slurm does not write)
        uuid = uuids.get(int(index), "")
        if re.fullmatch(r"[A-Za-z0-9-]{1,96}", uuid):
            claims.append(f"gpu:{uuid}")
        else:
            claims.append(f"gpu:{index}")
            by_index.append(index)
    return claims, by_index


# --------------------------------------------------------------------- how the job ended, asked later


def write_ending(slurm_dir: Path, close: wire.pb.JobEvent, host: wire.pb.Host, conf: str) -> Path:
    """Leave the watcher a ``close`` to send again once the controller says how the job ended
    (``<job>.ending``, root's, beside the events file): the same identity, so the store keeps
    one close, with its ``end_state``."""
    record = {
        "job_id": close.job_id,
        "host_id": host.host_id,
        "host_labels": dict(host.labels),
        "time_ns": close.time_ns,
        "event_seq": close.event_seq,
        "exit_code": close.exit_code,
        "conf": conf,
    }
    return slurm_records.write_json(slurm_dir / f"{close.job_id}.ending", record)


def read_ending(path: Path) -> tuple[wire.pb.Host, wire.pb.JobEvent, str] | None:
    """(host, close, slurm.conf) of a request; None for a file that is not one (a link,
    another's than this process's user, not what :func:`write_ending` writes)."""
    data = slurm_records.read_json(path)
    if not isinstance(data, dict):
        return None
    try:
        host = wire.Host(host_id=str(data["host_id"]), labels={str(k): str(v) for k, v in data["host_labels"].items()})
        close = wire.JobEvent(
            job_id=str(data["job_id"]),
            kind=wire.pb.JobEvent.KIND_CLOSE,
            time_ns=int(data["time_ns"]),
            event_seq=int(data["event_seq"]),
            exit_code=int(data["exit_code"]),
        )
        return host, close, str(data.get("conf", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
