"""InfluxDB line protocol: the ONE encoder (all escaping lives here).

``measurement,tag=value,... field=value,... time_ns`` per point, one point per line.

What a point may carry (checked against the real ``influxd`` 1.6, see
``tests/integration/test_lineprotocol.py``); a point that breaks a rule raises
:class:`LineProtocolError` and the stores count it as *rejected* with the reason, so
every back-end (SQLite included, via :meth:`LineEncoder.check`) stores the same points:

- Measurement, tag keys, tag values, field keys: ``,`` ``=`` and space are
  backslash-escaped (the measurement needs only ``,`` and space). Any other character,
  backslashes included, is written as is: InfluxDB 1.x/2.x keep backslashes in tags
  literally, so a tag ``a\\b`` is stored as ``a\\b``. (VictoriaMetrics unescapes ``\\\\`` to
  ``\\``: tag values with two adjacent backslashes differ there.)
- **Line feed in a tag key/value, field key or measurement: refused.** The line
  protocol has no escape for it (``influxd`` keeps the backslash of ``\\<LF>`` in the
  stored value; VictoriaMetrics splits the line), and replacing it (by ``\\n``, a space)
  would silently merge distinct values. **Carriage return and NUL** are refused there
  too: ``influxd`` stores them, but no InfluxQL string literal can hold them, so
  ``WHERE job_id = '...'`` could never select the point. A tag key/value ending in a
  backslash is refused (the backslash would escape the separator after it). Field keys
  may not contain a backslash at all nor start with a tab (``influxd`` drops or mangles
  them). Tabs, quotes, other control characters and any Unicode are fine, and string
  field *values* may hold anything (LF, CR and NUL included).
- **Empty tag values are omitted**, key and all (InfluxDB refuses ``k=``); InfluxQL
  treats a missing tag as the empty string (``WHERE device = ''`` matches), so nothing
  is lost. Empty tag keys (with a value) and empty field keys are refused, and so are
  the names InfluxDB reserves (tag keys ``time``, ``_field``, ``_measurement``; field
  key ``time``).
- **Sizes and times, as InfluxDB limits them.** ``influxd`` refuses a point when its
  escaped series key (``measurement,tags``, UTF-8 bytes) + 4 + the escaped field key
  exceed 65535 bytes, and a time stamp outside -9223372036854775806..9223372036854775806
  ns. Here a field key may have at most :data:`MAX_FIELD_KEY_BYTES` (escaped) and a
  series key at most :data:`MAX_SERIES_KEY_BYTES`, so every point under both limits fits
  whatever its fields (checked once per series and per field key, never per point).
- **Job events** (:func:`job_event_point`): a job id as :func:`check_job_id` allows,
  ``event_seq`` set (it is the event's identity), units finite and >= 0
  (:func:`check_units`). Those checks and the time range live in :mod:`wattline.point_limits`,
  where every reader of the events file and the Job API take them too.
- Messages quote at most about 100 characters of a bad value (:func:`clip`).
- Field values: ``float`` as ``repr`` (shortest exact round-trip form; NaN and
  infinities refused), ``int`` with the ``i`` suffix (int64 range, else refused),
  ``bool`` as ``true``/``false``, ``str`` double-quoted with ``\\`` and ``"`` escaped
  (line feeds inside a string field are fine). A point needs at least one field.

Speed: each series' escaped ``measurement,tags`` prefix is cached in a bounded dict
keyed by its tag values, and escaped field keys are cached too, so the steady state
costs one dict lookup per point plus the field values. Samples take a fused path
compiled from the field table (:data:`~wattline.stores.schema.SAMPLE_FIELDS`):
one f-string per point, read straight from the protobuf message, with no per-point dict.
Any point it is not sure of (a non-finite or unusual value, a field key not yet checked)
goes through the general path, which writes the same line or refuses it with the reason.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from wattline import wire
from wattline.point_limits import (
    INT64_MAX,
    INT64_MIN,
    MAX_TIME_NS,
    MIN_TIME_NS,
    check_job_id,
    check_tag,
    check_time,
    check_units,
    control_char,
)
from wattline.point_limits import LineProtocolError as LineProtocolError  # the encoder's error, raised here too
from wattline.stores.pointfields import compile_function, sample_fields
from wattline.stores.schema import (
    ENERGY,
    JOB_EVENTS,
    NOT_GAUGES,
    SAMPLE_FIELDS,
    host_tags,
    job_event_fields,
    job_event_tags,
    job_event_time,
    sample_tags,
)
from wattline.text import QUOTE_CHARS, clip

FieldValue = float | int | str | bool

#: InfluxDB's limit on series key + 4 + field key (escaped, UTF-8 bytes).
MAX_KEY_BYTES = 65535
#: Longest escaped field key, and so the longest escaped series key that fits with any field.
MAX_FIELD_KEY_BYTES = 255
MAX_SERIES_KEY_BYTES = MAX_KEY_BYTES - 4 - MAX_FIELD_KEY_BYTES
#: Names InfluxDB refuses as tag keys / field keys.
RESERVED_TAG_KEYS = frozenset({"time", "_field", "_measurement"})
RESERVED_FIELD_KEYS = frozenset({"time"})


def _escape(text: str, specials: str) -> str:
    for ch in specials:
        if ch in text:
            text = text.replace(ch, "\\" + ch)
    return text


def escape_measurement(name: str) -> str:
    """Escaped measurement name; refuses names InfluxDB would misread."""
    if not name or control_char(name) or "\\" in name or name[0] == "#":
        raise LineProtocolError(f"invalid measurement name {clip(name)}")
    return _escape(name, ", ")


def escape_tag(text: str, what: str = "tag") -> str:
    """Escaped tag key or value (non-empty); refuses LF, CR, NUL and a trailing backslash."""
    return _escape(check_tag(text, what), ", =")


def escape_field_key(key: str) -> str:
    """Escaped field key; refuses empty/reserved keys, LF, CR, NUL, backslashes, a leading tab,
    and keys over :data:`MAX_FIELD_KEY_BYTES` escaped."""
    if not key or key in RESERVED_FIELD_KEYS:
        raise LineProtocolError(f"invalid field key {clip(key)}")
    control = control_char(key)
    if control:
        raise LineProtocolError(f"field key {clip(key)} contains a {control}")
    if "\\" in key or key[0] == "\t":
        raise LineProtocolError(f"field key {clip(key)} contains a backslash or starts with a tab")
    escaped = _escape(key, ", =")
    if len(escaped) * 4 > MAX_FIELD_KEY_BYTES and len(escaped.encode()) > MAX_FIELD_KEY_BYTES:
        raise LineProtocolError(f"field key {clip(key)} is longer than {MAX_FIELD_KEY_BYTES} bytes")
    return escaped


def quote_string(value: str) -> str:
    """A string field value: double-quoted, ``\\`` and ``"`` escaped."""
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    if '"' in value:
        value = value.replace('"', '\\"')
    return '"' + value + '"'


