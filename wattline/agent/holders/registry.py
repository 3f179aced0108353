"""Who holds each open job on this host, so that a dead holder's job ends at once.

A job window is *held* by the process that will close it: ``wattline run`` (the
wrapper), the Python ``Job``. While it holds the job it keeps a small record under the
outbox root (``<root>/holders/``)::

    <root>/holders/j<pid>-<random>.json   job id, host, the holder's pid, process start
                                          time and boot id, where its events go, its
                                          reserved close event_seq; the file's mtime is renewed
                                          every ALIVE_S: when the holder was last alive

and removes it once its own close event is on its way. A wattline process on the host
that finds the holder gone (the agent every few seconds; ``wattline run`` and ``Job`` at
start) ends the job there with a close event marked ``abandoned`` at the time the holder
was last known alive (:func:`end_dead`). That event's identity (host, job id, the
event_seq the record reserves) is the same whoever makes it, so two processes ending
one job store one close. The heartbeat lease (``wire.lease_ns``) still covers what the
host cannot check: a lost host, a holder in another PID namespace.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import stat
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from wattline import wire
from wattline.agent.usage import proc_identity

log = logging.getLogger(__name__)

#: Seconds between two renewals of a holder's record: how far before its death a dead
#: holder's job may end.
ALIVE_S = 1.0
#: Name of a holder's record (nothing else under ``holders/`` is touched).
_NAME = re.compile(r"j[0-9]+-[0-9a-f]{12}\.json")
#: A record larger than this is not one of ours.
_MAX_BYTES = 64 << 10


@dataclass(frozen=True)
class Identity:
    """A process as the kernel tells it apart: pid, start time (ticks since boot), boot id, pid namespace."""

    pid: int
    start_ticks: int
    boot_id: str
    pid_ns: int


def identity(pid: int | None = None, proc: Path = Path("/proc")) -> Identity | None:
    """This process's identity (or ``pid``'s); None where /proc does not tell it."""
    pid = os.getpid() if pid is None else pid
    ticks = proc_identity.start_ticks(proc, pid)
    if ticks is None:
        return None
    return Identity(pid, ticks, proc_identity.boot_id(proc), proc_identity.pid_ns(proc, pid))


def gone(holder: Identity, proc: Path = Path("/proc")) -> bool | None:
    """True when ``holder`` no longer runs; False when it does; None when this process cannot
    tell (another pid namespace, no /proc)."""
    here = proc_identity.pid_ns(proc, "self")
    if not here or not holder.pid_ns or here != holder.pid_ns:
        return None
    boot = proc_identity.boot_id(proc)
    if not boot or not holder.boot_id:
        return None
    if boot != holder.boot_id:
        return True  # the host rebooted since
    return proc_identity.start_ticks(proc, holder.pid) != holder.start_ticks  # exited, or its pid was reused


@dataclass
class HolderRecord:
    """What a holder's file says."""

    job_id: str
    host_id: str
    #: Where the job's events go: ``collector`` (the host's outbox), or ``store:URL`` (embedded).
    sink: str
    pid: int
    start_ticks: int
    boot_id: str
    pid_ns: int
    open_ns: int
    close_seq: int  #: the event_seq of the close made for it: one its holder never uses
    host_labels: dict[str, str] = field(default_factory=dict)
    #: Non-zero for a holder that renews nothing itself (a scheduler's daemon): the agent renews
    #: the record and sends the job's heartbeats for it while it lives (:func:`tend`), event_seq
    #: ``beat_seq`` + the heartbeat period's number.
    beat_seq: int = 0
    #: What the holder is, for the close made when it is gone ("wrapper", "slurmd").
    holder_name: str = "wrapper"
    #: The uid whose input counts for the job (a Slurm job's user: its events file's owner); -1: none.
    owner_uid: int = -1
    #: The devices the job claims on this host, for a holder whose processes the agent measures
    #: (a Slurm job's GPUs: its use of them is sent, a measured 0 too).
    devices: list[str] = field(default_factory=list)

    @property
    def identity(self) -> Identity:
        return Identity(self.pid, self.start_ticks, self.boot_id, self.pid_ns)

    def close_event(self, last_alive_ns: int) -> wire.pb.JobEvent:
        """The close that ends the job for its dead holder: the same event whoever makes it."""
        return wire.JobEvent(
            job_id=self.job_id,
            kind=wire.pb.JobEvent.KIND_CLOSE,
            time_ns=max(last_alive_ns, self.open_ns),
            event_seq=self.close_seq,
            abandoned=f"{self.holder_name} gone: pid {self.pid} no longer runs",
        )

    def host(self) -> wire.pb.Host:
        return wire.Host(host_id=self.host_id, labels=self.host_labels)


