"""How the disk spool groups its records into batches: a run is consecutive records (fragments)
of one stream in one segment, sent as one batch once sealed.

A record joins the open run when it follows it in the same segment and stream, keeps the run
within ``max_batch_samples`` samples, and was written within the run's span of its first
record (a thousandth of the age bound, or a minute: read back, a dead process's events would
otherwise be one batch as old as its newest event). A run the collector refuses as too large
is split in two by its records (:func:`split_run`).
"""

from __future__ import annotations

from dataclasses import dataclass

from wattline import wire
from wattline.segments import RawRecord


@dataclass(slots=True)
class Fragment:
    """One record of a segment: where it is, when it was written, what it holds."""

    segment: int
    offset: int
    end: int
    written_ns: int
    stream_id: str
    samples: int
    events: int


@dataclass(slots=True)
class Run:
    """Consecutive fragments of one stream in one segment: one batch once sealed."""

    segment: int
    start: int
    end: int
    stream_id: str
    written_ns: int  #: when its newest record was written (the age bound drops whole runs)
    first_ns: int = 0  #: when its oldest record was written
    samples: int = 0
    events: int = 0
    records: int = 0
    seq: int = 0


def extend_run(run: Run | None, record: Fragment, max_samples: int, span_ns: int) -> tuple[Run, Run | None]:
    """The open run once ``record`` is added, and the run that record closed (None if it joined)."""
    closed = None
    if (
        run is None
        or run.segment != record.segment
        or run.stream_id != record.stream_id
        or run.end != record.offset
        or (run.samples and run.samples + record.samples > max_samples)
        or record.written_ns - run.first_ns > span_ns
    ):
        closed = run
        run = Run(record.segment, record.offset, record.offset, record.stream_id, record.written_ns, record.written_ns)
    run.end = record.end
    run.written_ns = record.written_ns
    run.samples += record.samples
    run.events += record.events
    run.records += 1
    return run, closed


def split_run(head: Run, records: list[RawRecord]) -> Run:
    """Cut ``head`` in two at the middle of its ``records`` (as ``segments.scan`` read them,
    offsets relative to its start): ``head`` keeps the first half, the second is returned,
    numbered next; renumbering the runs after it is the caller's."""
    cut = len(records) // 2
    second = Run(head.segment, head.start + records[cut][0], head.end, head.stream_id, records[cut][2])
    second.records = len(records) - cut
    for _offset, _end, _written_ns, payload in records[cut:]:
        fragment = wire.Batch.FromString(payload)
        second.samples += len(fragment.samples)
        second.events += len(fragment.job_events)
    head.end = second.start
    head.records = cut
    head.samples -= second.samples
    head.events -= second.events
    second.seq = head.seq + 1
    return second
