"""What reports read back from a store: rows, and the small query interface they need.

Energy over a window is the difference of the cumulative counter at its two edges
(within one agent stream), so a report asks each store for the samples at the edges of
its windows, not for every sample of the job: its cost does not grow with the job's
length. :meth:`Reader.samples` (every sample in a window) is the fallback when an agent
restarted inside the window, and the input of concurrent-job splitting.

Finding the jobs that shared a job's hosts reads only the open, close and heartbeat events
near the job's window, and the last event of each job still open there
(:meth:`Reader.job_events_between`), never every event of the store, so a report's cost
does not grow with what else the store holds.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, runtime_checkable

from wattline import wire
from wattline.collector.stores.base import JobSummary, WriteResult


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

    def job_events(self, job_id: str | None = None) -> list[StoredJobEvent]:
        """Every event of ``job_id`` (all jobs when None), ordered by time."""
        ...

    def job_events_between(self, start_ns: int, end_ns: int, hosts: Collection[str]) -> list[StoredJobEvent]:
        """The open and close events (every host's) of the jobs that may overlap [start_ns, end_ns]
        on one of ``hosts`` (see :func:`jobs_near`), and for each such job and host without a
        close, one ``heartbeat`` event at the time of the job's last event of any kind there
        (when it was last heard; its fields are not read). Ordered by time; callers check the
        overlap and whether an unclosed job's lease expired (``wire.lease_ns``)."""
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


@runtime_checkable
class OpenReader(Reader, Protocol):
    """A store opened for reports: the queries, and closing it (it is a context manager)."""

    kind: str

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class SummaryStore(OpenReader, Protocol):
    """A store that reports read and job summaries are written to."""

    def write_summary(self, summary: JobSummary) -> WriteResult: ...


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
