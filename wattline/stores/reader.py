"""What reports read back from a store: rows, and the small query interface they need.

Energy over a window is the difference of the cumulative counter at its two edges
(within one agent stream), so a report asks each store for the samples at the edges of
its windows, not for every sample of the job: its cost does not grow with the job's
length. :meth:`Reader.samples` (every sample in a window) is the fallback when an agent
restarted inside the window, and the input of concurrent-job splitting.

A job's UNITS events (one a minute per process for as long as it runs) are read the same
way: a report needs its unit count only at a few instants (the saturation grid, the
saturation point), so :meth:`Reader.unit_events` gives, per host and per span between two
such instants, the events at the span's first instant and one at its last that carries
the units of the others (:func:`reduce_units`); a view built from them has the same
figures at those instants as one built from every event, and the store sums the rest itself.

Units come from totals where they can (:func:`units_from_totals`), on every store: where one
writer (one event_seq base) wrote a host's UNITS events and each carries its running total
(``units_total``), a stored event counts its total less the previous stored one's (the
first, its whole total), so the units of an event the store never got count at the next
stored event of the same process, as energy counts from counters.

Finding the jobs that shared a job's hosts reads only the open, close and heartbeat events
near the job's window, and the last event of each job still open there
(:meth:`Reader.job_events_between`), never every event of the store, so a report's cost
does not grow with what else the store holds.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import operator
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, runtime_checkable

from wattline import wire
from wattline.stores.base import IntervalSummary, JobSummary, WriteResult
from wattline.stores.schema import SEQ_COUNTER_BITS


@dataclass(frozen=True, slots=True)
class StoredSample:
    """One ``energy`` point as stored."""

    host: str
    source: str
    component: str
    device: str
    quality: str
    start_ns: int
    end_ns: int
    energy_j: float
    cumulative_j: float
    stream: str
    healthy: bool = True
    utilization: float | None = None
    energy_error_j: float | None = None
    #: NeuronCores per device as the agent found them (gauge ``neuroncores_per_device`` of a
    #: Neuron device's samples); None for other channels and samples of older agents.
    neuroncores_per_device: int | None = None

    @property
    def series(self) -> tuple[str, str, str, str, str]:
        return (self.host, self.source, self.component, self.device, self.quality)


@dataclass(frozen=True, slots=True)
class StoredJobEvent:
    """One ``job_events`` point as stored; ``fields`` depend on the event kind."""

    host: str
    job_id: str
    event: str  #: open | units | phase | close | heartbeat
    time_ns: int
    event_seq: int
    fields: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Reader(Protocol):
    """Queries a report needs; every store that reports read from implements them
    (``isinstance(store, Reader)`` tells whether a store can be read back)."""

    def job_events(self, job_id: str | None = None, every: bool = True) -> list[StoredJobEvent]:
        """Every event of ``job_id`` (all jobs when None), ordered by time. Not ``every`` (one
        job): what a view needs beside its UNITS events (:meth:`unit_events`), read without
        visiting the rows a long job adds: no UNITS event, and of the heartbeats only each
        host's first and last (when the job was first and last heard there)."""
        ...

    def unit_events(self, job_id: str, cuts: UnitCuts) -> list[StoredJobEvent]:
        """The UNITS events of ``job_id`` reduced to what figures at ``cuts`` need
        (:func:`reduce_units`), read without reading every event where the store can."""
        ...

    def job_events_between(self, start_ns: int, end_ns: int, hosts: Collection[str]) -> list[StoredJobEvent]:
        """The open and close events (every host's) of the jobs that may overlap [start_ns, end_ns]
        on one of ``hosts`` (see :func:`jobs_near`), and for each such job and host without a
        close, one ``heartbeat`` event at the time of the job's last event of any kind there
        (when it was last heard; its fields are not read), for each with a close and no open,
        one at the earliest time its events there say it ran (:func:`first_heard`). Ordered by
        time; callers check the overlap and whether an unclosed job's lease expired
        (``wire.lease_ns``)."""
        ...

    def samples(self, host: str, start_ns: int, end_ns: int) -> list[StoredSample]:
        """Samples of ``host`` whose interval overlaps [start_ns, end_ns], ordered by end."""
        ...

    def first_after(self, host: str, t_ns: int) -> list[StoredSample]:
        """Per series of ``host``: the first sample whose interval ends at or after ``t_ns``."""
        ...

    def last_before(self, host: str, t_ns: int) -> list[StoredSample]:
        """Per series of ``host``: the last sample whose interval ends at or before ``t_ns``."""
        ...

    def around(self, host: str, instants: Sequence[int]) -> list[tuple[list[StoredSample], list[StoredSample]]]:
        """Per instant: (:meth:`last_before`, :meth:`first_after`) of ``host``, in one round
        trip where the store allows (a report reads every edge of a host at once)."""
        ...