def holders_dir(outbox_root: Path) -> Path:
    return outbox_root / "holders"


class Holding:
    """This process's record of one job it holds; :meth:`release` after its own close is sent.

    Renewed every ``every_s`` from a thread of its own, or (``every_s`` None) by the owner's
    :meth:`alive_at` calls: an embedded run renews it as its samples reach the store, so a
    job it held ends where its samples do, not where the samples it lost with it would."""

    def __init__(self, directory: Path, record: HolderRecord, every_s: float | None = ALIVE_S) -> None:
        self.path = directory / f"j{os.getpid()}-{uuid.uuid4().hex[:12]}.json"
        _make_dir(directory)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, json.dumps(asdict(record)).encode())
        finally:
            os.close(fd)
        tmp.replace(self.path)  # readers never see half a record
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if every_s is not None:
            self._thread = threading.Thread(target=self._renew, args=(every_s,), name="wattline-holding", daemon=True)
            self._thread.start()

    def _renew(self, every_s: float) -> None:
        while not self._stop.wait(every_s) and self.alive_at():
            pass

    def alive_at(self, time_ns: int | None = None) -> bool:
        """Say the holder was alive at ``time_ns`` (default now); False once the record is gone."""
        try:
            if time_ns is None:
                os.utime(self.path)
            else:
                os.utime(self.path, ns=(time_ns, time_ns))
        except FileNotFoundError:
            return False  # ended for us by another process (it thought us gone): nothing to renew
        except OSError as exc:
            log.debug("holder record %s not renewed: %s", self.path, exc)
        return True

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def hold(
    outbox_root: Path | None,
    event: wire.pb.JobEvent,
    host: wire.pb.Host,
    sink: str,
    close_seq: int,
    every_s: float | None = ALIVE_S,
) -> Holding | None:
    """Record that this process holds the job ``event`` (its open) opened; None (and a debug
    line) where no record can be kept: the heartbeat lease then ends the job if we die."""
    me = identity()
    if outbox_root is None or me is None:
        return None
    record = HolderRecord(
        event.job_id,
        host.host_id,
        sink,
        me.pid,
        me.start_ticks,
        me.boot_id,
        me.pid_ns,
        event.time_ns,
        close_seq,
        dict(host.labels),
    )
    try:
        return Holding(holders_dir(outbox_root), record, every_s)
    except OSError as exc:
        log.debug("no holder record for job %s: %s", event.job_id[:100], exc)
        return None


def stamp(event: wire.pb.JobEvent, me: Identity | None = None) -> wire.pb.JobEvent:
    """``event`` (an open) saying who holds the job: this process."""
    me = me or identity()
    if me is not None:
        event.holder_pid, event.holder_start_ticks, event.holder_boot_id = me.pid, me.start_ticks, me.boot_id
    return event


@dataclass
class DeadHolder:
    """A record whose holder is gone, and when it was last known alive."""

    path: Path
    record: HolderRecord
    last_alive_ns: int


