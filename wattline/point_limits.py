"""What a stored point may carry, checked wherever a value enters: a time stamp InfluxDB keeps
(:func:`check_time`), a unit count (:func:`check_units`), a tag (:func:`check_tag`) and a job
id (:func:`check_job_id`). The collector's encoder
(:mod:`wattline.stores.lineprotocol`) applies them on the wire, and so does every maker of job
events below it (the events file's grammar, :mod:`wattline.agent.holders.event_lines`; the Job API):
one rule, whichever path a value takes."""

from __future__ import annotations

import re

from wattline.text import clip

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Time stamps InfluxDB accepts (ns since the epoch).
MIN_TIME_NS = INT64_MIN + 2
MAX_TIME_NS = INT64_MAX - 1


#: Most bytes a job id may hold.
MAX_JOB_ID_BYTES = 1024
_CONTROL = re.compile("[\n\r\x00]")
_CONTROL_NAMES = {"\n": "line feed", "\r": "carriage return", "\x00": "NUL"}


class LineProtocolError(ValueError):
    """A point that line protocol cannot carry faithfully (the message says why)."""


def check_time(time_ns: int) -> int:
    """``time_ns`` when InfluxDB can store it, else :class:`LineProtocolError`."""
    if not MIN_TIME_NS <= time_ns <= MAX_TIME_NS:
        raise LineProtocolError(f"time {time_ns} is outside InfluxDB's range {MIN_TIME_NS}..{MAX_TIME_NS}")
    return time_ns


def check_units(units: float) -> float:
    """``units`` when it is a unit count (finite, >= 0), else :class:`LineProtocolError`."""
    if not 0 <= units < float("inf"):  # NaN fails every comparison
        raise LineProtocolError(f"units must be finite and >= 0, got {clip(units)}")
    return units


def control_char(text: str) -> str | None:
    """The name of the first line feed, carriage return or NUL in ``text``, if any."""
    match = _CONTROL.search(text)
    return _CONTROL_NAMES[match.group()] if match else None


def check_tag(text: str, what: str = "tag") -> str:
    """``text`` when a store can keep it as a tag key or value, else :class:`LineProtocolError`:
    no line feed, carriage return or NUL, no trailing backslash."""
    control = control_char(text)
    if control:
        raise LineProtocolError(f"{what} {clip(text)} contains a {control}")
    if text.endswith("\\"):
        raise LineProtocolError(f"{what} {clip(text)} ends with a backslash")
    return text


def check_job_id(job_id: str) -> str:
    """``job_id`` when every store can hold it as a tag, else :class:`LineProtocolError`:
    not empty, a tag (:func:`check_tag`), at most :data:`MAX_JOB_ID_BYTES` bytes."""
    if not job_id:
        raise LineProtocolError("job id is empty")
    size = len(job_id.encode("utf-8", "surrogatepass"))
    if size > MAX_JOB_ID_BYTES:
        raise LineProtocolError(f"job id {clip(job_id)} has {size} bytes, more than {MAX_JOB_ID_BYTES}")
    return check_tag(job_id, "job id")
