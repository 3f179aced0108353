"""The events file's grammar: every reader of a workload's events file (``wattline run`` and so
``wattline sweep``, the agent for Slurm jobs and for pods) parses its lines here, with one set of
limits (docs/jobs.md, "The events file")::

    units N [UNIX_TIME]          N more work units done (a count of 0 too: counting starts then)
    phase NAME [UNIX_TIME]       a phase starts; ``phase saturated``: saturated from then on
    latency SECONDS [UNIX_TIME]  one request's latency, for ``wattline sweep`` (no job event)
    # a comment                  skipped, as a blank line is

N and SECONDS are finite numbers >= 0, UNIX_TIME seconds after the epoch that a store keeps
(:mod:`wattline.point_limits`), NAME 1 to :data:`MAX_PHASE` printable characters, a line at
most :data:`MAX_LINE` characters. A line that breaks a rule is a :class:`BadLine` naming its
kind of problem: readers skip it and say so through :class:`BadLines`, once per kind and file.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from wattline import wire
from wattline.point_limits import check_time, check_units
from wattline.text import clip

log = logging.getLogger(__name__)

#: Longest line read (characters); a longer one is a bad line.
MAX_LINE = 4096
#: Longest phase name (characters).
MAX_PHASE = 64
VERBS = ("units", "phase", "latency")
Kind = wire.pb.JobEvent


@dataclass(frozen=True, slots=True)
class EventLine:
    """One good line: its verb, its value (a count or seconds as a float, a phase's name) and its
    time (None: the line gave none, the reader stamps it when read)."""

    verb: str
    value: float | str
    time_ns: int | None


class BadLine(ValueError):
    """A line no reader takes; ``problem`` names its kind (``long``, ``form``, ``units``,
    ``latency``, ``phase``, ``time``), the message says what is wrong in one line."""

    def __init__(self, problem: str, message: str) -> None:
        super().__init__(message)
        self.problem = problem


def parse_line(line: str) -> EventLine | None:
    """One line of an events file (without its newline); None for a blank line or a comment;
    :class:`BadLine` for a line that breaks a rule."""
    if len(line) > MAX_LINE:
        raise BadLine("long", f"a line has at most {MAX_LINE} characters, this one {len(line)}")
    parts = line.split()
    if not parts or parts[0].startswith("#"):
        return None
    if parts[0] not in VERBS or len(parts) not in (2, 3):
        form = "'units N', 'phase NAME' or 'latency SECONDS', then an optional UNIX_TIME"
        raise BadLine("form", f"expected {form}, got {clip(line.strip())}")
    verb, value = parts[0], parts[1]
    stamp = _time(parts[2]) if len(parts) == 3 else None
    return EventLine(verb, check_phase(value) if verb == "phase" else _count(verb, value), stamp)


def check_phase(name: str) -> str:
    """``name`` when it is a phase name (1 to :data:`MAX_PHASE` printable characters, no
    space), else :class:`BadLine`: what the events file can carry, so the Job API takes no more."""
    if not 0 < len(name) <= MAX_PHASE or not name.isprintable() or any(c.isspace() for c in name):
        raise BadLine(
            "phase", f"a phase name is 1 to {MAX_PHASE} printable characters without spaces, got {clip(name)}"
        )
    return name


def check_count(verb: str, value: float) -> float:
    """``value`` when a ``units`` or ``latency`` line (``verb``) may carry it (finite, >= 0; -0 as
    0), else :class:`BadLine`: the Job API takes no more."""
    try:
        return check_units(value) + 0.0
    except ValueError:  # NaN, infinite or negative
        raise BadLine(verb, f"{verb} must be a finite number >= 0, got {clip(value)}") from None


def _count(verb: str, text: str) -> float:
    try:
        return check_count(verb, float(text))
    except ValueError:  # not a number, or not a count: said with the text as written
        raise BadLine(verb, f"{verb} must be a finite number >= 0, got {clip(text)}") from None


def _time(text: str) -> int:
    try:
        stamp = check_time(int(float(text) * 1e9))
    except (ValueError, OverflowError):  # not a number, NaN, infinite, beyond what a store keeps
        stamp = 0
    if stamp <= 0:
        raise BadLine("time", f"UNIX_TIME must be seconds after the epoch, before the year 2262, got {clip(text)}")
    return stamp


def complete_lines(partial: bytes, chunk: bytes) -> tuple[list[str], bytes]:
    """The complete lines of ``partial + chunk`` (bytes read on from a file), each decoded
    whole, and the unfinished rest to keep for the next read. Lines end at a line feed only
    (a CR before it is blank space, a CR alone ends no line); the rest is kept only as long
    as it takes to stay too long a line once ended (4 bytes a character at most)."""
    *lines, rest = (partial + chunk).split(b"\n")
    return [line.decode("utf-8", "replace") for line in lines], rest[-4 * (MAX_LINE + 1) :]


class BadLines:
    """Says the bad lines of events files: the first of each kind of problem in each file
    (``where``), then no more of that kind there (a file may hold a million); it remembers the
    last ``files`` files. Thread-safe: readers of several jobs may share one."""

    def __init__(self, files: int = 1024) -> None:
        self.count = 0  #: bad lines seen
        self._files = files
        self._said: OrderedDict[str, set[str]] = OrderedDict()
        self._lock = threading.Lock()

    def report(self, where: str, error: BadLine) -> None:
        with self._lock:
            self.count += 1
            said = self._said.setdefault(where, set())
            self._said.move_to_end(where)
            if len(self._said) > self._files:
                self._said.popitem(last=False)
            if error.problem in said:
                return
            said.add(error.problem)
        log.warning("%s: ignored line: %s (further lines with this problem are skipped unsaid)", where, error)


#: The agent's reports: one for every events file it reads (Slurm jobs', pods').
AGENT_BAD_LINES = BadLines()


def job_event(parsed: EventLine) -> tuple[wire.pb.JobEvent.Kind, dict[str, Any], int | None] | None:
    """The job event of a good line as (kind, fields, time): UNITS (a count of 0 too) or PHASE;
    None for ``latency`` (read by ``wattline sweep`` within ``wattline run``, no job event)."""
    if parsed.verb == "units":
        return Kind.KIND_UNITS, {"units": parsed.value}, parsed.time_ns
    if parsed.verb == "phase":
        return Kind.KIND_PHASE, {"phase": parsed.value}, parsed.time_ns
    return None


def line_event(
    line: str, where: str = "an events file"
) -> tuple[wire.pb.JobEvent.Kind, dict[str, Any], int | None] | None:
    """:func:`job_event` of one line; None for a line that makes no event, and for a bad line,
    said in :data:`AGENT_BAD_LINES` as ``where``'s."""
    try:
        parsed = parse_line(line)
    except BadLine as exc:
        AGENT_BAD_LINES.report(where, exc)
        return None
    return None if parsed is None else job_event(parsed)
