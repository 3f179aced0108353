"""wattline's points in the Prometheus data model, as VictoriaMetrics stores line protocol
(docs/storage.md, VictoriaMetrics).

There a series is a metric name and labels, a sample a millisecond time stamp and a float64:
a line-protocol field becomes the metric ``<measurement>_<field>``, tags become labels, a
time stamp keeps its milliseconds and a string field is stored as 0. So what InfluxDB keeps
in a nanosecond time stamp, an int64 field or a string field is laid out here as:

- time stamps: the point is stamped at its time floored to the millisecond, and the field
  :data:`SUB_NS` holds the nanoseconds past it (exact in a float64);
- a sample's start: :data:`DURATION_NS`, its length in ns (exact below 104 days); its
  stream id: the label ``stream`` (a series per agent stream, as Prometheus has one per
  target restart); its stream's running total before it, :data:`CUMULATIVE_START`
  (``cumulative_j - energy_j``, for the dashboards: a range's energy is the last running
  total minus the smallest of these, as PromQL has no ``first_over_time``);
- a job event's identity (host, job id, ``event_seq``): for UNITS and heartbeats (many per
  job) labels ``seq_block`` (``event_seq // 10^6``) and the field :data:`SEQ_LOW` (the rest);
  for the other kinds (a few per job) the label ``event_seq``, with their string fields as
  labels of the same series and no host labels, so every other label is a field
  (:func:`event_point`); an empty string field is named in the label :data:`EMPTY` (no
  label can be empty);
- a summary: labels only its job's id, name, kind and unit, so a rewrite (a new status, other
  figures) is a newer sample of the same series, never a series of its own (#45); its string
  fields are numeric codes (:data:`SUMMARY_CODES`), its bools (:data:`SUMMARY_BOOLS`) 1/0, an
  integer beyond a float64's exact ones (its times in ns) two fields, ``<name>`` :data:`HIGH`
  (``// 10^6``) and ``<name>`` :data:`LOW` (the rest). Summaries written before #45 hold their
  string fields as labels and name their bools in the label :data:`BOOLS`; readers still
  take them.

A point whose labels VictoriaMetrics would cut (more than :data:`MAX_LABELS`, a value over
:data:`MAX_LABEL_VALUE_BYTES`, its defaults) or whose integer would lose digits in a float64
is refused with the reason, never altered.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from wattline import wire
from wattline.point_limits import LineProtocolError
from wattline.share_rules import SHARE_RULES
from wattline.stores.base import JobSummary
from wattline.stores.lineprotocol import EncodedBatch, FieldValue, LineEncoder, describe
from wattline.stores.lineprotocol import job_event_point as checked_event_point
from wattline.stores.pointfields import sample_fields
from wattline.stores.schema import (
    ENERGY,
    JOB_EVENTS,
    JOB_SUMMARY,
    JOB_SUMMARY_HOST,
    SEQ_BLOCK,
    SummaryPoint,
    host_tags,
    job_event_tags,
    sample_tags,
)

T = TypeVar("T")

MS = 10**6
#: Field: nanoseconds of the point's time past its millisecond.
SUB_NS = "sub_ns"
#: Field of an ``energy`` point: the sample's length, ns.
DURATION_NS = "duration_ns"
#: Field of an ``energy`` point: ``cumulative_j - energy_j`` (written, never read back).
CUMULATIVE_START = "cumulative_start_j"
#: Field of a UNITS or heartbeat point: ``event_seq % 10^6`` (the label ``seq_block`` holds the rest).
SEQ_LOW = "seq_low"
#: Label: the string fields of the point that are empty (a JSON list).
EMPTY = "empty_fields"
#: Label of a ``job_summary`` point written before #45: its bool fields (a JSON list).
BOOLS = "bool_fields"
#: A summary's string fields -> their values; a value is stored as its place here plus one
#: (0 is no value), so a list only ever grows at its end. A value not here is refused.
SUMMARY_CODES: dict[str, tuple[str, ...]] = {
    "schema": ("wattline.job_summary/1",),
    "status": ("closed", "running", "abandoned"),
    "saturation_method": ("none", "manual", "after", "throughput-plateau", "utilization"),
    "policy_idle": ("none", "subtract"),
    "policy_share_rule": SHARE_RULES,
}
#: A summary's bool fields (stored 1/0); another bool is refused.
SUMMARY_BOOLS = frozenset({"closed", "complete", "saturated"})
#: Field of a ``job_summary`` point stamped when it was written, not at the summary's time
#: (:class:`SummaryStamps`): that time's milliseconds.
TIME_MS = "time_ms"
#: Suffixes of the two fields of a summary's integer too big for a float64.
HIGH, LOW = "__hi", "__lo"
#: Event kinds with a series per event: few per job, and they carry strings.
PER_EVENT = frozenset({"open", "phase", "close", "use"})
#: Sample fields not written: the stream is a label, the start a duration, status a string.
NOT_WRITTEN = frozenset({"stream", "start_ns", "status"})
#: Job event fields written as integers (:func:`~.schema.job_event_fields`), read back as int.
INT_FIELDS = frozenset({"exit_code", "holder_pid", "holder_start_ticks", "period_ns", "steady", "service"})
#: VictoriaMetrics' defaults (``-maxLabelsPerTimeseries``, ``-maxLabelValueLen``): beyond them
#: it drops labels or cuts values, so such points are refused here instead.
MAX_LABELS = 30
MAX_LABEL_VALUE_BYTES = 16384
#: Integers a float64 holds exactly.
MAX_EXACT_INT = 2**53


def floor_ms(time_ns: int) -> tuple[int, int]:
    """(time floored to the millisecond, ns past it)."""
    sub = time_ns % MS
    return time_ns - sub, sub


def _labels(point_tags: Mapping[str, str], host: Mapping[str, str]) -> dict[str, str]:
    """Host labels under the point's own tags (which win a name both have), checked against
    VictoriaMetrics' limits."""
    tags = {**{k: v for k, v in host.items() if k not in point_tags}, **point_tags}
    if len(tags) + 1 > MAX_LABELS:  # + the metric name
        raise LineProtocolError(f"{len(tags) + 1} labels, more than VictoriaMetrics keeps ({MAX_LABELS})")
    for key, value in tags.items():
        if len(value.encode("utf-8", "surrogatepass")) > MAX_LABEL_VALUE_BYTES:
            raise LineProtocolError(f"label {key[:100]!r} is longer than {MAX_LABEL_VALUE_BYTES} bytes")
    return tags


