"""The agent's side of a Slurm job's hooks (docs/operations/slurm.md): the notes the Prolog and Epilog
leave (:mod:`.slurm_records`) become the job's events.

A ``<job>.open`` note becomes the open event: the job's id, the labels of the hook's
environment and the controller's (name, account, QOS, array ids: asked here, every note of a
pass at once, for at most ``SCONTROL_TIMEOUT_S``), its GPUs (``SLURM_JOB_GPUS``, host
indices) by the UUIDs of this agent's GPU sources; and the holder record of the slurmd that
ran the prolog (:mod:`.holders`): the agent renews it and heartbeats the job while slurmd
lives, and ends the job where slurmd was last alive once it is gone without an epilog.

A ``<job>.close`` note becomes the events file's last lines (a line without a time counts at
the epilog's instant) and the close with the exit status (``SLURM_JOB_EXIT_CODE2``, the
controller's where it has one) and how Slurm ended the job. Where the controller cannot say
that yet (on 22.05 every job is COMPLETING during its epilog, a cancelled one too), the watcher
asks again later (:func:`.slurm_node.write_ending`).

The close comes after the job's last use events and carries the ``use_scope`` (the
watcher's, ``last_use``), made once per note: a note the outbox refused sends the same again.

Each event's place in the (job, host) block is fixed, so a note read again (the agent died
before removing it) stores nothing twice. A note is removed once its events are in the
outbox; one the outbox refused waits for the next pass.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.agent.holders import registry as holders
from wattline.agent.holders.slurm import node as slurm_node
from wattline.agent.holders.slurm import records as slurm_records
from wattline.agent.holders.slurm.records import SlurmError, events_path

log = logging.getLogger(__name__)

Deliver = Callable[[wire.pb.Host, list[wire.pb.JobEvent]], None]
#: (job id, its user's uid, its event_seq block, its end) -> the job's use since its last USE
#: events and the devices whose per-process use was read.
LastUse = Callable[[str, int, int, int], tuple[list[wire.pb.JobEvent], list[str]]]

#: Labels of a job from its hook's environment.
ENV_LABELS = {
    "user": "SLURM_JOB_USER",
    "partition": "SLURM_JOB_PARTITION",
    "nodes": "SLURM_NODELIST",
    "cluster": "SLURM_CLUSTER_NAME",
    "array_job_id": "SLURM_ARRAY_JOB_ID",
    "array_task_id": "SLURM_ARRAY_TASK_ID",
}
#: Labels of a job only the controller tells (a 22.05 prolog's environment lacks them).
CONTROLLER_LABELS = ("account", "qos", "array_job_id", "array_task_id")


@dataclass(frozen=True)
class SlurmJob:
    """A job as a hook's environment tells it."""

    job_id: str
    uid: int
    gid: int
    labels: dict[str, str]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SlurmJob:
        job_id = slurm_records.job_id_of(env)
        try:
            uid, gid = int(env.get("SLURM_JOB_UID", "")), int(env.get("SLURM_JOB_GID", "0") or 0)
        except ValueError:
            raise SlurmError("SLURM_JOB_UID or SLURM_JOB_GID is not a number") from None
        return cls(job_id, uid, gid, slurm_node.bounded({k: env[v] for k, v in ENV_LABELS.items() if env.get(v)}))


@dataclass
class Note:
    """One hook's note, read."""

    kind: str
    path: Path
    time_ns: int
    env: dict[str, str]
    slurmd: dict[str, Any] | None
    job: SlurmJob

    @property
    def conf(self) -> str:
        return self.env.get("SLURM_CONF", "")


