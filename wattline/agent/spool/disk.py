"""A crash-safe spool on disk: append-only segment files, one record per sampler tick.

One implementation of :class:`~wattline.agent.spool.base.Spool` (the agent, the uplink and the
exporter do not know which one they have). The files' format is :mod:`wattline.agent.spool.format`;
reading back what earlier processes left is :mod:`wattline.agent.spool.recovery`; how records
are grouped into batches is :mod:`wattline.agent.spool.runs`.

A batch sent to the collector is a run of consecutive records (fragments) of one stream (at
most ``max_batch_samples`` samples, never across segments).

Durability
    Every ``add_samples`` is one ``write(2)`` of one record, done before it returns, so
    everything the sampler produced survives ``kill -9`` of the agent (the kernel holds
    the page). ``fsync`` runs once per :meth:`seal` (every ``agent.batch_interval``, 1.5 s
    by default), from the uplink's thread, never the sampler's, and only when something
    was written; so a power cut loses at most the last interval. A record write is cheap
    (the page cache takes it); an fsync is not, and one per tick would multiply its cost
    by the sampling rate and put disk latency into the sampling loop.
    The cursor is rewritten (``rename``, no fsync) at most twice a second: a stale
    cursor only means batches resent after a restart, which the idempotent stores
    collapse (one copy per point).

Recovery
    What earlier processes left is read back from the cursor on (torn or corrupt ends
    truncated, logged). A restarted agent starts a **new stream** (new stream id:
    ``cumulative_j`` restarts with each process) in a new segment; the spooled fragments
    are replayed first, in order, under their **own** stream id and host (records are
    self-describing). Their batches are numbered again (after the cursor's last
    acknowledged seq for that stream): seq only pairs a batch with its acknowledgement,
    the stores key points on (host, series, interval end).

Bounds
    ``max_bytes`` (total size of the segment files) and ``max_age_s`` (time since a
    record was written): beyond either, the **oldest** data is dropped (whole segments
    for size, batches for age), counted in ``dropped_batches`` / ``dropped_samples`` /
    ``dropped_events`` and logged. A failed write (disk full, I/O error) is counted and
    logged the same way. A batch spans at most a thousandth of ``max_age_s`` (or a
    minute) of writing (:mod:`wattline.agent.spool.runs`): what the age bound keeps is at
    most that much older.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from wattline import wire
from wattline.agent.encoding import EncodedSamples
from wattline.agent.spool.base import SpoolBase
from wattline.agent.spool.format import MAGIC, SpoolError, create_segment, read_batch, save_cursor, take_lock
from wattline.agent.spool.recovery import recover, unlink
from wattline.agent.spool.runs import Fragment, Run, extend_run, split_run
from wattline.segments import encode_record, read_range, scan, segment_name, sync_files, write_record

log = logging.getLogger(__name__)

#: Least time between two cursor rewrites.
CURSOR_EVERY_S = 0.5


class DiskSpool(SpoolBase):
    """Spool of one agent stream on disk, replaying what earlier processes left."""

    def __init__(
        self,
        host: wire.pb.Host,
        directory: Path,
        *,
        max_batch_samples: int = 5000,
        max_bytes: int = 512 << 20,
        max_age_s: float = 86400.0,
    ) -> None:
        super().__init__(host, max_batch_samples)
        self.directory = Path(directory)
        self.where = str(self.directory)
        self.max_bytes = max_bytes
        self.max_age_ns = int(max_age_s * 1e9)
        # a minute at least: a live batch (one batch interval of writing) is never cut by it
        self.run_span_ns = max(self.max_age_ns // 1000, 60 * 10**9)
        self.segment_bytes = min(max(max_bytes // 16, 4 << 10), 16 << 20)
        self.corrupt_bytes = 0
        self.write_errors = 0
        self._write_error_logged = -1e9
        self.recovered_batches = 0
        self.recovered_samples = 0
        prefix = wire.Batch(stream_id=self.stream_id)
        prefix.host.CopyFrom(host)
        self._prefix = prefix.SerializeToString()
        self._segments: dict[int, int] = {}  # number -> size in bytes, ascending
        self._highest = 0  # highest segment number ever seen here
        self._runs: collections.deque[Run] = collections.deque()  # sealed, oldest first
        self._ready: list[Run] = []
        self._open: Run | None = None
        self._cursor = (0, 0)
        self._cursor_stream = ("", 0)
        self._cursor_dirty = False
        self._cursor_saved = 0.0
        self._head: tuple[Run, wire.pb.Batch] | None = None
        self._fd = -1
        self._active = 0
        self._unsynced: list[int] = []
        self._dirty = False
        self._dir_dirty = False
        self._io_lock = threading.Lock()
        self._lock_fd = take_lock(self.directory)
        try:
            self._recover()
            self._roll()
            self._release_segments()
        except BaseException:
            os.close(self._lock_fd)
            raise

    # -- start-up ------------------------------------------------------------------

    def _recover(self) -> None:
        found = recover(self.directory)
        self._cursor = found.cursor
        self._cursor_stream = found.cursor_stream
        self._segments = found.segments
        self._highest = found.highest
        self.corrupt_bytes = found.corrupt_bytes
        seqs: dict[str, int] = {}
        if self._cursor_stream[0] != "-":
            seqs[self._cursor_stream[0]] = self._cursor_stream[1]
        for f in found.fragments:
            run = self._extend(f)
            if run is not None:
                seqs[run.stream_id] = run.seq = seqs.get(run.stream_id, 0) + 1
                self._runs.append(run)
        if self._open is not None:
            seqs[self._open.stream_id] = self._open.seq = seqs.get(self._open.stream_id, 0) + 1
            self._runs.append(self._open)
            self._open = None
        self.recovered_batches = len(self._runs)
        self.recovered_samples = sum(r.samples for r in self._runs)
        if self._runs:
            age = (time.time_ns() - self._runs[0].written_ns) / 1e9
            log.info(
                "spool %s: %d batches (%d samples) of %d earlier streams left unacknowledged, oldest %.0f s old; "
                "replaying them first",
                self.directory,
                self.recovered_batches,
                self.recovered_samples,
                len({r.stream_id for r in self._runs}),
                age,
            )

    def _extend(self, record: Fragment) -> Run | None:
        """Add one record to the open run; the run it closed, if any."""
        self._open, closed = extend_run(self._open, record, self.max_batch_samples, self.run_span_ns)
        return closed

    # -- the sampler's side ----------------------------------------------------------

    def add_samples(self, samples: Sequence[wire.pb.Sample]) -> None:
        if isinstance(samples, EncodedSamples) and samples.total <= self.max_batch_samples:
            self._append(samples.data, samples.total, 0)  # the sampler's bytes, written as they are
            return
        for i in range(0, len(samples), self.max_batch_samples):
            fragment = wire.Batch()
            fragment.samples.extend(samples[i : i + self.max_batch_samples])
            self._append(fragment.SerializeToString(), len(fragment.samples), 0)

    def add_job_events(self, events: list[wire.pb.JobEvent]) -> None:
        if events:
            fragment = wire.Batch()
            fragment.job_events.extend(events)
            self._append(fragment.SerializeToString(), 0, len(events))

    def _append(self, body: bytes, samples: int, events: int) -> None:
        """Write one record: the stream's prefix then ``body``, serialized fragment fields (never raises:
        a failed write is counted and logged)."""
        written_ns = time.time_ns()
        record = encode_record(self._prefix + body, written_ns)
        with self._lock:
            if self._lock_fd < 0:  # closed: the directory may belong to another agent now
                self._count_drop(1, samples, f"spool {self.directory}: add after close", events)
                return
            try:
                if self._fd < 0 or self._segments[self._active] >= self.segment_bytes:
                    self._roll()
                offset = self._segments[self._active]
                write_record(self._fd, record, offset)
            except (OSError, SpoolError) as exc:
                self.write_errors += 1
                self.dropped_batches += 1
                self.dropped_samples += samples
                self.dropped_events += events
                if time.monotonic() - self._write_error_logged > 10.0:
                    self._write_error_logged = time.monotonic()
                    log.error(
                        "spool %s: write failed, samples dropped (%s); %d samples dropped so far",
                        self.directory,
                        getattr(exc, "strerror", None) or exc,
                        self.dropped_samples,
                    )
                return
            self._segments[self._active] = offset + len(record)
            self._dirty = True
            fragment = Fragment(self._active, offset, offset + len(record), written_ns, self.stream_id, samples, events)
            closed = self._extend(fragment)
            if closed is not None:
                self._ready.append(closed)
            self._enforce_size()

    def _roll(self) -> None:
        """Start a new segment (called with the lock held, or during start-up)."""
        # Never below a number seen before, nor the cursor's: numbers order the data.
        number = max([*self._segments, self._cursor[0], self._highest]) + 1
        self._highest = number
        fd = create_segment(self.directory / segment_name(number))
        if self._fd >= 0:
            self._unsynced.append(self._fd)
        if self._open is not None:
            self._ready.append(self._open)
            self._open = None
        self._fd, self._active = fd, number
        self._segments[number] = len(MAGIC)
        self._dirty = self._dir_dirty = True

    # -- bounds ----------------------------------------------------------------------

    def _enforce_size(self) -> None:
        """Drop the oldest segments while over ``max_bytes`` (the active one, the newest, stays)."""
        while len(self._segments) > 1 and sum(self._segments.values()) > self.max_bytes:
            oldest = next(iter(self._segments))
            self._drop_segment(oldest, f"spool {self.directory} full ({self.max_bytes / 2**20:.4g} MiB)")

    def _drop_segment(self, number: int, why: str) -> None:
        runs = [r for r in self._runs if r.segment == number]
        runs += [r for r in self._ready if r.segment == number]
        if self._open is not None and self._open.segment == number:
            runs.append(self._open)
            self._open = None
        self._runs = collections.deque(r for r in self._runs if r.segment != number)
        self._ready = [r for r in self._ready if r.segment != number]
        if runs:
            samples, events = sum(r.samples for r in runs), sum(r.events for r in runs)
            self._count_drop(len(runs), samples, f"{why}: dropped the oldest segment", events)
        self._advance((number, self._segments[number]), None)
        self._release_segments()

    def _enforce_age(self) -> None:
        limit = time.time_ns() - self.max_age_ns
        dropped: list[Run] = []
        while self._runs and self._runs[0].written_ns < limit:
            run = self._runs.popleft()
            dropped.append(run)
            self._advance((run.segment, run.end), None)
        if dropped:
            self._count_drop(
                len(dropped),
                sum(r.samples for r in dropped),
                f"spool {self.directory}: {len(dropped)} batches older than {self.max_age_ns / 1e9:.10g} s dropped",
                sum(r.events for r in dropped),
            )
            self._release_segments()

    def _advance(self, position: tuple[int, int], acked: tuple[str, int] | None) -> None:
        if position > self._cursor:
            self._cursor = position
            self._cursor_dirty = True
        if acked is not None:
            self._cursor_stream = acked

    def _release_segments(self) -> None:
        """Delete the segments before the oldest live run (acknowledged, dropped or empty; never the active one)."""
        if self._runs:
            first = self._runs[0].segment
        elif self._ready:
            first = self._ready[0].segment
        else:
            first = self._open.segment if self._open is not None else self._active
        for number in list(self._segments):
            if number >= first or number == self._active:
                break
            del self._segments[number]
            unlink(self.directory, self.directory / segment_name(number))
            self._dir_dirty = True

    # -- the uplink's side -----------------------------------------------------------

    def seal(self) -> int:
        with self._lock:
            if self._open is not None:
                self._ready.append(self._open)
                self._open = None
            for run in self._ready:
                if run.stream_id == self.stream_id:
                    self._seq += 1
                    run.seq = self._seq
                self._runs.append(run)
            sealed = len(self._ready)
            self._ready = []
            self._enforce_age()
            fds, self._unsynced = self._unsynced, []
            if self._dirty and self._fd >= 0:
                fds.append(os.dup(self._fd))
                self._dirty = False
            sync_dir, self._dir_dirty = self._dir_dirty, False
        self._sync(fds, sync_dir)
        return sealed

    def _sync(self, fds: list[int], sync_dir: bool) -> None:
        """fsync (outside the lock: the sampler never waits for the disk), then close."""
        with self._io_lock:
            sync_files(self.directory, fds, sync_dir)
            self._save_cursor(force=False)

    def _save_cursor(self, force: bool) -> None:
        """Rewrite the cursor file (called with the io lock held)."""
        with self._lock:
            if not self._cursor_dirty or (not force and time.monotonic() - self._cursor_saved < CURSOR_EVERY_S):
                return
            segment, offset = self._cursor
            stream, seq = self._cursor_stream
            self._cursor_dirty = False
            self._cursor_saved = time.monotonic()
        save_cursor(self.directory, segment, offset, stream, seq)

    def peek(self) -> wire.pb.Batch | None:
        with self._lock:
            while self._runs:
                run = self._runs[0]
                if self._head is not None and self._head[0] is run:
                    batch = self._head[1]
                else:
                    loaded = self._load(run)
                    if loaded is None:
                        self._runs.popleft()
                        self._count_drop(
                            1, run.samples, f"spool {self.directory}: unreadable batch {run.seq}", run.events
                        )
                        self._advance((run.segment, run.end), None)
                        self._release_segments()
                        continue
                    batch = loaded
                    self._head = (run, batch)
                batch.sent_ns = time.time_ns()
                return batch
            return None

    def _load(self, run: Run) -> wire.pb.Batch | None:
        """The batch of ``run``, read back from its segment (CRC checked again)."""
        batch = read_batch(self.directory / segment_name(run.segment), run.start, run.end, run.records)
        if batch is not None:
            batch.seq = run.seq
        return batch

    def ack(self, seq: int, stream_id: str | None = None) -> None:
        with self._lock:
            while self._runs and self._runs[0].seq <= seq:
                run = self._runs[0]
                if stream_id is not None and run.stream_id != stream_id:
                    break
                self._runs.popleft()
                self._head = None
                self.acked_batches += 1
                self.acked_samples += run.samples
                self._advance((run.segment, run.end), (run.stream_id, run.seq))
            self._release_segments()
            dirty = self._cursor_dirty
        if dirty:
            with self._io_lock:
                self._save_cursor(force=False)

    def split_head(self) -> bool:
        with self._lock:
            if not self._runs or self._runs[0].records < 2:
                return False
            head = self._runs[0]
            path = self.directory / segment_name(head.segment)
            try:
                records, _end = scan(read_range(path, head.start, head.end), 0)
            except OSError:
                return False
            second = split_run(head, records)
            for run in self._runs:
                if run.stream_id == head.stream_id and run.seq > head.seq:
                    run.seq += 1
            if head.stream_id == self.stream_id:
                self._seq += 1
            self._runs.insert(1, second)
            self._head = None
            self.max_batch_samples = max(1, min(self.max_batch_samples, head.samples))
            log.warning("batch %d was too large for the collector: split in two", head.seq)
            return True

    def backlog(self) -> int:
        with self._lock:
            return len(self._runs) + len(self._ready) + (1 if self._open is not None else 0)

    def size_bytes(self) -> int:
        """Bytes in segment files now."""
        with self._lock:
            return sum(self._segments.values())

    def close(self) -> None:
        """Make everything durable, save the cursor, release the directory."""
        with self._lock:
            fds, self._unsynced = self._unsynced, []
            if self._fd >= 0:
                fds.append(self._fd)
                self._fd = -1
        self._sync(fds, True)
        with self._io_lock:
            self._save_cursor(force=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