def _numbers(fields: Mapping[str, FieldValue]) -> dict[str, FieldValue]:
    for key, value in fields.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_EXACT_INT:
            raise LineProtocolError(f"field {key[:100]!r} = {value} has more digits than a float64 keeps")
    return dict(fields)


def sample_point(
    host: Mapping[str, str], sample: wire.pb.Sample, stream: str
) -> tuple[dict[str, str], dict[str, FieldValue], int]:
    """Tags, fields and time of an ``energy`` point."""
    fields = {k: v for k, v in sample_fields(sample, stream).items() if k not in NOT_WRITTEN}
    time_ns, fields[SUB_NS] = floor_ms(sample.end_ns)
    fields[DURATION_NS] = sample.end_ns - sample.start_ns
    fields[CUMULATIVE_START] = sample.cumulative_j - sample.energy_j
    return _labels({**sample_tags(sample), "stream": stream}, host), _numbers(fields), time_ns


def event_point(host: Mapping[str, str], event: wire.pb.JobEvent) -> tuple[dict[str, str], dict[str, FieldValue], int]:
    """Tags, fields and time of a ``job_events`` point, after the checks every store makes."""
    _, fields, _ = checked_event_point(host, event)
    tags = job_event_tags(event)
    seq = int(fields.pop("event_seq"))
    time_ns, sub = floor_ms(int(fields.pop("time_ns")))
    numbers: dict[str, FieldValue] = {SUB_NS: sub}
    if tags["event"] in PER_EVENT:
        host = {"host": host["host"]}
        del tags["seq_block"]
        tags["event_seq"] = str(seq)
        strings = {k: v for k, v in fields.items() if isinstance(v, str)}
        tags.update((k, v) for k, v in strings.items() if v)
        empty = sorted(k for k, v in strings.items() if not v)
        if empty:
            tags[EMPTY] = json.dumps(empty)
    else:
        numbers[SEQ_LOW] = seq % SEQ_BLOCK
    numbers.update((k, v) for k, v in fields.items() if not isinstance(v, str))
    return _labels(tags, host), _numbers(numbers), time_ns