class HookNotes:
    """:meth:`take` the notes in ``slurm_dir`` once a pass (the Slurm watcher's thread)."""

    def __init__(
        self,
        outbox_root: Path,
        slurm_dir: Path,
        host: wire.pb.Host,
        deliver: Deliver,
        gpus: Callable[[], dict[int, str]] = dict,
        last_use: LastUse = lambda _job, _uid, _base, _end: ([], []),
    ) -> None:
        self.outbox_root, self.slurm_dir, self.host, self.deliver, self.gpus = (
            outbox_root,
            slurm_dir,
            host,
            deliver,
            gpus,
        )
        self.last_use = last_use
        self.left = 0  #: notes the last take() found and did not take (unreadable, or refused)
        self.said: dict[Path, str] = {}  #: note -> its last problem (said once)
        self.closing: dict[Path, tuple[list[wire.pb.JobEvent], list[str]]] = {}  #: close note -> last_use's answer

    def take(self) -> int:
        """Turn every note into events; returns how many were taken (:attr:`left`: how many stay)."""
        notes = []
        found = slurm_records.pending(self.slurm_dir)
        for _, kind, path in found:
            note = self._read(kind, path)
            if note is not None:
                notes.append(note)
        asked = {n.path: slurm_node.ask_controller(n.job.job_id, conf=n.conf) for n in notes}
        taken = 0
        for note in notes:
            view = slurm_node.answer(asked[note.path])
            try:
                self._open(note, view) if note.kind == "open" else self._close(note, view)
            except Exception as exc:  # the outbox refused them: the note waits for the next pass
                self._say(note.path, f"not taken yet: {exc}")
                continue
            with contextlib.suppress(FileNotFoundError):
                note.path.unlink()
            self.said.pop(note.path, None)
            self.closing.pop(note.path, None)
            taken += 1
        self.left = len(found) - taken
        return taken

    def _say(self, path: Path, problem: str) -> None:
        if self.said.get(path) != problem:
            log.warning("slurm: %s: %s", path.name, problem)
            self.said[path] = problem

    def _read(self, kind: str, path: Path) -> Note | None:
        data = slurm_records.read(path)
        if data is None:
            self._say(path, "not a note of root's own as the hooks write it: ignored")
            return None
        try:
            job = SlurmJob.from_env(data["env"])
        except SlurmError as exc:
            self._say(path, f"{exc}: removed")
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return None
        return Note(kind, path, data["time_ns"], data["env"], data.get("slurmd"), job)

    def _open(self, note: Note, view: Mapping[str, str]) -> None:
        job, base = note.job, slurm_node.seq_base(note.job.job_id, self.host.host_id)
        devices, by_index = slurm_node.gpu_claims(note.env.get("SLURM_JOB_GPUS", ""), self.gpus())
        if by_index:
            self._say(note.path, f"GPUs {','.join(by_index)} claimed by index: no GPU source of this agent names them")
        event = wire.JobEvent(
            job_id=job.job_id,
            kind=wire.pb.JobEvent.KIND_OPEN,
            time_ns=note.time_ns,
            event_seq=base | slurm_node.OPEN_AT,
            name=view.get("name", "") or job.job_id,
            job_kind="other",
            unit_name="units",
            labels={**job.labels, **{k: view[k] for k in CONTROLLER_LABELS if k in view}},
            devices=devices,
        )
        holder = note.slurmd
        if holder is not None:
            event.holder_pid, event.holder_start_ticks = holder["pid"], holder["start_ticks"]
            event.holder_boot_id = str(holder.get("boot_id", ""))
        self.deliver(self.host, [event])
        if holder is None:
            return  # the lease ends the job if no epilog runs
        record = holders.HolderRecord(
            job.job_id,
            self.host.host_id,
            "collector",
            holder["pid"],
            holder["start_ticks"],
            str(holder.get("boot_id", "")),
            holder["pid_ns"],
            note.time_ns,
            base | slurm_node.ABANDONED_AT,
            dict(self.host.labels),
            beat_seq=base | slurm_node.BEATS_AT,
            holder_name="slurmd",
            owner_uid=job.uid,
            devices=devices,
        )
        holders.keep(self.outbox_root, record)

    def _close(self, note: Note, view: Mapping[str, str]) -> None:
        job, base = note.job, slurm_node.seq_base(note.job.job_id, self.host.host_id)
        code = int(view.get("exit_code") or slurm_node.exit_status(note.env.get("SLURM_JOB_EXIT_CODE2", "0:0")))
        if note.path not in self.closing:
            self.closing[note.path] = self.last_use(job.job_id, job.uid, base, note.time_ns)
        uses, scope = self.closing[note.path]
        learnt = slurm_node.bounded({"name": view.get("name", ""), **{k: view.get(k, "") for k in ("account", "qos")}})
        close = wire.JobEvent(
            job_id=job.job_id,
            kind=wire.pb.JobEvent.KIND_CLOSE,
            time_ns=note.time_ns,
            event_seq=base | slurm_node.CLOSE_AT,
            exit_code=code,
            end_state=slurm_node.end_state(view),
            # what the open could not learn when the controller did not answer then: readers take it from here
            name=learnt.pop("name", ""),
            labels=learnt,
            use_scope=scope,
        )
        path = events_path(self.slurm_dir, job.job_id)
        lines: list[wire.pb.JobEvent] = []
        with slurm_node.progress(self.slurm_dir, job.job_id) as state:
            try:
                data = slurm_node.read_events_file(path, job.uid, state[0])
                # its bad lines are said there, once per kind of problem
                lines, _ = slurm_node.new_line_events(job.job_id, base, data, state, note.time_ns)
            except SlurmError as exc:
                self._say(note.path, str(exc))
            self.deliver(self.host, [*lines, *uses, close])  # under the lock: no line is sent again
        holders.drop(self.outbox_root, job.job_id, self.host.host_id)
        if not close.end_state and code:
            slurm_node.write_ending(self.slurm_dir, close, self.host, note.conf)
        for leftover in (path, path.with_suffix(".read")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
