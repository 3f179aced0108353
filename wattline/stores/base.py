"""The one small interface every storage back-end implements.

A store receives decoded batches from the collector and writes them **idempotently**:
writing the same batch twice leaves one copy. A sample's identity is (host, series tags,
interval end), exactly as InfluxDB keys points. A job event's identity is (host, job id,
``event_seq``), as the wire contract says, never its time (how each back-end keys it:
:mod:`.schema`).

Errors:
- :class:`StoreUnavailable`: nothing (or not everything) was written, try again later
  (server down, 5xx, timeout). The collector does not acknowledge the batch.
- Points the store refuses as invalid (InfluxDB 4xx on a point) are counted in
  :attr:`WriteResult.rejected` with a reason; retrying cannot help, so the batch is
  still acknowledged.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Self

from wattline import wire

#: A field value as stores write it (line protocol has no null: absent figures are left out).
SummaryValue = float | int | str | bool


@dataclass(frozen=True)
class JobSummary:
    """A job's summary as stored: one point per job, keyed by job id (rewritten in place).

    ``time_ns`` is the job's start; ``tags`` hold name, kind and unit (they never change
    for a job; its status does, so status is a field: a changing tag would start a second
    series, a second point); ``fields`` the report's figures; ``hosts`` each host's energy
    over the whole run (J), for "node energy minus the jobs' energy" per host.
    """

    job_id: str
    time_ns: int
    tags: dict[str, str]
    fields: dict[str, SummaryValue]
    hosts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class IntervalSummary:
    """One interval's figures of a service job as stored (measurement ``service_interval``),
    keyed by job id, its tags and the interval's start ``start_ns`` (its time: a dashboard's
    step then holds the intervals that start in it): a rewrite replaces it.

    ``tags`` hold name and unit (fixed for a job); ``fields`` the interval's figures
    (:mod:`wattline.reports.summaries.intervals`)."""

    job_id: str
    start_ns: int
    tags: dict[str, str]
    fields: dict[str, SummaryValue]


class StoreUnavailable(Exception):
    """The write (or query) failed in a way a later retry may fix."""


@dataclass(slots=True)
class WriteResult:
    """What a write did: points written, points refused and why."""

    written: int = 0
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)


class Store(abc.ABC):
    """A storage back-end."""

    #: Short name for logs and metrics: "sqlite", "influxdb1", "influxdb2".
    kind: str = ""
    #: Most group commits run at once; 0: as many as the collector's ``workers``. A back-end
    #: that serialises writers anyway (SQLite) says 1, so waiting batches group up instead.
    max_concurrent_writes: int = 0
    #: Seconds after it acknowledged a write until the store keeps it through its own SIGKILL
    #: (0: at once); the collector keeps what it wrote that long (:mod:`wattline.collector.replay`).
    durable_after_s: float = 0.0

    @abc.abstractmethod
    def write(self, batch: wire.pb.Batch) -> WriteResult:
        """Write every sample and job event of ``batch``; idempotent.

        Raises :class:`StoreUnavailable` when the batch must be retried.
        """

    def write_group(self, batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
        """Write several batches in one commit (group commit); one result per batch, in order.

        All or nothing as far as the caller knows: :class:`StoreUnavailable` means none of
        them is acknowledged (some may be written; writes are idempotent). Back-ends that
        can commit many batches at once (one transaction, one HTTP request) override this;
        the default writes them one by one.
        """
        return [self.write(batch) for batch in batches]

    def started_ns(self) -> int | None:
        """When the store's server started (ns), to tell it restarted; None where it does not say."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release connections."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
