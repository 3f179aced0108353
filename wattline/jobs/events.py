"""Job events: building them, batching unit counts, and following the events file.

Any workload started by ``wattline run`` may report progress by appending lines to the
file named in ``$WATTLINE_EVENTS`` (open in append mode, one line per write): ``units N
[UNIX_TIME]``, ``phase NAME [UNIX_TIME]``, ``latency SECONDS [UNIX_TIME]`` (read by ``wattline
sweep``). Their grammar and limits are every reader's, in :mod:`wattline.agent.holders.event_lines`; a
bad line is said once per kind of problem and skipped, never stopping the job.
"""

from __future__ import annotations

import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.agent.holders import registry as holders
from wattline.agent.holders.event_lines import BadLine, BadLines, complete_lines, parse_line
from wattline.jobs.job_env import ENV_EVENTS as ENV_EVENTS  # re-exported: importers from here keep working
from wattline.jobs.job_env import ENV_JOB_ID as ENV_JOB_ID
from wattline.point_limits import check_job_id, check_units
from wattline.stores.lineprotocol import LineEncoder, job_event_point
from wattline.stores.schema import JOB_EVENTS, SEQ_COUNTER_BITS, host_tags

SATURATED = "saturated"

Kind = wire.pb.JobEvent.Kind


@dataclass
class JobSpec:
    """What a job is: identity and how its energy is scoped."""

    job_id: str
    name: str
    kind: str = "other"  #: inference | training | other
    unit_name: str = "units"
    labels: dict[str, str] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)
    service: bool = False  #: serves until stopped: its OPEN says so (reports take any window of it)

    def __post_init__(self) -> None:
        """ValueError (one line) for a job id no store could hold."""
        check_job_id(self.job_id)


def seq_base() -> int:
    """A random first event_seq - 1: ``(1..2**31-1) << 32``, so the event_seq of several
    processes of one job on one host (torch ranks using the Job API with one job id) never
    meet, and every one stays below 2**63 (line protocol's and SQLite's int64)."""
    return (secrets.randbelow(2**31 - 1) + 1) << SEQ_COUNTER_BITS


class EventBuilder:
    """Numbered job events of one job on one host: event_seq, the event's identity with
    (host, job id), counts up from a random base (:func:`seq_base`).

    UNITS events carry ``units_total``, the units of this builder's UNITS events so far
    (numbered in the same step, so a later event_seq has the larger total), as long as
    their times never go backwards; from the first one stamped before its predecessor on
    they carry none (readers then sum the events, see ``reader.units_from_totals``), and so from
    a count no store keeps (not finite, negative) on. Readers take a host's units from the
    totals, so the units of an event the store never got count at the next one stored."""

    def __init__(self, spec: JobSpec, base: int | None = None) -> None:
        """``base``: the block's base when the writer's identity must be fixed (a hook run again
        numbers its events as before); by default random (:func:`seq_base`)."""
        self.spec = spec
        self._base = self._seq = seq_base() if base is None else base
        self._lock = threading.Lock()
        self._units_total: float | None = 0.0  #: None once a UNITS time went backwards
        self._units_last_ns = 0

    def make(self, kind: Kind, time_ns: int | None = None, at: int | None = None, **fields: Any) -> wire.pb.JobEvent:
        """The next event of the block, or (``at``) the one at that place in it."""
        t = time_ns or time.time_ns()
        with self._lock:
            if at is None:
                self._seq += 1
            seq = self._seq if at is None else self._base | at
            if kind == wire.pb.JobEvent.KIND_UNITS:
                fields = self._with_total(t, fields)
        return wire.JobEvent(job_id=self.spec.job_id, kind=kind, time_ns=t, event_seq=seq, **fields)

    def _with_total(self, time_ns: int, fields: dict[str, Any]) -> dict[str, Any]:
        """UNITS ``fields`` with ``units_total`` while the times are in order and every count is one
        a store keeps (a refused event's units must not count in the totals after it); under the lock."""
        units = float(fields.get("units", 0.0))
        if self._units_total is None or time_ns < self._units_last_ns or not 0 <= units < math.inf:
            self._units_total = None
            return fields
        self._units_last_ns = time_ns
        self._units_total += units
        return {**fields, "units_total": self._units_total}

    @property
    def reserved_seq(self) -> int:
        """The last event_seq of this builder's block, which it never numbers an event with: the
        close another process makes for the job if this one dies (:mod:`wattline.agent.holders.registry`)."""
        return self._base | ((1 << SEQ_COUNTER_BITS) - 1)

    def open(self, time_ns: int | None = None, holder: holders.Identity | None = None) -> wire.pb.JobEvent:
        """The open event, saying who holds the job here: ``holder``, by default this process."""
        s = self.spec
        event = self.make(
            wire.pb.JobEvent.KIND_OPEN,
            time_ns,
            name=s.name,
            job_kind=s.kind,
            unit_name=s.unit_name,
            labels=s.labels,
            devices=s.devices,
            service=s.service,
        )
        return holders.stamp(event, holder)

    def units(self, count: float, time_ns: int | None = None) -> wire.pb.JobEvent:
        return self.make(wire.pb.JobEvent.KIND_UNITS, time_ns, units=count)

    def phase(self, name: str, time_ns: int | None = None) -> wire.pb.JobEvent:
        return self.make(wire.pb.JobEvent.KIND_PHASE, time_ns, phase=name)

    def heartbeat(self, time_ns: int | None = None) -> wire.pb.JobEvent:
        """The job still runs here: renews its lease (see ``wire.LEASE_HEARTBEATS``)."""
        return self.make(wire.pb.JobEvent.KIND_HEARTBEAT, time_ns)

    def close(self, exit_code: int, time_ns: int | None = None, use_scope: Iterable[str] = ()) -> wire.pb.JobEvent:
        """``use_scope``: the devices whose per-process use the job's wrapper read
        (:mod:`wattline.jobs.wrappers.usage`)."""
        return self.make(wire.pb.JobEvent.KIND_CLOSE, time_ns, exit_code=exit_code, use_scope=sorted(use_scope))


