"""One table of events-file lines and what every reader must make of each (issue #42 item 6):
good lines, bad ones (each of a kind of problem) and the edges between them.

``python events_table.py``: a workload that appends the table, its times from the next whole
second on, to ``$WATTLINE_EVENTS`` and runs until the last of them has passed; it prints that
second (the table's base) first.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

#: Good lines' times lie base + k/2 s for k < 2 * SPAN_S: whole and half seconds near 2026 are
#: exact as a float, and so in ns, so every reader must give each time exactly.
SPAN_S = 5
FAR = 4_700_000_000  #: a time in 2118: a store keeps it (until 2262); the agent refused it (2**62 ns)


@dataclass(frozen=True)
class Expect:
    """What a line is: a job event (``units``/``phase`` with its value and time), a ``latency``
    (no job event), nothing (blank, comment) or bad (``bad``: its kind of problem)."""

    kind: str = ""
    value: float | str = 0.0
    time_ns: int = 0
    bad: str = ""


def table(base: int) -> list[tuple[str, Expect]]:
    """The lines with their times from ``base`` (whole seconds since the epoch) on."""

    def at(k: int) -> str:
        return repr(base + k / 2)

    def ns(k: int) -> int:
        return base * 10**9 + k * 5 * 10**8

    nothing = Expect()
    return [
        ("# a comment, then blank lines", nothing),
        ("", nothing),
        ("   \t ", nothing),
        ("#units 5", nothing),
        (f"units 10 {at(1)}", Expect("units", 10.0, ns(1))),
        (f"units 0 {at(2)}", Expect("units", 0.0, ns(2))),  # item 7: counting starts then
        (f"  units\t2.5   {at(3)}  ", Expect("units", 2.5, ns(3))),
        (f"units -0 {at(4)}", Expect("units", 0.0, ns(4))),
        (f"units 3 {at(5)}\r", Expect("units", 3.0, ns(5))),  # a CRLF line
        (f"phase saturated {at(5)}", Expect("phase", "saturated", ns(5))),
        (f"phase {'p' * 64} {at(6)}", Expect("phase", "p" * 64, ns(6))),
        (f"latency 0.25 {at(6)}", Expect("latency", 0.25, ns(6))),
        (f"latency 0 {at(7)}", Expect("latency", 0.0, ns(7))),
        (f"phase warm-up_2/é {at(8)}", Expect("phase", "warm-up_2/é", ns(8))),
        (f"units 1 {FAR}", Expect("units", 1.0, FAR * 10**9)),
        # bad: each kind of problem more than once
        (f"units -1 {at(2)}", Expect(bad="units")),
        (f"units nan {at(2)}", Expect(bad="units")),
        (f"units 1e400 {at(2)}", Expect(bad="units")),
        ("units ten", Expect(bad="units")),
        ("units 5 0", Expect(bad="time")),
        ("units 5 -1", Expect(bad="time")),
        ("units 5 1e10", Expect(bad="time")),  # 2286: beyond what InfluxDB keeps
        ("units 5 nan", Expect(bad="time")),
        ("phase saturated soon", Expect(bad="time")),
        (f"phase {'p' * 65} {at(3)}", Expect(bad="phase")),  # the agent cut it to 64
        (f"phase bell\x07 {at(3)}", Expect(bad="phase")),
        (f"latency -0.5 {at(3)}", Expect(bad="latency")),
        ("latency nan", Expect(bad="latency")),
        ("units", Expect(bad="form")),
        ("units 1 2 3", Expect(bad="form")),
        ("UNITS 5", Expect(bad="form")),
        ("units 5 # a comment after a line", Expect(bad="form")),
        ("bogus line", Expect(bad="form")),
        (f"units 7\runits 8 {at(9)}", Expect(bad="form")),  # a lone CR ends no line
        ("units " + "1" * 4100, Expect(bad="long")),
    ]


def text(base: int) -> str:
    return "".join(line + "\n" for line, _ in table(base))


def events(base: int) -> list[tuple[str, float | str, int]]:
    """The job events of the table, in its order."""
    return [(e.kind, e.value, e.time_ns) for _, e in table(base) if e.kind in ("units", "phase")]


def problems(base: int) -> set[str]:
    return {e.bad for _, e in table(base) if e.bad}


if __name__ == "__main__":
    start = int(time.time()) + 1
    print(start, flush=True)
    with open(os.environ["WATTLINE_EVENTS"], "a", encoding="utf-8") as fh:
        fh.write(text(start))
    time.sleep(max(0.0, start + SPAN_S - time.time()))
    sys.exit(0)