def batch_points(batch: wire.pb.Batch, emit: Callable[[SummaryPoint], T]) -> tuple[list[T], list[str]]:
    """``emit`` of every sample and job event of ``batch`` as a point, and the points refused
    (by the layout or by ``emit``, raising :class:`LineProtocolError`) with why."""
    out: list[T] = []
    rejected: list[str] = []
    host = host_tags(batch)
    for sample in batch.samples:
        try:
            out.append(emit((ENERGY, *sample_point(host, sample, batch.stream_id))))
        except LineProtocolError as exc:
            rejected.append(f"{ENERGY} {describe(host, sample_tags(sample))} at {sample.end_ns}: {exc}")
    for event in batch.job_events:
        try:
            out.append(emit((JOB_EVENTS, *event_point(host, event))))
        except LineProtocolError as exc:
            rejected.append(f"{JOB_EVENTS} {describe(host, job_event_tags(event))} at {event.time_ns}: {exc}")
    return out, rejected


def batch_lines(encoder: LineEncoder, batch: wire.pb.Batch) -> EncodedBatch:
    """Every sample and job event of ``batch`` as lines, with the points refused and why."""
    lines, rejected = batch_points(batch, lambda point: encoder.line(*point))
    return EncodedBatch(lines, rejected)


def summary_points(summary: JobSummary) -> list[SummaryPoint]:
    """A job's summary: one ``job_summary`` point and one ``job_summary_host`` point per host
    (field energy_j), labelled by what does not change over the job's life (above)."""
    time_ns, sub = floor_ms(summary.time_ns)
    tags = {"job_id": summary.job_id, **summary.tags}
    fields: dict[str, FieldValue] = {SUB_NS: sub}
    for key, value in summary.fields.items():
        if isinstance(value, str):
            fields[key] = _code(key, value)
        elif isinstance(value, bool) and key not in SUMMARY_BOOLS:
            raise LineProtocolError(f"bool field {key[:100]!r} is not one of {sorted(SUMMARY_BOOLS)}")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_EXACT_INT:
            fields[key + HIGH], fields[key + LOW] = divmod(value, MS)
        else:
            fields[key] = value
    points: list[SummaryPoint] = [(JOB_SUMMARY, _labels(tags, {}), _numbers(fields), time_ns)]
    for host, energy_j in sorted(summary.hosts.items()):
        per_host = {"job_id": summary.job_id, "host": host, **summary.tags}
        points.append((JOB_SUMMARY_HOST, _labels(per_host, {}), {"energy_j": float(energy_j)}, time_ns))
    return points


def _code(key: str, value: str) -> int:
    """The stored code of a summary's string field (:data:`SUMMARY_CODES`)."""
    values = SUMMARY_CODES.get(key)
    if values is None or value not in values:
        raise LineProtocolError(f"string field {key[:100]!r} = {value[:100]!r} has no code in this layout")
    return values.index(value) + 1


def summary_value(key: str, value: float) -> str | None:
    """The string a stored summary field holds, where it is one of :data:`SUMMARY_CODES`
    (None for another field; ValueError for a code this version does not know)."""
    values = SUMMARY_CODES.get(key)
    if values is None:
        return None
    if not value.is_integer() or not 1 <= value <= len(values):
        raise ValueError(f"summary field {key!r} holds {value:g}, not a code this version knows")
    return values[int(value) - 1]


class SummaryStamps:
    """Stamps a store's summary points when they are written, each write a millisecond later
    than the one before: a rewrite is then a newer sample of the job's one series, which
    VictoriaMetrics' deduplication (the largest value of a millisecond) and Prometheus (one
    sample per millisecond) cannot mix with the older one; the summary's own time goes in
    :data:`TIME_MS`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0

    def points(self, summary: JobSummary) -> list[SummaryPoint]:
        """:func:`summary_points` of ``summary``, stamped now."""
        with self._lock:
            self._last_ms = stamp = max(time.time_ns() // MS, self._last_ms + 1)
        return [
            (
                measurement,
                tags,
                {**fields, TIME_MS: time_ns // MS} if measurement == JOB_SUMMARY else fields,
                stamp * MS,
            )
            for measurement, tags, fields, time_ns in summary_points(summary)
        ]
