"""What reports read back from a store: rows, and the small query interface they need.

Energy over a window is the difference of the cumulative counter at its two edges
(within one agent stream), so a report asks each store for the samples at the edges of
its windows, not for every sample of the job: its cost does not grow with the job's
length. :meth:`Reader.samples` (every sample in a window) is the fallback when an agent
restarted inside the window, and the input of concurrent-job splitting.

Finding the jobs that shared a job's hosts reads only the open and close events near the
job's window (:meth:`Reader.job_events_between`), never every event of the store, so a
report's cost does not grow with what else the store holds.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol


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
    event: str  #: open | units | phase | close
    time_ns: int
    event_seq: int
    fields: dict[str, Any] = field(default_factory=dict)


class Reader(Protocol):
    """Queries a report needs; every store that reports read from implements them."""

    def job_events(self, job_id: str | None = None) -> list[StoredJobEvent]:
        """Every event of ``job_id`` (all jobs when None), ordered by time."""
        ...

    def job_events_between(self, start_ns: int, end_ns: int, hosts: Collection[str]) -> list[StoredJobEvent]:
        """The open and close events (every host's) of the jobs that may overlap [start_ns, end_ns]
        on one of ``hosts``, ordered by time; see :func:`jobs_near`. Callers check the overlap."""
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


#: Longest sample interval a window query looks back for (a sample is stamped at its
#: end, so one overlapping a window's start may end up to this long after it).
MAX_INTERVAL_NS = 3600 * 10**9


#: How far around a window :func:`jobs_near` looks for opens and closes. A job found
#: neither way opened over this long before the window and is still open (or closes over
#: this long after it): taken as abandoned (its close was lost), not as sharing the hosts.
JOB_LOOKBACK_NS = 31 * 86400 * 10**9

#: ``(event, hosts, since_ns, until_ns)`` -> ids of the jobs with such an event on one of
#: ``hosts`` with ``since_ns <= time <= until_ns``.
JobIdsQuery = Callable[[str, Collection[str], int, int], Iterable[str]]


def jobs_near(job_ids: JobIdsQuery, start_ns: int, end_ns: int, hosts: Collection[str]) -> set[str]:
    """Ids of the jobs that may overlap [start_ns, end_ns] on ``hosts``, from two time-bounded
    scans: closes in [start_ns, end_ns + JOB_LOOKBACK_NS] (jobs that ended after the window
    began, however long ago they opened) and opens in [start_ns - JOB_LOOKBACK_NS, end_ns]
    (jobs that began before it ended, closed or not). A job overlapping the window appears in
    one of them unless it lasts over 2 x JOB_LOOKBACK_NS around it (see JOB_LOOKBACK_NS).
    """
    if not hosts:
        return set()
    ids = set(job_ids("close", hosts, start_ns, end_ns + JOB_LOOKBACK_NS))
    ids.update(job_ids("open", hosts, start_ns - JOB_LOOKBACK_NS, end_ns))
    return ids