@runtime_checkable
class OpenReader(Reader, Protocol):
    """A store opened for reports: the queries, and closing it (it is a context manager)."""

    kind: str

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class CheckedReader(OpenReader, Protocol):
    """A store that can tell, before a report reads it, that it has nothing to read: a
    database that does not exist (whose queries would just find nothing)."""

    def check_readable(self) -> None:
        """ConfigError (one line) when reports cannot read this store."""


@runtime_checkable
class SummaryStore(OpenReader, Protocol):
    """A store that reports read and job summaries are written to."""

    def write_summary(self, summary: JobSummary) -> WriteResult: ...


@runtime_checkable
class IntervalStore(OpenReader, Protocol):
    """A store that reports read and service intervals are written to (``replaces_intervals``:
    whether a rewrite of an interval replaces it; where not, the writer writes it once, final)."""

    replaces_intervals: bool

    def write_intervals(self, intervals: Sequence[IntervalSummary]) -> WriteResult: ...


#: Longest sample interval a window query looks back for (a sample is stamped at its
#: end, so one overlapping a window's start may end up to this long after it).
MAX_INTERVAL_NS = 3600 * 10**9


#: How far around a window :func:`jobs_near` looks for opens and closes: it bounds the
#: search. A running job is found whatever its age by its heartbeats; whether an unclosed
#: job still shares a host is decided by its lease (``wire.lease_ns``), not by this bound.
#: Only a job written before heartbeats existed that opened over this long before the
#: window, or closes over this long after it, goes unseen.
JOB_LOOKBACK_NS = 31 * 86400 * 10**9

#: ``(event, hosts, since_ns, until_ns)`` -> ids of the jobs with such an event on one of
#: ``hosts`` with ``since_ns <= time <= until_ns``.
JobIdsQuery = Callable[[str, Collection[str], int, int], Iterable[str]]

#: ``[(job_id, host), ...]`` -> ``{(job_id, host): time_ns of the job's latest event on host}``.
LastHeardQuery = Callable[[Sequence[tuple[str, str]]], dict[tuple[str, str], int]]


def jobs_near(job_ids: JobIdsQuery, start_ns: int, end_ns: int, hosts: Collection[str]) -> set[str]:
    """Ids of the jobs that may overlap [start_ns, end_ns] on ``hosts``, from three time-bounded
    scans: closes in [start_ns, end_ns + JOB_LOOKBACK_NS] (jobs that ended after the window
    began, however long ago they opened), opens in [start_ns - JOB_LOOKBACK_NS, end_ns] (jobs
    that began before it ended, closed or not) and heartbeats in [start_ns - lease, end_ns]
    (a job alive at any time in the window renewed its lease at most one lease before it,
    however long ago it opened and whenever it closes).
    """
    if not hosts:
        return set()
    ids = set(job_ids("close", hosts, start_ns, end_ns + JOB_LOOKBACK_NS))
    ids.update(job_ids("open", hosts, start_ns - JOB_LOOKBACK_NS, end_ns))
    ids.update(job_ids("heartbeat", hosts, start_ns - wire.lease_ns(), end_ns))
    return ids


#: ``[(job_id, host), ...]`` -> ``{(job_id, host): the earliest time its events on host say the
#: job ran there}``: its first event's time, or its first USE event's period start if earlier.
FirstHeardQuery = Callable[[Sequence[tuple[str, str]]], dict[tuple[str, str], int]]


