"""The agent's part in a Slurm node's jobs (README "Slurm"), from the prolog to after the epilog.

Every ``every_s`` it takes the hooks' notes (:mod:`.slurm_jobs`: a job's open, its close) and
looks at the jobs whose holder is a slurmd of this host (the holder records it keeps for
them, :mod:`.holders`), reading the new complete lines of each one's events file, so a
``units N`` line without a time counts when it was written (within ``every_s``), not at the
epilog; the file counts only while the job's user owns it, a link is never followed, and the
reader's progress is kept under a lock (:func:`.slurm_node.progress`), so each line is sent
once. And it answers the requests its closes left (``<job>.ending``): once the controller
has settled how a job ended (on 22.05 every job is COMPLETING during its epilog, a cancelled
one too), the close is sent again with its ``end_state``: the same identity, so the store
keeps one close, now saying "cancelled".

On a shared node it also reads each open job's cgroup CPU time (:mod:`.slurm_cgroups`) and,
once per ``use_every_s``, sends each job a ``cpu:host`` USE event: its CPU time against
every process's over the period (the ``cpu-time`` share rule splits CPU, DRAM and NIC by
it). The event's place is fixed by the period's number (time // ``use_every_s``), so a
period is one event whoever sends it; a job's first period here starts at its first
reading (none before: no USE event, that stretch goes by the rule's fallback).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from wattline import wire
from wattline.agent import holders, slurm_node, slurm_records
from wattline.agent.cgroup_cpu import CPU_DEVICE, CPU_METRIC
from wattline.agent.slurm_cgroups import SlurmCgroups
from wattline.agent.slurm_jobs import HookNotes
from wattline.agent.sources.base import Channel

log = logging.getLogger(__name__)

Deliver = Callable[[wire.pb.Host, list[wire.pb.JobEvent]], None]

#: Seconds between two asks of the controller about one ended job, and how long it is asked.
ASK_EVERY_S, ASK_FOR_S = 2.0, 300.0
#: Seconds per CPU-time USE period (one event per job and period: 64 jobs cost 13 events/s).
USE_EVERY_S = 5.0


def gpu_uuids(channels: Iterable[Channel]) -> dict[int, str]:
    """This node's GPUs, NVML index -> UUID, from the GPU channels' ``index`` and ``uuid`` info."""
    out = {}
    for channel in channels:
        info = dict(channel.info)
        if channel.component == "gpu" and info.get("index", "").isdigit() and info.get("uuid"):
            out[int(info["index"])] = info["uuid"]
    return out


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
    ) -> None:
        self.outbox_root, self.slurm_dir, self.host, self.deliver = outbox_root, slurm_dir, host, deliver
        self.asked: dict[str, float] = {}  #: ending request -> monotonic time of its last ask
        self.errors: dict[str, str] = {}  #: job -> its events file's last problem (said once)
        self.cgroups = SlurmCgroups(sysfs_root)
        self.use_period_ns = max(1, int(use_every_s * 1e9))
        self._period = -1  #: number of the use period of the last CPU reading
        self._read_ns = 0  #: time of the last CPU reading
        self._host_cpu: int | None = None
        self._job_cpu: dict[str, int] = {}  #: job -> its CPU time at the last reading
        self.notes = HookNotes(outbox_root, slurm_dir, host, deliver, gpus)

    def run(self, stop: threading.Event, every_s: float = 0.5) -> None:
        while not stop.is_set():
            try:
                self.poll()
            except Exception:  # a bug here must not end the agent's sampling
                log.exception("slurm: pass failed")
            stop.wait(every_s)

    def poll(self, now_ns: int | None = None) -> None:
        if not self._root_dir():
            return
        self.notes.take()
        now_ns = time.time_ns() if now_ns is None else now_ns
        mine = [
            record
            for _, record in holders.records(self.outbox_root)
            if record.holder_name == "slurmd" and record.host_id == self.host.host_id and record.owner_uid >= 0
        ]
        for record in mine:
            self._lines(record, now_ns)
        self._cpu(mine, now_ns)
        self._endings()

    def _root_dir(self) -> bool:
        """The events directory is there and only root can change it (no file in it counts otherwise)."""
        try:
            st = os.lstat(self.slurm_dir)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022

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

    def _cpu(self, records: list[holders.HolderRecord], now_ns: int) -> None:
        """Once per use period: each open job's CPU time since the last reading against the node's."""
        period = now_ns // self.use_period_ns
        if period == self._period:
            return
        host_cpu = self.cgroups.host_cpu_ns()
        span = now_ns - self._read_ns
        deltas: dict[str, tuple[holders.HolderRecord, int]] = {}
        readings: dict[str, int] = {}
        for record in records:
            value = self.cgroups.job_cpu_ns(record.job_id, record.owner_uid)
            if value is None:
                continue
            readings[record.job_id] = value
            before = self._job_cpu.get(record.job_id)
            if before is not None:
                deltas[record.job_id] = (record, max(0, value - before))
        for gone in set(self._job_cpu) - set(readings):
            self.cgroups.forget(gone)
        if deltas and span > 0:
            host_delta = max(0, host_cpu - self._host_cpu) if host_cpu is not None and self._host_cpu is not None else 0
            total = max(host_delta, sum(d for _, d in deltas.values())) * 100.0 / span
            for record, delta in deltas.values():
                base = slurm_node.seq_base(record.job_id, record.host_id)
                event = wire.JobEvent(
                    job_id=record.job_id,
                    kind=wire.pb.JobEvent.KIND_USE,
                    time_ns=now_ns,
                    event_seq=base | slurm_node.use_place(period, 0),
                    use_device=CPU_DEVICE,
                    use_period_ns=span,
                    job_use=delta * 100.0 / span,
                    device_use=total,
                    use_metric=CPU_METRIC,
                )
                try:
                    self.deliver(record.host(), [event])
                except Exception as exc:  # the outbox refused it: this period goes by the rule's fallback
                    log.warning("slurm job %s: CPU time not sent: %s", record.job_id[:100], exc)
        self._period, self._read_ns, self._host_cpu, self._job_cpu = period, now_ns, host_cpu, readings

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
