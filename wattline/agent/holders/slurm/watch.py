"""The agent's part in a Slurm node's jobs (docs/operations/slurm.md), from the prolog to after the epilog.

Every ``every_s`` (an idle node: every IDLE_EVERY_S, one lstat of the directory) it takes
the hooks' notes (:mod:`.slurm_jobs`: a job's open, its close) and looks at the jobs whose
holder is a slurmd of this host (the holder records it keeps for them, :mod:`.holders`),
reading the new complete lines of each one's events file, so a ``units N`` line without a
time counts when it was written (within ``every_s``), not at the epilog; the file counts
only while the job's user owns it, a link is never followed, and the reader's progress is
kept under a lock (:func:`.slurm_node.progress`), so each line is sent once. And it answers
the requests its closes left (``<job>.ending``): once the controller has settled how a job
ended (on 22.05 every job is COMPLETING during its epilog, a cancelled one too), the close
is sent again with its ``end_state``: the same identity, so the store keeps one close, now
saying "cancelled".

On a shared node it also reads each open job's cgroup CPU time (:mod:`.slurm_cgroups`) and,
once per ``use_every_s``, sends each job a ``cpu:host`` USE event: its CPU time against
every process's over the period (the ``cpu-time`` share rule splits CPU, DRAM and NIC by
it; :class:`.cpu_use.CpuTally`). The event's place is fixed by the period's number (time //
``use_every_s``), so a period is one event whoever sends it. A job's cgroup counts from 0
from its start, so its first period runs from its open; its last, sent with its close, to
the epilog's instant (its cgroup still there: else that stretch is the report's to
estimate and bound).

Where a GPU is shared (several jobs, or processes of no job on it), every second it asks the
per-process sources how much of each GPU each process used, finds each process's job by its
cgroup (:meth:`.slurm_cgroups.SlurmCgroups.job_of_pid`: only the open jobs', so a process
of no job counts to nobody) and tallies each job's use of each GPU it ran on or claims
(:mod:`.process_use`); each use period it sends the job a USE event per such GPU, at the
GPU's own slot of the period (:func:`use_slot`: the same after a restart). A closing job's
last, partial period goes out just before its close, which says which GPUs' per-process use
was read (``use_scope``: a job charged none of them by claim gets its share by use there).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.agent.holders import registry as holders
from wattline.agent.holders.slurm import node as slurm_node
from wattline.agent.holders.slurm import records as slurm_records
from wattline.agent.holders.slurm.cgroups import SlurmCgroups
from wattline.agent.holders.slurm.jobs import HookNotes
from wattline.agent.sources.base import Channel
from wattline.agent.usage.cpu_use import CpuPeriod, CpuTally, cpu_place
from wattline.agent.usage.process_use import UseSource, UseTallies, use_fields

log = logging.getLogger(__name__)

Deliver = Callable[[wire.pb.Host, list[wire.pb.JobEvent]], None]

#: Seconds between two asks of the controller about one ended job, and how long it is asked.
ASK_EVERY_S, ASK_FOR_S = 2.0, 300.0
#: Seconds per use period (one CPU-time event per job and period: 64 jobs cost 13 events/s;
#: one more per GPU the job ran on or claims).
USE_EVERY_S = 5.0
#: Seconds between two asks of the per-process sources: a process's use since the previous
#: ask is lost if it exits before the next one (its samples go with it).
SAMPLE_S = 1.0
#: An idle node's passes look only at the directory's mtime; a whole pass at least this often.
QUIET_MAX_S = 10.0
#: Seconds between an idle node's passes (a wake-up of the thread costs more CPU than a quiet
#: pass). The first job's note keeps its hook's instant; taken up to this much later, its
#: first seconds have no GPU use read (a shared GPU's split by use misses them), its first CPU
#: time period goes by the share rule's fallback, and a ``units N`` line without a time
#: written then counts at that pass.
IDLE_EVERY_S = 2.0


def gpu_uuids(channels: Iterable[Channel]) -> dict[int, str]:
    """This node's GPUs, NVML index -> UUID, from the GPU channels' ``index`` and ``uuid`` info."""
    out = {}
    for channel in channels:
        info = dict(channel.info)
        if channel.component == "gpu" and info.get("index", "").isdigit() and info.get("uuid"):
            out[int(info["index"])] = info["uuid"]
    return out


def use_slot(device: str, gpus: Mapping[int, str]) -> int:
    """The slot of ``device``'s USE events in a period (:func:`.slurm_node.use_place`), the same
    in every agent of the host: 1 + the GPU's index (``gpus``: index -> UUID), or the N of
    ``<kind>:N``; else by its name's hash."""
    index = next((i for i, uuid in gpus.items() if device == f"gpu:{uuid}"), None)
    numbered = re.fullmatch(r"[a-z]+:([0-9]{1,4})", device)
    if index is None and numbered:
        index = int(numbered.group(1))
    if index is not None and index < slurm_node.USE_SLOTS - 1:
        return 1 + index
    return 1 + zlib.crc32(device.encode()) % (slurm_node.USE_SLOTS - 1)