def evidence_ns(e: StoredJobEvent) -> int:
    """The earliest time ``e`` says its job ran on its host: its time, or for a USE event the
    start of the period it measured (``period_ns`` before it)."""
    period = e.fields.get("period_ns") if e.event == "use" else None
    if isinstance(period, int | float) and not isinstance(period, bool) and 0 < period < e.time_ns:
        return e.time_ns - int(period)
    return e.time_ns


def first_heard(events: Collection[StoredJobEvent], lookup: FirstHeardQuery) -> list[StoredJobEvent]:
    """One ``heartbeat`` event per (job, host) with a close in ``events`` and no open, at the time
    ``lookup`` gives for it: where the job's window there starts, its open not stored."""
    closed = {(e.job_id, e.host) for e in events if e.event == "close"}
    unopened = sorted(closed - {(e.job_id, e.host) for e in events if e.event == "open"})
    if not unopened:
        return []
    found = lookup(unopened)
    return [
        StoredJobEvent(host, job_id, "heartbeat", found[job_id, host], 0)
        for job_id, host in unopened
        if (job_id, host) in found
    ]


def heard(events: Collection[StoredJobEvent], last: LastHeardQuery, first: FirstHeardQuery) -> list[StoredJobEvent]:
    """:func:`last_heard` and :func:`first_heard` of ``events``."""
    return [*last_heard(events, last), *first_heard(events, first)]


def last_heard(events: Collection[StoredJobEvent], lookup: LastHeardQuery) -> list[StoredJobEvent]:
    """One ``heartbeat`` event per (job, host) with an open in ``events`` and no close, at the
    time ``lookup`` gives for it: the job's latest event of any kind on that host."""
    opened = {(e.job_id, e.host) for e in events if e.event == "open"}
    unclosed = sorted(opened - {(e.job_id, e.host) for e in events if e.event == "close"})
    if not unclosed:
        return []
    heard = lookup(unclosed)
    return [
        StoredJobEvent(host, job_id, "heartbeat", heard[job_id, host], 0)
        for job_id, host in unclosed
        if (job_id, host) in heard
    ]


