"""The storage schema (see docs/storage.md), shared by every back-end.

Measurement ``energy``: one point per Sample; tags host, source, component, device,
quality + host labels; the fixed fields of :data:`SAMPLE_FIELDS` and the gauges.
Measurement ``job_events``: tags host, job_id, event, seq_block; fields event_seq, time_ns
and per event kind. InfluxDB keys a point by series + time, so a job event's ``event_seq``
rides in both (:func:`job_event_tags`, :func:`job_event_time`); the SQLite store enforces
(host, job id, event_seq) with a UNIQUE index. ``job_summary`` and ``job_summary_host``: a
job's summary (:func:`summary_points`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from wattline import wire
from wattline.stores.base import IntervalSummary, JobSummary, SummaryValue

#: Measurement names, shared by every back-end.
ENERGY = "energy"
JOB_EVENTS = "job_events"
#: One point per job (its report's figures) and one per (job, host) (that host's share).
JOB_SUMMARY = "job_summary"
JOB_SUMMARY_HOST = "job_summary_host"
#: One point per (service job, interval): the interval's figures (:func:`interval_point`).
SERVICE_INTERVAL = "service_interval"


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
#: ONE definition of them: :func:`wattline.stores.pointfields.sample_fields` and the line
#: encoder's fused per-sample path (:mod:`wattline.stores.lineprotocol`) are both compiled
#: from it.
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
#: Bits of an event_seq counted by one writer (a job's process on a host); the bits
#: above are its random base, so ``event_seq >> SEQ_COUNTER_BITS`` tells writers apart.
SEQ_COUNTER_BITS = 32
_MS = 10**6


#: Stored event name of a UNITS event of one of the job's other unit kinds (its ``unit`` set):
#: apart from ``units`` so that every read of the job's own units leaves them out by its name.
KIND_UNITS = "kind_units"
#: Tag of such an event's unit kind, and prefix of its unit labels' tags (``unit_label_model_name``).
UNIT_TAG, UNIT_LABEL = "unit", "unit_label_"


def job_event_tags(event: wire.pb.JobEvent) -> dict[str, str]:
    """Series tags of a job event (besides the host tags); an extra unit kind's UNITS event
    also has its kind and labels as tags (:func:`unit_tags`)."""
    units = unit_tags(event)
    return {
        "job_id": event.job_id,
        "event": KIND_UNITS if units else EVENT_NAMES.get(event.kind, "unspecified"),
        "seq_block": str(event.event_seq // SEQ_BLOCK),
        **units,
    }


def unit_tags(event: wire.pb.JobEvent) -> dict[str, str]:
    """The unit kind and labels of a UNITS event of another kind than the job's own, as tags:
    strings of a many-per-job event, which VictoriaMetrics keeps only as labels (one series per
    kind and label values); empty for the job's own units."""
    if event.kind != wire.pb.JobEvent.KIND_UNITS or not event.unit:
        return {}
    return {UNIT_TAG: event.unit, **{UNIT_LABEL + k: v for k, v in sorted(event.unit_labels.items())}}


def unit_fields(tags: Mapping[str, str]) -> dict[str, str]:
    """The :func:`unit_tags` among a stored point's tags (host labels and others left out), for
    its fields as read back."""
    return {k: v for k, v in tags.items() if v and (k == UNIT_TAG or k.startswith(UNIT_LABEL))}


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
        if event.service:  # absent: a job that ends (older writers too)
            fields["service"] = 1
        if event.holder_pid:
            fields.update(holder_pid=int(event.holder_pid), holder_start_ticks=int(event.holder_start_ticks))
            fields["holder_boot_id"] = event.holder_boot_id
    elif event.kind == wire.pb.JobEvent.KIND_UNITS:
        fields["units"] = event.units
        if event.HasField("units_total"):
            fields["units_total"] = event.units_total
    elif event.kind == wire.pb.JobEvent.KIND_PHASE:
        fields["phase"] = event.phase
    elif event.kind == wire.pb.JobEvent.KIND_CLOSE:
        if event.name:  # what the open could not learn (see the proto)
            fields["name"] = event.name
        for key, value in event.labels.items():
            fields[f"label_{key}"] = value
        if event.abandoned:  # nobody saw the workload end: its exit status is unknown
            fields["abandoned"] = event.abandoned
        else:
            fields["exit_code"] = int(event.exit_code)
        if event.end_state:  # the scheduler ended it (cancelled, timeout...)
            fields["end_state"] = event.end_state
        if event.pod_end:  # a pod's job: how the pod ended, its containers' reasons and exits
            fields.update(pod_end=event.pod_end, pod_containers=event.pod_containers)
        if event.use_scope:
            fields["use_scope"] = ",".join(event.use_scope)
    elif event.kind == wire.pb.JobEvent.KIND_USE:
        fields.update(device=event.use_device, period_ns=int(event.use_period_ns), metric=event.use_metric)
        fields.update(job_use=float(event.job_use), device_use=float(event.device_use))
        if event.use_steady:  # absent: not known to be (older writers, the watchers)
            fields["steady"] = 1
    return fields


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


def interval_point(interval: IntervalSummary) -> SummaryPoint:
    """(measurement, tags, fields, time) of a service interval: tags job_id + its tags, time
    its start (the same key for every rewrite of one interval)."""
    return (SERVICE_INTERVAL, {"job_id": interval.job_id, **interval.tags}, dict(interval.fields), interval.start_ns)