def check_storable(spec: JobSpec, host_id: str, labels: Mapping[str, str]) -> None:
    """ValueError (one line) unless the job's open event from ``host_id`` with these host
    ``labels`` is a point every store keeps (the collector's own encoder decides): checked
    before a command starts, so its events are never refused after it ran."""
    batch = wire.Batch()
    batch.host.host_id = host_id
    batch.host.labels.update(labels)
    LineEncoder().line(JOB_EVENTS, *job_event_point(host_tags(batch), EventBuilder(spec).open()))


class UnitAccumulator:
    """Sums unit counts and emits at most one UNITS event per ``period_s``, but for a count
    with a time and a count of 0, sent at once.

    A training loop may count every step at hundreds of Hz; the saturation detector
    needs about one point per second, and storage should not get one row per step.
    Each UNITS event covers the time since the previous one, so a 0 says "counting starts
    now": the units before it are not spread past it.
    """

    def __init__(self, builder: EventBuilder, emit: Callable[[list[wire.pb.JobEvent]], None], period_s: float = 0.5):
        self.builder = builder
        self.emit = emit
        self.period_s = period_s
        self.total = 0.0
        self._pending = 0.0
        self._pending_ns = 0  #: when the pending units were last added: all were done by then
        self._last_emit = time.monotonic()
        self._lock = threading.Lock()

    def add(self, count: float, time_ns: int | None = None) -> None:
        """Count ``count`` more units, done by ``time_ns`` (default: now); ValueError unless the
        count is finite and >= 0."""
        check_units(count)
        now = time.time_ns()
        with self._lock:
            self.total += count
            if time_ns is None and count:
                self._pending += count
                self._pending_ns = now
                if time.monotonic() - self._last_emit < self.period_s:
                    return
                events = self._take(None)
            else:
                events = self._take((count, now if time_ns is None else time_ns))
        self.emit(events)

    def _take(self, then: tuple[float, int] | None) -> list[wire.pb.JobEvent]:
        """Under the lock: UNITS events of the pending units, at the time they were last added,
        and of ``then`` (a count and its time). Pending units added after ``then``'s time (an
        events file's line stamped in the past) were written before it, so done by then: they
        go in its event, never after it."""
        pending, at = self._pending, self._pending_ns
        self._pending = 0.0
        self._last_emit = time.monotonic()
        if then is None:
            return [self.builder.units(pending, at)] if pending else []
        count, then_ns = then
        if not pending or at >= then_ns:
            return [self.builder.units(pending + count, then_ns)]
        return [self.builder.units(pending, at), self.builder.units(count, then_ns)]

    def flush(self, time_ns: int | None = None) -> None:
        """Send the pending units, at ``time_ns`` (default: now): a phase or the close ends their span."""
        with self._lock:
            pending, self._pending = self._pending, 0.0
            self._last_emit = time.monotonic()
            events = [self.builder.units(pending, time_ns)] if pending else []
        if events:
            self.emit(events)


class EventsFileReader:
    """Follows an events file written by the workload and feeds the job."""

    def __init__(
        self,
        path: Path,
        on_units: Callable[[float, int | None], None],
        on_phase: Callable[[str, int | None], None],
        on_latency: Callable[[float, int | None], None] | None = None,
    ):
        """``on_latency``: who wants the latency lines (no job event carries them); else ignored."""
        self.path = path
        self.on_units = on_units
        self.on_phase = on_phase
        self.on_latency = on_latency
        self._offset = 0
        self._partial = b""
        self.bad_lines = BadLines(files=1)

    def poll(self) -> None:
        """Consume complete lines appended since the last poll."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        lines, self._partial = complete_lines(self._partial, chunk)
        for line in lines:
            try:
                parsed = parse_line(line)
            except BadLine as exc:
                self.bad_lines.report(str(self.path), exc)
                continue
            if parsed is None:
                continue
            if parsed.verb == "phase":
                self.on_phase(str(parsed.value), parsed.time_ns)
            elif parsed.verb == "units":
                self.on_units(float(parsed.value), parsed.time_ns)
            elif self.on_latency is not None:
                self.on_latency(float(parsed.value), parsed.time_ns)


def append_event_line(line: str, path: str | None = None) -> None:
    """Append one line to the events file (used by the Python API inside ``wattline run``)."""
    target = path or os.environ[ENV_EVENTS]
    # Readable by others: in a Kubernetes pod the node agent, another user, reads the file
    # (docs/operations/kubernetes.md, "Kubernetes pods as jobs"); elsewhere it lies in its job's owner-only directory.
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode())
    finally:
        os.close(fd)