def _read(path: Path) -> HolderRecord | None:
    """The record at ``path``: a regular file (a link is never followed), small, not writable by
    others than its owner, and ours unless we are root; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o022 or info.st_size > _MAX_BYTES:
            return None
        if info.st_uid != os.geteuid() and os.geteuid() != 0:
            return None  # a user ends the jobs of their own dead holders; root (the agent) any
        data = json.loads(os.read(fd, _MAX_BYTES))
        return HolderRecord(**{k: data[k] for k in HolderRecord.__dataclass_fields__ if k in data})
    except (OSError, ValueError, TypeError):
        return None
    finally:
        os.close(fd)


def _make_dir(directory: Path) -> None:
    """``directory``, shared as its parent is: an outbox root every user writes to (mode 1777,
    where the agent runs as another user) gets a holders directory of the same kind."""
    if directory.is_dir():
        return
    directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shared = directory.parent.stat().st_mode & 0o1777 == 0o1777
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
        if shared:
            os.chmod(directory, 0o1777)  # mkdir's mode is masked by the umask


def dead_holders(
    outbox_root: Path, accept: Callable[[HolderRecord], bool], proc: Path = Path("/proc")
) -> list[DeadHolder]:
    """Records under ``outbox_root`` that ``accept`` takes and whose holder is gone."""
    directory = holders_dir(outbox_root)
    try:
        names = [p for p in directory.iterdir() if _NAME.fullmatch(p.name)]
    except OSError:
        return []
    found = []
    for path in names:
        record = _read(path)
        if record is None or not accept(record) or gone(record.identity, proc) is not True:
            continue
        try:
            last_alive = path.stat().st_mtime_ns
        except OSError:
            continue  # released meanwhile
        found.append(DeadHolder(path, record, last_alive))
    return found


def end_dead(
    outbox_root: Path | None,
    accept: Callable[[HolderRecord], bool],
    deliver: Callable[[wire.pb.Host, list[wire.pb.JobEvent]], None],
    proc: Path = Path("/proc"),
) -> list[HolderRecord]:
    """End the job of every dead holder whose record ``accept`` takes: ``deliver`` its close (raises when it
    cannot take it: the record stays for the next look), then drop the record. Returns what was ended."""
    if outbox_root is None:
        return []
    ended = []
    for dead in dead_holders(outbox_root, accept, proc):
        event = dead.record.close_event(dead.last_alive_ns)
        try:
            deliver(dead.record.host(), [event])
        except Exception as exc:  # the next look tries again; the event's identity makes that safe
            log.warning("job %s: its holder is gone, but its close was not kept: %s", dead.record.job_id[:100], exc)
            continue
        with contextlib.suppress(OSError):  # gone already, or another's in a shared directory
            dead.path.unlink()
        log.info(
            "job %s on %s ended: its holder (pid %d) is gone, last alive at %s",
            dead.record.job_id[:100],
            dead.record.host_id[:100],
            dead.record.pid,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(dead.last_alive_ns / 1e9)),
        )
        ended.append(dead.record)
    return ended


#: Heartbeat periods numbered within a record's ``beat_seq`` block (wraps after 2**28 periods).
_BEATS = 1 << 28


def keep(outbox_root: Path, record: HolderRecord) -> Path:
    """Write ``record`` for a holder that is not this process, under a name fixed by (job, host):
    a hook run again replaces its record instead of adding one."""
    key = hashlib.sha256(f"{record.job_id}\0{record.host_id}".encode()).hexdigest()[:12]
    directory = holders_dir(outbox_root)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"j{record.pid}-{key}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record)))
    tmp.replace(path)
    return path


def records(outbox_root: Path) -> list[tuple[Path, HolderRecord]]:
    """Every holder record under ``outbox_root`` that :func:`_read` accepts, with its path."""
    try:
        names = [p for p in holders_dir(outbox_root).iterdir() if _NAME.fullmatch(p.name)]
    except OSError:
        return []
    return [(path, record) for path in names if (record := _read(path)) is not None]


def drop(outbox_root: Path, job_id: str, host_id: str) -> HolderRecord | None:
    """Remove the records of ``job_id`` on ``host_id`` (its holder closed it); the last one found."""
    found = None
    for path, record in records(outbox_root):
        if record.job_id == job_id and record.host_id == host_id:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            found = record
    return found


def tend(
    outbox_root: Path | None,
    accept: Callable[[HolderRecord], bool],
    deliver: Callable[[wire.pb.Host, list[wire.pb.JobEvent]], None],
    beaten: dict[str, int],
    now_ns: int | None = None,
    proc: Path = Path("/proc"),
) -> int:
    """Renew the records of holders that renew nothing themselves (``beat_seq``) while they live,
    and send each such job's heartbeat once per heartbeat period, so the lease does not end a
    job that runs. ``beaten``: record name -> the last period sent (the caller keeps it). A
    heartbeat's identity and time are those of its period: a restarted agent resends the same
    event. Returns how many heartbeats were delivered."""
    if outbox_root is None:
        return 0
    now_ns = time.time_ns() if now_ns is None else now_ns
    period_ns = max(1, int(wire.heartbeat_s() * 1e9))
    due: dict[str, tuple[wire.pb.Host, list[wire.pb.JobEvent], list[tuple[str, int]]]] = {}
    kept = records(outbox_root)
    for gone_name in set(beaten) - {path.name for path, _ in kept}:
        del beaten[gone_name]  # released: forget it
    for path, record in kept:
        if not record.beat_seq or not accept(record) or gone(record.identity, proc) is not False:
            continue  # its own holder renews it; a dead one is end_dead's; one we cannot check, the lease's
        with contextlib.suppress(OSError):
            os.utime(path)
        number = now_ns // period_ns
        if beaten.get(path.name) == number:
            continue
        event = wire.JobEvent(
            job_id=record.job_id,
            kind=wire.pb.JobEvent.KIND_HEARTBEAT,
            time_ns=max(number * period_ns, record.open_ns),
            event_seq=record.beat_seq + number % _BEATS,
        )
        host, events, names = due.setdefault(record.host_id, (record.host(), [], []))
        events.append(event)
        names.append((path.name, number))
    sent = 0
    for host, events, names in due.values():
        try:
            deliver(host, events)
        except Exception as exc:  # the next look sends them again
            log.warning("heartbeats of %d held jobs not kept: %s", len(events), exc)
            continue
        beaten.update(names)
        sent += len(events)
    return sent
