"""A served job's series beside its own units, as every holder of a service sends them (``wattline
run --metrics``, the agent's pod and systemd-unit watchers): each extra unit kind's series (one
model's output tokens, say) and each bucket of its latency histograms, as UNITS events with
``unit`` and ``unit_labels`` set.

:class:`ServerSeries` turns one server's :class:`~wattline.served_metrics.Reading` into the job's
own units and a :class:`SeriesCount` per extra series: a unit series' units since the previous
reading; a latency histogram's gain per bucket (``le`` its bound as the exposition writes it,
``0.5``, ``+Inf``: its count is the histogram's ``_count``) and of its ``_sum`` (``le="sum"``, in
seconds), counted as the unit counters are (a restart neither loses nor doubles one), so a report
takes any window's bucket counts from them (:mod:`wattline.reports.latency`); the ``le``
label keeps them out of the unit kinds. A job served by several servers (a Deployment's replicas
on one node) adds their counts (:func:`added`).

:class:`SeriesBook` sends a job's series, each by a sender of its own (its event_seq base apart
from the job's, so a reader never adds its units into the job's). An idle reading's 0 is held
and sent only before the series' next busy one, whose units then cover that interval alone, not
the idle stretch; so an idle service writes no event per series per reading. A series first seen
after the first reading counted its units since the previous one (it appeared since:
:mod:`wattline.served_metrics`): its first event covers that time, not the job's. A bucket's first
reading is sent even when idle: a report learns the histogram's layout from it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from wattline import wire
from wattline.served_metrics import LatencyTotals, Reading

#: A series' labels, sorted: with its kind, what tells it apart.
Labels = tuple[tuple[str, str], ...]
#: Sends one series' count: (units, its time, the place its holder gave the reading).
Send = Callable[[float, int, int], None]
UNITS = wire.pb.JobEvent.KIND_UNITS


@dataclass(frozen=True, slots=True)
class SeriesCount:
    """One extra series' count in a reading: a unit kind's (``bucket`` False) or a latency bucket's."""

    kind: str
    labels: Labels
    units: float
    bucket: bool = False


@dataclass
class Series:
    """How one series' counts are sent (see the module doc: an idle reading's 0 is held)."""

    send: Send
    total: float = 0.0
    held: tuple[int, int] | None = field(default=None, repr=False)  #: (time, place) of a 0 not sent yet

    def count(self, units: float, time_ns: int, place: int = 0) -> None:
        if not units:
            self.held = (time_ns, place)
            return
        self.flush()
        self.send(units, time_ns, place)
        self.total += units

    def flush(self) -> None:
        """Sends the 0 held, if any, now."""
        if self.held is not None:
            self.send(0.0, *self.held)
            self.held = None


class ServerSeries:
    """One server's readings as the job's own units (``own``, summed over its labels) and the
    counts of its other series; remembers each latency series' totals of the previous reading."""

    def __init__(self, own: str) -> None:
        self.own = own
        self._last: dict[tuple[str, Labels, tuple[float, ...]], LatencyTotals] = {}

    def counts(self, reading: Reading) -> tuple[float, list[SeriesCount]]:
        """(the job's own units, every other series' count) in ``reading``."""
        own = math.fsum(u.units for u in reading.units if u.kind == self.own)
        extra = [SeriesCount(u.kind, _sorted(u.labels), u.units) for u in reading.units if u.kind != self.own]
        for totals in reading.latencies:
            extra += self._gains(totals)
        return own, extra

    def _gains(self, totals: LatencyTotals) -> list[SeriesCount]:
        """What each bucket (and the sum) of one latency series gained since the previous reading:
        the totals only grow (:class:`~wattline.served_metrics.ServedCounters` counts a restart's
        from 0 again)."""
        key = (totals.name, _sorted(totals.labels), tuple(le for le, _ in totals.buckets))
        before = self._last.get(key)
        self._last[key] = totals
        then = [0.0] * (len(totals.buckets) + 1) if before is None else [*(n for _, n in before.buckets), before.sum]
        now = [*(n for _, n in totals.buckets), totals.sum]
        names = [*("+Inf" if le == math.inf else repr(le) for le, _ in totals.buckets), "sum"]
        return [
            SeriesCount(totals.name, _sorted({**totals.labels, "le": le}), b - a, bucket=True)
            for le, a, b in zip(names, then, now, strict=True)
        ]


def added(counts: Iterable[SeriesCount]) -> list[SeriesCount]:
    """``counts`` of several servers of one job, one count per series (first seen first)."""
    sums: dict[tuple[str, Labels, bool], float] = {}
    for c in counts:
        sums[c.kind, c.labels, c.bucket] = sums.get((c.kind, c.labels, c.bucket), 0.0) + c.units
    return [SeriesCount(kind, labels, units, bucket) for (kind, labels, bucket), units in sums.items()]


class SeriesBook:
    """A job's extra series, each sent by the sender ``sender(kind, labels)`` makes for it."""

    def __init__(self, sender: Callable[[str, dict[str, str]], Send]) -> None:
        self.sender = sender
        self.series: dict[tuple[str, Labels], Series] = {}
        self._read: tuple[int, int] | None = None  #: (time, place) of the previous reading

    def count(self, counts: Iterable[SeriesCount], time_ns: int, place: int = 0) -> None:
        """One reading's counts, at its time and place."""
        for c in counts:
            series = self.series.get((c.kind, c.labels))
            if series is None:
                series = self.series[c.kind, c.labels] = Series(self.sender(c.kind, dict(c.labels)), held=self._read)
                series.count(c.units, time_ns, place)
                if c.bucket:  # stored at once, even idle
                    series.flush()
            else:
                series.count(c.units, time_ns, place)
        self._read = (time_ns, place)

    def kind_totals(self) -> dict[str, float]:
        """Each extra unit kind's units so far, over its series (latency buckets left out)."""
        totals: dict[str, float] = {}
        for (kind, labels), series in self.series.items():
            if not any(name == "le" for name, _ in labels):
                totals[kind] = totals.get(kind, 0.0) + series.total
        return totals


def fixed_sender(
    holder: str, job_id: str, host_id: str, base: int, emit: Callable[[wire.pb.JobEvent], None]
) -> Callable[[str, dict[str, str]], Send]:
    """A sender factory for a holder whose events' identity is fixed (an agent's watcher: a
    restarted agent sends the same events again): each series' events in an event_seq block of
    its own, fixed by (``holder``, job, host, kind, labels), at the reading's place in it, each
    event passed to ``emit``. ``base``: the job's own block, which a series' never takes."""

    def sender(kind: str, labels: dict[str, str]) -> Send:
        who = f"{holder}\0{job_id}\0{host_id}\0{kind}\0{json.dumps(sorted(labels.items()))}"
        digest = int.from_bytes(hashlib.sha256(who.encode()).digest()[:8], "big")
        block = digest % (2**31 - 1) + 1
        if block << 32 == base:  # the next block: never the job's own
            block = block % (2**31 - 1) + 1
        mine = block << 32

        def send(units: float, time_ns: int, place: int) -> None:
            emit(
                wire.JobEvent(job_id=job_id, kind=UNITS, time_ns=time_ns, event_seq=mine | place, units=units,
                              unit=kind, unit_labels=labels)
            )  # fmt: skip

        return send

    return sender


def _sorted(labels: dict[str, str]) -> Labels:
    return tuple(sorted(labels.items()))