@dataclass(frozen=True, slots=True)
class UnitCuts:
    """The instants at which a job's unit count is read: ``bins`` equal spans from ``start_ns``
    to ``end_ns`` (edges ``start_ns + (end_ns - start_ns) * j // bins``, as the saturation
    grid and the timeline cut them; no grid when ``bins`` is 0) and the ``extra`` instants."""

    start_ns: int
    end_ns: int
    bins: int = 0
    extra: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.bins < 0 or (self.bins and self.end_ns <= self.start_ns):
            raise ValueError(f"no grid of {self.bins} bins from {self.start_ns} to {self.end_ns}")

    @property
    def instants(self) -> list[int]:
        """Every cut, sorted, without repeats."""
        length = self.end_ns - self.start_ns
        grid = (self.start_ns + length * j // self.bins for j in range(self.bins + 1)) if self.bins else ()
        return sorted({*grid, *self.extra})

    def span(self, t_ns: int) -> int:
        """The span ``t_ns`` falls in: how many cuts lie before it (a span ends at its cut)."""
        return bisect.bisect_left(self.instants, t_ns)


def reduce_units(events: Iterable[StoredJobEvent], cuts: UnitCuts) -> list[StoredJobEvent]:
    """UNITS events reduced, per host and span of ``cuts``, to the events at the span's first
    instant and one more at its last instant (its last event by event_seq) that carries the
    units of all the others.

    A job's unit count at a cut (every event up to it, and the share of the next event
    apportioned over the time since the host's previous one) and the merged timeline
    between its neighbours (the saturation grid) depend only on those: a view of the
    reduced events has the same figures at every cut (to float rounding of the sums;
    exactly for whole unit counts). Events whose units are not a finite number >= 0
    (stored by an older version) are returned as they are, so the view says what is wrong."""
    events = list(events)
    if not all(good_units(e.fields.get("units", 0)) for e in events):
        return events
    spans: dict[tuple[str, int], list[StoredJobEvent]] = defaultdict(list)
    instants = cuts.instants
    for e in events:
        spans[e.host, bisect.bisect_left(instants, e.time_ns)].append(e)
    out: list[StoredJobEvent] = []
    for group in spans.values():
        group.sort(key=lambda e: (e.time_ns, e.event_seq))
        first = [e for e in group if e.time_ns == group[0].time_ns]
        rest = group[len(first) :]
        if len(rest) > 1:
            units = sum(float(e.fields.get("units", 0)) for e in rest)
            rest = [dataclasses.replace(rest[-1], fields={"units": units})]
        out += first + rest
    return sorted(out, key=lambda e: (e.time_ns, e.host, e.event_seq))


#: How far two totals' difference may lie from an event's own count and still be that count (the
#: totals' float rounding), relative to the total.
TOTALS_ROUNDING = 1e-9


def counts_from_totals(units: Sequence[Any], totals: Sequence[Any], before: float = 0.0) -> list[Any] | None:
    """The units each of one writer's UNITS events counts, in (time, event_seq) order, from their
    ``totals`` (the writer's running totals; ``before``: its total before the first of them): each
    its total less the previous one's, which is its own count (``units``, None for 0) unless
    events between them were not stored. None when the totals cannot say it: one is missing or
    not a finite number >= 0, or one rose by less than its event's own count (not as a writer
    numbers them). By columns in C; a Python step per event only where some were not stored."""
    owns = [0 if u is None else u for u in units] if None in units else list(units)
    totals = list(totals)
    if len(owns) != len(totals) or not (_good_column(owns) and _good_column(totals)):
        return None
    rose = list(map(operator.sub, totals, [before, *totals[:-1]]))
    off = list(map(operator.sub, rose, owns))  # what events not stored counted
    if not off or max(map(abs, off)) <= TOTALS_ROUNDING:  # none lost: each its own count
        return list(units)
    out: list[Any] = []
    for own, grown, lost, total in zip(units, rose, off, totals, strict=True):
        rounding = TOTALS_ROUNDING * max(1.0, total)
        if lost < -rounding:
            return None
        out.append(own if lost <= rounding else grown)
    return out


def _good_column(values: list[Any]) -> bool:
    """Every value a finite number >= 0, not a bool (:func:`good_units`), checked in C (a sum
    that is not finite: a value that is not, or one so large the sum overflows)."""
    if not values:
        return True
    return set(map(type, values)) <= {int, float} and min(values) >= 0 and math.isfinite(sum(values))


def writer(event_seq: int) -> int:
    """Who numbered an event (its event_seq base: see ``schema.SEQ_COUNTER_BITS``)."""
    return event_seq >> SEQ_COUNTER_BITS


_ORDER = operator.attrgetter("time_ns", "event_seq")
_SEQ = operator.attrgetter("event_seq")


def units_from_totals(events: Iterable[StoredJobEvent]) -> list[StoredJobEvent]:
    """``events`` with the units of each (job, host)'s UNITS events from their totals where one
    writer wrote them all and the totals say it (:func:`counts_from_totals`); else as stored.
    Takes ``units_total`` out of every event's fields, in place (the events a reader made of
    what it read: every store gives the same fields)."""
    events = list(events)
    rows = [i for i, e in enumerate(events) if e.event == "units"]
    totals = [events[i].fields.pop("units_total", None) for i in rows]
    owners = [(events[i].job_id, events[i].host) for i in rows]
    hosts: dict[tuple[str, str], list[int]] = {}
    if len(set(owners)) == 1:  # one job on one host (a report's read)
        hosts[owners[0]] = list(range(len(rows)))
    else:
        for k, owner in enumerate(owners):
            hosts.setdefault(owner, []).append(k)
    for group in hosts.values():
        mine = [events[rows[k]] for k in group]
        keys = list(map(_ORDER, mine))
        if not all(map(operator.le, keys, itertools.islice(keys, 1, None))):
            order = sorted(range(len(group)), key=keys.__getitem__)
            group, mine = [group[k] for k in order], [mine[k] for k in order]
        seqs = list(map(_SEQ, mine))
        if writer(min(seqs)) != writer(max(seqs)):
            continue
        owns = [e.fields.get("units") for e in mine]
        counts = counts_from_totals(owns, [totals[k] for k in group])
        for k, e, own, count in zip(group, mine, owns, counts or owns, strict=True):
            if count is not own:
                events[rows[k]] = dataclasses.replace(e, fields={**e.fields, "units": count})
    return events


def good_units(value: Any) -> bool:
    """A unit count a view takes: a finite number >= 0 (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < math.inf
