"""The one small interface every storage back-end implements.

A store receives decoded batches from the collector and writes them **idempotently**:
writing the same batch twice leaves one copy. A sample's identity is (host, series tags,
interval end), exactly as InfluxDB keys points. A job event's identity is (host, job id,
``event_seq``), as the wire contract says, never its time: a resent event overwrites
itself, two events at one instant are two events. InfluxDB keys a point by series + time,
so the seq rides in both (:func:`job_event_tags`, :func:`job_event_time`); the SQLite store
enforces both keys with UNIQUE indexes.

Errors:
- :class:`StoreUnavailable`: nothing (or not everything) was written, try again later
  (server down, 5xx, timeout). The collector does not acknowledge the batch.
- Points the store refuses as invalid (InfluxDB 4xx on a point) are counted in
  :attr:`WriteResult.rejected` with a reason; retrying cannot help, so the batch is
  still acknowledged.

Schema (see README "Storage schema"): measurement ``energy`` (one point per Sample;
tags host, source, component, device, quality + host labels; fields energy_j, power_w,
cumulative_j, interval_s, utilization, healthy, status, energy_error_j, stream, gauges)
and measurement ``job_events`` (tags host, job_id, event, seq_block; fields event_seq,
time_ns and per event kind).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

from wattline import wire

if TYPE_CHECKING:  # lineprotocol imports this module
    from wattline.collector.lineprotocol import EncodedBatch, LineEncoder

#: Measurement names, shared by every back-end.
ENERGY = "energy"
JOB_EVENTS = "job_events"
#: One point per job (its report's figures) and one per (job, host) (that host's share).
JOB_SUMMARY = "job_summary"
JOB_SUMMARY_HOST = "job_summary_host"

#: A field value as stores write it (line protocol has no null: absent figures are left out).
SummaryValue = float | int | str | bool


@dataclass(frozen=True)
class JobSummary:
    """A job's summary as stored: one point per job, keyed by job id (rewritten in place).

    ``time_ns`` is the job's start; ``tags`` hold name, kind and unit (they never change
    for a job; its status does, so status is a field: a changing tag would start a second
    series, a second point); ``fields`` the report's figures; ``hosts`` each host's energy
    over the whole run (J), for "node energy minus the jobs' energy" per host.
    """

    job_id: str
    time_ns: int
    tags: dict[str, str]
    fields: dict[str, SummaryValue]
    hosts: dict[str, float] = field(default_factory=dict)


class StoreUnavailable(Exception):
    """The write (or query) failed in a way a later retry may fix."""


@dataclass(slots=True)
class WriteResult:
    """What a write did: points written, points refused and why."""

    written: int = 0
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)


class Store(abc.ABC):
    """A storage back-end."""

    #: Short name for logs and metrics: "sqlite", "influxdb1", "influxdb2".
    kind: str = ""
    #: Most group commits run at once; 0: as many as the collector's ``workers``. A back-end
    #: that serialises writers anyway (SQLite) says 1, so waiting batches group up instead.
    max_concurrent_writes: int = 0

    @abc.abstractmethod
    def write(self, batch: wire.pb.Batch) -> WriteResult:
        """Write every sample and job event of ``batch``; idempotent.

        Raises :class:`StoreUnavailable` when the batch must be retried.
        """

    def write_group(self, batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
        """Write several batches in one commit (group commit); one result per batch, in order.

        All or nothing as far as the caller knows: :class:`StoreUnavailable` means none of
        them is acknowledged (some may be written; writes are idempotent). Back-ends that
        can commit many batches at once (one transaction, one HTTP request) override this;
        the default writes them one by one.
        """
        return [self.write(batch) for batch in batches]

    def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release connections."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def host_tags(batch: wire.pb.Batch) -> dict[str, str]:
    """Tags every point of ``batch`` carries: host id plus the host's labels.

    Host labels never override the reserved tag names.
    """
    tags = {k: v for k, v in batch.host.labels.items() if k not in RESERVED_TAGS}
    tags["host"] = batch.host.host_id
    return tags


#: Tag names with fixed meaning; host labels of these names are ignored.
RESERVED_TAGS = frozenset({"host", "source", "component", "device", "quality", "job_id", "event", "seq_block"})


def sample_tags(sample: wire.pb.Sample) -> dict[str, str]:
    """Series tags of a sample (besides the host tags)."""
    return {
        "source": sample.source,
        "component": sample.component,
        "device": sample.device,
        "quality": wire.QUALITY_NAMES.get(sample.quality, "unspecified"),
    }


@dataclass(frozen=True, slots=True)
class SampleField:
    """One fixed field of an ``energy`` point."""

    name: str
    kind: type[float] | type[int] | type[bool] | type[str]
    #: The value: a Python expression over the Sample ``s`` and the batch's ``stream`` id.
    #: Integers come from int64 proto fields, so they always fit line protocol's int64.
    value: str
    #: When the field is written: "" for every point, else a condition over ``s``.
    when: str = ""


#: The fixed fields of an ``energy`` point, in the order they are written. This table is the
#: ONE definition of them: :func:`sample_fields` and the line encoder's fused per-sample path
#: (:mod:`wattline.collector.lineprotocol`) are both compiled from it.
SAMPLE_FIELDS: tuple[SampleField, ...] = (
    SampleField("energy_j", float, "s.energy_j"),
    SampleField("power_w", float, "s.power_w"),
    SampleField("cumulative_j", float, "s.cumulative_j"),
    SampleField("interval_s", float, "(s.end_ns - s.start_ns) / 1e9"),
    SampleField("start_ns", int, "s.start_ns"),
    SampleField("healthy", bool, "s.healthy"),
    SampleField("stream", str, "stream"),
    SampleField("status", str, "s.status", when="s.status"),
    SampleField("utilization", float, "s.utilization", when="s.HasField('utilization')"),
    SampleField("energy_error_j", float, "s.energy_error_j", when="s.HasField('energy_error_j')"),
)

#: Fixed field names of an ``energy`` point; a gauge of such a name (or of a tag's name) is
#: dropped, else it would shadow an absent optional field with another type (a float
#: ``status`` conflicts with the string ones) or clash with a tag.
SAMPLE_FIELD_NAMES = frozenset(f.name for f in SAMPLE_FIELDS)
#: Gauge names that never become fields (see SAMPLE_FIELD_NAMES).
NOT_GAUGES = SAMPLE_FIELD_NAMES | RESERVED_TAGS


def compile_function(name: str, lines: list[str], namespace: dict[str, Any]) -> Callable[..., Any]:
    """Compile the function ``name`` from source ``lines`` (generated from :data:`SAMPLE_FIELDS`).

    The source stays readable as the function's ``__source__`` attribute.
    """
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<wattline generated {name}>", "exec"), namespace)
    function: Callable[..., Any] = namespace[name]
    function.__source__ = source  # type: ignore[attr-defined]
    return function


def _compile_fixed_fields() -> Callable[[wire.pb.Sample, str], dict[str, float | int | str | bool]]:
    required = ", ".join(f"{f.name!r}: {f.value}" for f in SAMPLE_FIELDS if not f.when)
    lines = ["def fixed_fields(s, stream):", f"    fields = {{{required}}}"]
    for f in SAMPLE_FIELDS:
        if f.when:
            lines += [f"    if {f.when}:", f"        fields[{f.name!r}] = {f.value}"]
    lines.append("    return fields")
    return compile_function("fixed_fields", lines, {})


_fixed_fields = _compile_fixed_fields()


def sample_fields(sample: wire.pb.Sample, stream_id: str) -> dict[str, float | int | str | bool]:
    """Field values of a sample's point. ``gauges`` become fields of their own name."""
    fields = _fixed_fields(sample, stream_id)
    gauges = sample.gauges
    if gauges:
        for name in gauges:  # (a upb map's items() is a Python-level generator)
            if name not in NOT_GAUGES:
                fields[name] = gauges[name]
    return fields


