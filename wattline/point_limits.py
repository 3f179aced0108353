"""What a stored point may carry, checked wherever a value enters: a time stamp InfluxDB keeps
(:func:`check_time`) and a unit count (:func:`check_units`). The collector's encoder
(:mod:`wattline.collector.lineprotocol`) applies them on the wire, and so does every maker of job
events below it (the events file's grammar, :mod:`wattline.agent.event_lines`; the Job API):
one rule, whichever path a value takes."""

from __future__ import annotations

from wattline.text import clip

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Time stamps InfluxDB accepts (ns since the epoch).
MIN_TIME_NS = INT64_MIN + 2
MAX_TIME_NS = INT64_MAX - 1


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