def claims_of(record: holders.HolderRecord) -> frozenset[str]:
    """The devices a holder record says its job claims (nothing where the record is not ours)."""
    devices = record.devices if isinstance(record.devices, list) else []
    return frozenset(d for d in devices if isinstance(d, str))


class SlurmWatcher:
    """See the module doc; :meth:`run` until stopped, or :meth:`poll` once."""

    def __init__(
        self,
        outbox_root: Path,
        slurm_dir: Path,
        host: wire.pb.Host,
        deliver: Deliver,
        sysfs_root: Path = Path("/"),
        use_every_s: float = USE_EVERY_S,
        gpus: Callable[[], dict[int, str]] = dict,
        use_sources: Callable[[], Sequence[UseSource]] = list,
    ) -> None:
        self.outbox_root, self.slurm_dir, self.host, self.deliver = outbox_root, slurm_dir, host, deliver
        self.asked: dict[str, float] = {}  #: ending request -> monotonic time of its last ask
        self.errors: dict[str, str] = {}  #: job -> its events file's last problem (said once)
        self.cgroups = SlurmCgroups(sysfs_root)
        self.use_period_ns = max(1, int(use_every_s * 1e9))
        self._period = -1  #: number of the use period of the last CPU reading
        self.cpu = CpuTally()  #: each open job's CPU time against the node's
        self._read: set[str] = set()  #: the jobs whose cgroup the last reading found
        self.use_sources, self.use = use_sources, UseTallies()
        self._use_from = 0  #: start of the GPU use period being tallied (0: before the first ask)
        self._now = 0  #: the current pass's time
        self._use_error: str | None = None
        self._idle_since: tuple[int, float] | None = None  #: (directory mtime, monotonic) of an idle whole pass
        #: No job of ours open and nothing waiting (or no directory): run() looks every IDLE_EVERY_S.
        self.idle = False
        self.notes = HookNotes(outbox_root, slurm_dir, host, deliver, gpus, self._last_use)

    def run(self, stop: threading.Event, every_s: float = 0.5) -> None:
        while not stop.is_set():
            try:
                self.poll()
            except Exception:  # a bug here must not end the agent's sampling
                log.exception("slurm: pass failed")
            stop.wait(IDLE_EVERY_S if self.idle else every_s)

    def poll(self, now_ns: int | None = None) -> None:
        looked_ns = time.time_ns()  # before the lstat: a file made after it has a later mtime
        st = self._root_dir()
        self.idle = st is None or self._idle_since is not None
        if st is None:
            return
        now_ns = self._now = time.time_ns() if now_ns is None else now_ns
        quiet = self._quiet(st, time.monotonic())
        period = now_ns // self.use_period_ns
        if period != self._period or now_ns - self.use.last_ns >= SAMPLE_S * 1e9:
            self._sample([] if quiet else self._mine(), now_ns)  # before a close note takes its job's last period
        mine: list[holders.HolderRecord] = []
        if not quiet:
            self.notes.take()
            mine = self._mine()
            for record in mine:
                self._lines(record, now_ns)
        if period != self._period:
            self._send_use(mine, now_ns, period)
        if not quiet:
            self._endings()
            idle = not mine and not self.asked and not self.notes.left
            # a directory changed within a second of the lstat may change again within its mtime's tick
            settled = looked_ns - st.st_mtime_ns > 1e9
            self._idle_since = (st.st_mtime_ns, time.monotonic()) if idle and settled else None
            self.idle = self._idle_since is not None

    def _quiet(self, st: os.stat_result, now: float) -> bool:
        """Nothing to do since the last whole pass: it found no job of ours open and no note or
        ending request waiting, and no file was made in the directory since (its mtime, older
        than a second then, is unchanged). A hook makes every note and events file there, so an
        idle node's pass is one lstat; a whole pass still runs every QUIET_MAX_S."""
        if self._idle_since is None:
            return False
        mtime_ns, since = self._idle_since
        return st.st_mtime_ns == mtime_ns and now - since < QUIET_MAX_S

    def _mine(self) -> list[holders.HolderRecord]:
        """The holder records of this host's open Slurm jobs."""
        return [
            record
            for _, record in holders.records(self.outbox_root)
            if record.holder_name == "slurmd" and record.host_id == self.host.host_id and record.owner_uid >= 0
        ]

    def _root_dir(self) -> os.stat_result | None:
        """The events directory's lstat where it is there and only root can change it (no file
        in it counts otherwise), else None."""
        try:
            st = os.lstat(self.slurm_dir)
        except OSError:
            return None
        return st if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022 else None

    def _lines(self, record: holders.HolderRecord, now_ns: int) -> None:
        path = slurm_records.events_path(self.slurm_dir, record.job_id)
        if not path.exists():
            return  # not made, or the epilog has taken it: no progress file to leave behind
        try:
            with slurm_node.progress(self.slurm_dir, record.job_id) as state:
                data = slurm_node.read_events_file(path, record.owner_uid, state[0])
                base = slurm_node.seq_base(record.job_id, record.host_id)
                events, _ = slurm_node.new_line_events(record.job_id, base, data, state, now_ns)
                if events:
                    self.deliver(record.host(), events)  # raises: progress not kept, read again next time
            self.errors.pop(record.job_id, None)
        except (OSError, slurm_records.SlurmError) as exc:
            if self.errors.get(record.job_id) != str(exc):
                log.warning("slurm job %s: events file not read: %s", record.job_id[:100], exc)
                self.errors[record.job_id] = str(exc)

    def _send_use(self, records: list[holders.HolderRecord], now_ns: int, period: int) -> None:
        """The use period that ends: each open job's CPU-time and GPU USE events."""
        events = self._cpu(records, now_ns, period)
        self.use.keep_only({r.job_id for r in records})
        for record in records:
            base = slurm_node.seq_base(record.job_id, record.host_id)
            events.setdefault(record.job_id, []).extend(self._gpu_events(record.job_id, base, period, now_ns))
        # one delivery per host and period, not per job: each is an outbox directory of its own,
        # delivered one by one, and 64 busy jobs made them faster than they were delivered
        by_host: dict[str, tuple[wire.pb.Host, list[wire.pb.JobEvent]]] = {}
        for record in records:
            if events.get(record.job_id):
                by_host.setdefault(record.host_id, (record.host(), []))[1].extend(events[record.job_id])
        for host, batch in by_host.values():
            try:
                self.deliver(host, batch)
            except Exception as exc:  # the outbox refused them: this period goes by the rule's fallback
                log.warning("slurm: use of %d jobs not sent: %s", len({e.job_id for e in batch}), exc)
        self._period, self._use_from = period, now_ns

    def _cpu(self, records: list[holders.HolderRecord], now_ns: int, period: int) -> dict[str, list[wire.pb.JobEvent]]:
        """Each open job's CPU time since its last reading against the node's, as one event per job."""
        readings: dict[str, float | None] = {}
        for record in records:
            value = self.cgroups.job_cpu_ns(record.job_id, record.owner_uid)
            if value is not None and not self.cpu.known(record.job_id):
                if record.open_ns <= now_ns:  # its cgroup counts from its start
                    self.cpu.start(record.job_id, record.open_ns, 0.0, record.open_ns)
                else:  # an open stamped after this pass (another clock): known from this reading on
                    self.cpu.start(record.job_id, now_ns, value, now_ns)
            readings[record.job_id] = value
        for gone in self._read - set(readings):
            self.cgroups.forget(gone)
        self._read = {job for job, value in readings.items() if value is not None}
        periods = self.cpu.read(now_ns, self.cgroups.host_cpu_ns(), readings)
        out: dict[str, list[wire.pb.JobEvent]] = {}
        for record in records:
            if parts := periods.get(record.job_id):
                base = slurm_node.seq_base(record.job_id, record.host_id)
                out[record.job_id] = [_cpu_event(record.job_id, base, period, p) for p in parts]
        return out

    def _use_event(
        self, job_id: str, base: int, period: int, slot: int, end_ns: int, fields: dict[str, Any]
    ) -> wire.pb.JobEvent:
        place = slurm_node.use_place(period, slot)
        return wire.JobEvent(
            job_id=job_id, kind=wire.pb.JobEvent.KIND_USE, time_ns=end_ns, event_seq=base | place, **fields
        )

    # ----------------------------------------------------------------- GPUs shared

    def _sample(self, records: list[holders.HolderRecord], now_ns: int) -> None:
        """Ask the per-process sources once; add each open job's use of each GPU since the last ask."""
        jobs = {r.job_id: r.owner_uid for r in records}
        sources = self.use_sources() if jobs else ()
        folders = self.cgroups.job_folders(jobs) if sources else {}  # a node without GPUs: none
        claims = {r.job_id: claims_of(r) for r in records}
        owners = frozenset(folders.items())
        errors = self.use.sample(
            sources, lambda pid: self.cgroups.job_of_pid(pid, folders), now_ns, claims, owners=owners
        )
        error = errors[0] if errors else None
        if error and error != self._use_error:
            log.warning("slurm: %s (the jobs get no share by use of their GPUs meanwhile)", error)
        self._use_error = error
        self._use_from = self._use_from or now_ns

    def _gpu_events(self, job_id: str, base: int, period: int, end_ns: int) -> list[wire.pb.JobEvent]:
        """The job's USE events of its GPUs since the last use period, ending at ``end_ns``."""
        span, tallies = end_ns - self._use_from, self.use.take(job_id)
        if span <= 0 or not tallies:
            return []
        gpus = self.notes.gpus()
        return [
            self._use_event(job_id, base, period, use_slot(device, gpus), end_ns,
                            use_fields(device, span, t.mine, t.total, t.metric))
            for device, t in sorted(tallies.items())
        ]  # fmt: skip

    def _last_use(self, job_id: str, uid: int, base: int, end_ns: int) -> tuple[list[wire.pb.JobEvent], list[str]]:
        """For a job's close at ``end_ns``: its use since its last USE events (CPU time, to its
        end, where its cgroup is still there; GPUs), at the places of the period after this one
        (this one's may hold them already), and the use scope."""
        period, now_ns = self._now // self.use_period_ns + 1, self._now
        events = []
        value, host_cpu = self.cgroups.job_cpu_ns(job_id, uid), self.cgroups.host_cpu_ns()
        events += [_cpu_event(job_id, base, period, p) for p in self.cpu.end(job_id, end_ns, value, now_ns, host_cpu)]
        events += self._gpu_events(job_id, base, period, self.use.last_ns)
        return events, sorted(self.use.scope)

    def _endings(self) -> None:
        try:
            requests = sorted(self.slurm_dir.glob("*.ending"))
        except OSError:
            return
        for path in requests:
            if time.monotonic() - self.asked.get(path.name, 0.0) >= ASK_EVERY_S:
                self.asked[path.name] = time.monotonic()
                try:
                    self._ending(path)
                except Exception as exc:  # the outbox refused it: the request stays for the next look
                    log.warning("slurm: %s not answered yet: %s", path.name, exc)
        self.asked = {k: v for k, v in self.asked.items() if (self.slurm_dir / k).exists()}

    def _ending(self, path: Path) -> None:
        found = slurm_node.read_ending(path)
        if found is None or found[0].host_id != self.host.host_id:
            return
        host, close, conf = found
        view = slurm_node.controller_view(close.job_id, conf=conf)
        settled = view.get("state", "") not in slurm_node.UNSETTLED and bool(view)
        if not settled and time.time_ns() - close.time_ns < ASK_FOR_S * 1e9:
            return
        close.end_state = slurm_node.end_state(view)
        if close.end_state:
            self.deliver(host, [close])
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _cpu_event(job_id: str, base: int, period: int, p: CpuPeriod) -> wire.pb.JobEvent:
    """A part of a job's CPU-time period as its USE event, at its place in the use period."""
    place = cpu_place(period, p.part)
    return wire.JobEvent(
        job_id=job_id, kind=wire.pb.JobEvent.KIND_USE, time_ns=p.end_ns, event_seq=base | place, **p.fields()
    )