#: Job event kind names as stored in the ``event`` tag.
EVENT_NAMES = {
    wire.pb.JobEvent.KIND_OPEN: "open",
    wire.pb.JobEvent.KIND_UNITS: "units",
    wire.pb.JobEvent.KIND_PHASE: "phase",
    wire.pb.JobEvent.KIND_CLOSE: "close",
    wire.pb.JobEvent.KIND_HEARTBEAT: "heartbeat",  # no fields of its own: its time is what counts
    wire.pb.JobEvent.KIND_USE: "use",
}


#: A job event's point in InfluxDB: tag ``seq_block`` = event_seq // SEQ_BLOCK, time = the
#: event time floored to the millisecond + event_seq % SEQ_BLOCK ns, the true time in the
#: field ``time_ns``. So (host, job id, event_seq) <-> (series, time) one to one: a resent
#: event lands on its own point, two events at one instant on two points; a process's events
#: share one series per million, and the point time stays within the event's millisecond.
SEQ_BLOCK = 10**6
_MS = 10**6


def job_event_tags(event: wire.pb.JobEvent) -> dict[str, str]:
    """Series tags of a job event (besides the host tags)."""
    return {
        "job_id": event.job_id,
        "event": EVENT_NAMES.get(event.kind, "unspecified"),
        "seq_block": str(event.event_seq // SEQ_BLOCK),
    }


def job_event_time(event: wire.pb.JobEvent) -> int:
    """The time of a job event's point (see :data:`SEQ_BLOCK`)."""
    return event.time_ns - event.time_ns % _MS + event.event_seq % SEQ_BLOCK


def job_event_fields(event: wire.pb.JobEvent) -> dict[str, float | int | str | bool]:
    """Field values of a job event's point; which fields depends on the kind."""
    fields: dict[str, float | int | str | bool] = {"event_seq": int(event.event_seq), "time_ns": int(event.time_ns)}
    if event.kind == wire.pb.JobEvent.KIND_OPEN:
        fields.update(name=event.name, job_kind=event.job_kind, unit_name=event.unit_name)
        fields["devices"] = ",".join(event.devices)
        for key, value in event.labels.items():
            fields[f"label_{key}"] = value
    elif event.kind == wire.pb.JobEvent.KIND_UNITS:
        fields["units"] = event.units
    elif event.kind == wire.pb.JobEvent.KIND_PHASE:
        fields["phase"] = event.phase
    elif event.kind == wire.pb.JobEvent.KIND_CLOSE:
        fields["exit_code"] = int(event.exit_code)
        if event.use_scope:
            fields["use_scope"] = ",".join(event.use_scope)
    elif event.kind == wire.pb.JobEvent.KIND_USE:
        fields.update(device=event.use_device, period_ns=int(event.use_period_ns), metric=event.use_metric)
        fields.update(job_use=float(event.job_use), device_use=float(event.device_use))
    return fields


class LineProtocolStore(Store):
    """A store fed InfluxDB line protocol: encodes with its :attr:`encoder` (points it
    cannot encode are rejected with the reason), then :meth:`write_lines`."""

    encoder: LineEncoder

    def write(self, batch: wire.pb.Batch) -> WriteResult:
        encoded = self.encoder.batch(batch)
        return _with_encoder_refusals(self.write_lines(encoded.lines), encoded)

    def write_group(self, batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
        """All batches' lines in one write (one request per MAX_BODY_BYTES)."""
        if len(batches) == 1:
            return [self.write(batches[0])]
        encoded = [self.encoder.batch(batch) for batch in batches]
        together = self.write_lines([line for e in encoded for line in e.lines])
        if together.rejected:
            # The server refused some points without saying whose: write each batch again
            # alone (idempotent) so that every Ack counts its own refusals.
            return [_with_encoder_refusals(self.write_lines(e.lines), e) for e in encoded]
        return [_with_encoder_refusals(WriteResult(written=len(e.lines)), e) for e in encoded]

    @abc.abstractmethod
    def write_lines(self, lines: Sequence[str]) -> WriteResult:
        """Write already-encoded points; raises StoreUnavailable when they must be retried."""

    def write_summary(self, summary: JobSummary) -> WriteResult:
        """Write a job's summary points (:func:`summary_points`); same key, same point: idempotent."""
        try:
            lines = [self.encoder.line(*point) for point in summary_points(summary)]
        except ValueError as exc:  # LineProtocolError: no retry can store it
            return WriteResult(rejected=1, reasons=[f"job summary of {summary.job_id[:100]!r}: {exc}"])
        return self.write_lines(lines)


SummaryPoint = tuple[str, dict[str, str], dict[str, SummaryValue], int]


def summary_points(summary: JobSummary) -> list[SummaryPoint]:
    """(measurement, tags, fields, time) of a summary: one ``job_summary`` point and one
    ``job_summary_host`` point per host (tags job_id, host; field energy_j)."""
    tags = {"job_id": summary.job_id, **summary.tags}
    points: list[SummaryPoint] = [(JOB_SUMMARY, tags, dict(summary.fields), summary.time_ns)]
    for host, energy_j in sorted(summary.hosts.items()):
        host_tags = {"job_id": summary.job_id, "host": host, **summary.tags}
        points.append((JOB_SUMMARY_HOST, host_tags, {"energy_j": float(energy_j)}, summary.time_ns))
    return points


def _with_encoder_refusals(result: WriteResult, encoded: EncodedBatch) -> WriteResult:
    """``result`` of writing ``encoded.lines``, plus the points the encoder refused."""
    result.rejected += len(encoded.rejected)
    result.reasons[:0] = encoded.rejected
    return result