def format_value(key: str, value: FieldValue) -> str:
    """One field value in line protocol; raises :class:`LineProtocolError` if it has none."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value - value != 0.0:  # NaN or +-inf
            raise LineProtocolError(f"field {clip(key)} is {value}")
        return float.__repr__(value)
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise LineProtocolError(f"field {clip(key)} = {value} is outside the int64 range")
        return f"{int(value)}i"
    if isinstance(value, str):
        return quote_string(value)
    raise LineProtocolError(f"field {clip(key)} has unsupported type {type(value).__name__}")


_BOOLS = ("false", "true")


def _compile_sample_line() -> Callable[[wire.pb.Sample, str, str, dict[str, str]], str | None]:
    """``sample_line(s, prefix, stream, field_keys)``: the whole line of sample ``s`` after its
    series ``prefix``, or None where the general path must decide: a non-finite float (or
    finite ones whose sum overflows), a gauge whose key is not in ``field_keys`` yet, a time
    stamp outside InfluxDB's range.
    """
    fmt = {float: "{%s!r}", int: "{%s}i", bool: "{_BOOLS[%s]}", str: "{quote_string(%s)}"}
    lines = ["def sample_line(s, prefix, stream, field_keys):"]
    parts, floats = [], []
    for i, f in enumerate(f for f in SAMPLE_FIELDS if not f.when):
        lines.append(f"    v{i} = {f.value}")
        parts.append(escape_field_key(f.name).replace("{", "{{").replace("}", "}}") + "=" + fmt[f.kind] % f"v{i}")
        if f.kind is float:
            floats.append(f"v{i}")
    if floats:  # NaN or an infinity makes the sum non-finite
        lines += [f"    t = {' + '.join(floats)}", "    if t - t != 0.0:", "        return None"]
    lines.append(f"    line = f{'{prefix}' + ','.join(parts)!r}")
    for f in SAMPLE_FIELDS:
        if f.when:
            key = escape_field_key(f.name).replace("{", "{{").replace("}", "}}")
            lines += [f"    if {f.when}:", f"        v = {f.value}"]
            if f.kind is float:
                lines += ["        if v - v != 0.0:", "            return None"]
            lines.append(f"        line += f{',' + key + '=' + fmt[f.kind] % 'v'!r}")
    lines += [
        "    gauges = s.gauges",
        "    if gauges:",
        "        for name in gauges:  # (a upb map's items() is a Python-level generator)",
        "            if name not in NOT_GAUGES:",
        "                value = gauges[name]",
        "                key = field_keys.get(name)",
        "                if key is None or value - value != 0.0:",
        "                    return None",
        "                line += f',{key}{value!r}'",
        "    end = s.end_ns",
        "    if not MIN_TIME_NS <= end <= MAX_TIME_NS:",
        "        return None",
        "    return f'{line} {end}'",
    ]
    namespace = {
        "_BOOLS": _BOOLS,
        "quote_string": quote_string,
        "NOT_GAUGES": NOT_GAUGES,
        "MIN_TIME_NS": MIN_TIME_NS,
        "MAX_TIME_NS": MAX_TIME_NS,
    }
    return compile_function("sample_line", lines, namespace)


#: The fused per-sample encoder (its generated source: ``_sample_line.__source__``).
_sample_line = _compile_sample_line()


@dataclass(slots=True)
class EncodedBatch:
    """The lines of one batch, and one reason per point refused."""

    lines: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)


class LineEncoder:
    """Encodes points and batches; thread-safe (caches are only mutated under a lock)."""

    def __init__(self, max_series: int = 100_000, max_field_keys: int = 10_000) -> None:
        self.max_series = max_series
        self.max_field_keys = max_field_keys
        self._prefixes: dict[Hashable, str] = {}
        self._field_keys: dict[str, str] = {}
        self._lock = threading.Lock()

    # -- points -------------------------------------------------------------------------

    def line(self, measurement: str, tags: Mapping[str, str], fields: Mapping[str, FieldValue], time_ns: int) -> str:
        """One point as a line (without the trailing newline)."""
        key = (measurement, *tags.items())
        prefix = self._prefixes.get(key)
        if prefix is None:
            prefix = self._new_prefix(key, measurement, tags)
        return f"{prefix}{self._fields(fields)} {check_time(int(time_ns))}"

    def check(self, measurement: str, tags: Mapping[str, str], fields: Mapping[str, FieldValue], time_ns: int) -> None:
        """Raise :class:`LineProtocolError` exactly when :meth:`line` would."""
        check_time(time_ns)
        key = (measurement, *tags.items())
        if key not in self._prefixes:
            self._new_prefix(key, measurement, tags)
        if not fields:
            raise LineProtocolError("a point needs at least one field")
        field_keys = self._field_keys
        for name, value in fields.items():
            if name not in field_keys:
                self._new_field_key(name)
            kind = type(value)
            if kind is float:
                if value - value != 0.0:  # type: ignore[operator]
                    raise LineProtocolError(f"field {clip(name)} is {value}")
            elif kind is int:
                if not INT64_MIN <= value <= INT64_MAX:  # type: ignore[operator]
                    format_value(name, value)  # raises, with the reason
            elif kind is not str and kind is not bool:
                format_value(name, value)

    def _new_prefix(self, key: Hashable, measurement: str, tags: Mapping[str, str]) -> str:
        parts = [escape_measurement(measurement)]
        for name in sorted(tags):
            value = tags[name]
            if not value:
                continue  # InfluxDB refuses empty tag values; a missing tag reads as ""
            if not name or name in RESERVED_TAG_KEYS:
                raise LineProtocolError(f"invalid tag key {clip(name)}")
            parts.append(f"{escape_tag(name, 'tag key')}={escape_tag(value, f'tag {clip(name)} value')}")
        prefix = ",".join(parts) + " "
        size = len(prefix) - 1
        if size * 4 > MAX_SERIES_KEY_BYTES and (size := len(prefix.encode()) - 1) > MAX_SERIES_KEY_BYTES:
            biggest = max(tags, key=lambda name: len(tags[name]))
            raise LineProtocolError(
                f"series key of {size} bytes is longer than {MAX_SERIES_KEY_BYTES} (InfluxDB's limit: "
                f"{MAX_KEY_BYTES} with the field key); tag {clip(biggest)} = {clip(tags[biggest])}"
            )
        with self._lock:
            if len(self._prefixes) >= self.max_series:
                self._prefixes.pop(next(iter(self._prefixes)))
            self._prefixes[key] = prefix
        return prefix

    def _new_field_key(self, name: str) -> str:
        escaped = escape_field_key(name) + "="
        with self._lock:
            if len(self._field_keys) >= self.max_field_keys:
                self._field_keys.clear()
            self._field_keys[name] = escaped
        return escaped

    def _fields(self, fields: Mapping[str, FieldValue]) -> str:
        keys = self._field_keys
        out = []
        for name, value in fields.items():
            prefix = keys.get(name)
            if prefix is None:
                prefix = self._new_field_key(name)
            kind = type(value)
            if kind is float:
                if value - value != 0.0:  # type: ignore[operator]  # NaN or +-inf
                    raise LineProtocolError(f"field {clip(name)} is {value}")
                out.append(f"{prefix}{value!r}")
            elif kind is str:
                out.append(prefix + quote_string(value))  # type: ignore[arg-type]
            elif kind is bool:
                out.append(prefix + ("true" if value else "false"))
            else:
                out.append(prefix + format_value(name, value))
        if not out:
            raise LineProtocolError("a point needs at least one field")
        return ",".join(out)

    # -- batches ------------------------------------------------------------------------

    def batch(self, batch: wire.pb.Batch) -> EncodedBatch:
        """Every sample and job event of ``batch``, with the points refused and why."""
        result = EncodedBatch()
        lines, rejected = result.lines, result.rejected
        host = host_tags(batch)
        host_key = tuple(host.items())
        stream = batch.stream_id
        local: dict[tuple[str, str, str, int], str] = {}
        sample_line, field_keys = _sample_line, self._field_keys
        for sample in batch.samples:
            series = (sample.source, sample.component, sample.device, sample.quality)
            try:
                prefix = local.get(series)
                if prefix is None:
                    key = (ENERGY, host_key, *series)
                    prefix = self._prefixes.get(key)
                    if prefix is None:
                        prefix = self._new_prefix(key, ENERGY, {**host, **sample_tags(sample)})
                    local[series] = prefix
                line = sample_line(sample, prefix, stream, field_keys)
                if line is None:
                    line = f"{prefix}{self._fields(sample_fields(sample, stream))} {check_time(sample.end_ns)}"
                lines.append(line)
            except LineProtocolError as exc:
                rejected.append(f"{ENERGY} {describe(host, sample_tags(sample))} at {sample.end_ns}: {exc}")
        for event in batch.job_events:
            try:
                lines.append(self.line(JOB_EVENTS, *job_event_point(host, event)))
            except LineProtocolError as exc:
                rejected.append(f"{JOB_EVENTS} {describe(host, job_event_tags(event))} at {event.time_ns}: {exc}")
        return result


#: A unit kind's name (``JobEvent.unit``), as the served specs name it.
UNIT_KIND = re.compile(r"[a-z][a-z0-9_]*")


def check_unit_kind(event: wire.pb.JobEvent) -> None:
    """A UNITS event's ``unit`` is a short name (or empty: the job's unit); labels need a unit."""
    if event.unit and not UNIT_KIND.fullmatch(event.unit):
        raise LineProtocolError(f"unit {clip(event.unit)} is not a short name [a-z][a-z0-9_]*")
    if event.unit_labels and not event.unit:
        raise LineProtocolError("unit_labels without a unit: the job's own units have no labels")


def check_use(event: wire.pb.JobEvent) -> None:
    """A USE event names its device and a positive period; its uses are finite and >= 0."""
    if not event.use_device or event.use_period_ns <= 0:
        raise LineProtocolError("a use event needs use_device and use_period_ns > 0")
    for value in (event.job_use, event.device_use):
        if not math.isfinite(value) or value < 0:
            raise LineProtocolError(f"use must be finite and >= 0, got {value!r}")


def job_event_point(
    host: Mapping[str, str], event: wire.pb.JobEvent
) -> tuple[dict[str, str], dict[str, FieldValue], int]:
    """Tags, fields and time of a job event's point, after the checks every job event passes
    (wire, events file and Job API alike); :class:`LineProtocolError` says what is wrong."""
    check_job_id(event.job_id)
    if not event.event_seq:
        raise LineProtocolError("event_seq is 0: a job event needs its sequence number (its identity)")
    if event.kind == wire.pb.JobEvent.KIND_UNITS:
        check_units(event.units)
        if event.HasField("units_total"):
            check_units(event.units_total)
        check_unit_kind(event)
    elif event.kind == wire.pb.JobEvent.KIND_USE:
        check_use(event)
    return {**host, **job_event_tags(event)}, job_event_fields(event), job_event_time(event)


def describe(*tag_sets: Mapping[str, str]) -> str:
    """A point's tags for log lines: ``host='a' job_id='b'`` (values quoted, long ones cut)."""
    text = " ".join(f"{k[:QUOTE_CHARS]}={clip(v)}" for tags in tag_sets for k, v in tags.items())
    return text if len(text) <= 5 * QUOTE_CHARS else text[: 5 * QUOTE_CHARS] + "..."
