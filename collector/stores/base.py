"""The one small interface every storage back-end implements.

A store receives decoded batches from the collector and writes them **idempotently**:
writing the same batch twice leaves one copy. A point's identity is
(measurement, host, series tags, timestamp = interval end / event time), exactly as
InfluxDB keys points, and the SQLite store enforces the same key with a UNIQUE index.

Errors:
- :class:`StoreUnavailable`: nothing (or not everything) was written, try again later
  (server down, 5xx, timeout). The collector does not acknowledge the batch.
- Points the store refuses as invalid (InfluxDB 4xx on a point) are counted in
  :attr:`WriteResult.rejected` with a reason; retrying cannot help, so the batch is
  still acknowledged.

Schema (see README "Storage schema"): measurement ``energy`` (one point per Sample;
tags host, source, component, device, quality + host labels; fields energy_j, power_w,
cumulative_j, interval_s, utilization, healthy, status, energy_error_j, stream, gauges)
and measurement ``job_events`` (tags host, job_id, event; fields per event kind).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Self

from wattline import wire

#: Measurement names, shared by every back-end.
ENERGY = "energy"
JOB_EVENTS = "job_events"


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

    @abc.abstractmethod
    def write(self, batch: wire.pb.Batch) -> WriteResult:
        """Write every sample and job event of ``batch``; idempotent.

        Raises :class:`StoreUnavailable` when the batch must be retried.
        """

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
RESERVED_TAGS = frozenset({"host", "source", "component", "device", "quality", "job_id", "event"})


def sample_tags(sample: wire.pb.Sample) -> dict[str, str]:
    """Series tags of a sample (besides the host tags)."""
    return {
        "source": sample.source,
        "component": sample.component,
        "device": sample.device,
        "quality": wire.QUALITY_NAMES.get(sample.quality, "unspecified"),
    }


#: Fixed field names of an ``energy`` point; a gauge of such a name (or of a tag's name) is
#: dropped, else it would shadow an absent optional field with another type (a float
#: ``status`` conflicts with the string ones) or clash with a tag.
SAMPLE_FIELD_NAMES = frozenset(
    {
        "energy_j",
        "power_w",
        "cumulative_j",
        "interval_s",
        "start_ns",
        "healthy",
        "stream",
        "status",
        "utilization",
        "energy_error_j",
    }
)


def sample_fields(sample: wire.pb.Sample, stream_id: str) -> dict[str, float | int | str | bool]:
    """Field values of a sample's point. ``gauges`` become fields of their own name."""
    fields: dict[str, float | int | str | bool] = {
        "energy_j": sample.energy_j,
        "power_w": sample.power_w,
        "cumulative_j": sample.cumulative_j,
        "interval_s": (sample.end_ns - sample.start_ns) / 1e9,
        "start_ns": sample.start_ns,
        "healthy": sample.healthy,
        "stream": stream_id,
    }
    if sample.status:
        fields["status"] = sample.status
    if sample.HasField("utilization"):
        fields["utilization"] = sample.utilization
    if sample.HasField("energy_error_j"):
        fields["energy_error_j"] = sample.energy_error_j
    for name, value in sample.gauges.items():
        if name not in SAMPLE_FIELD_NAMES and name not in RESERVED_TAGS:
            fields[name] = value
    return fields


#: Job event kind names as stored in the ``event`` tag.
EVENT_NAMES = {
    wire.pb.JobEvent.KIND_OPEN: "open",
    wire.pb.JobEvent.KIND_UNITS: "units",
    wire.pb.JobEvent.KIND_PHASE: "phase",
    wire.pb.JobEvent.KIND_CLOSE: "close",
}


def job_event_tags(event: wire.pb.JobEvent) -> dict[str, str]:
    """Series tags of a job event (besides the host tags)."""
    return {"job_id": event.job_id, "event": EVENT_NAMES.get(event.kind, "unspecified")}


def job_event_fields(event: wire.pb.JobEvent) -> dict[str, float | int | str | bool]:
    """Field values of a job event's point; which fields depends on the kind."""
    fields: dict[str, float | int | str | bool] = {"event_seq": int(event.event_seq)}
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
    return fields
