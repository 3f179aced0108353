"""Batches waiting for the collector's acknowledgement.

The sampler appends samples (cheap, never blocks on I/O); the uplink seals them into
numbered batches and removes a batch only when the collector acknowledged it. When
``max_batches`` unacknowledged batches are held, the **oldest** is dropped to make room
(the newest data is the most useful for live dashboards; the drop is counted and
logged, never silent).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid

from wattline import wire

log = logging.getLogger(__name__)


class Spool:
    """In-memory spool of one agent stream."""

    def __init__(self, host: wire.pb.Host, *, max_batch_samples: int = 5000, max_batches: int = 3600) -> None:
        self.host = host
        self.stream_id = uuid.uuid4().hex
        self.max_batch_samples = max_batch_samples
        self.max_batches = max_batches
        self._pending_samples: list[wire.pb.Sample] = []
        self._pending_events: list[wire.pb.JobEvent] = []
        self._sealed: collections.deque[wire.pb.Batch] = collections.deque()
        self._seq = 0
        self._lock = threading.Lock()
        self.dropped_batches = 0
        self.dropped_samples = 0
        self.acked_batches = 0
        self.acked_samples = 0

    def add_samples(self, samples: list[wire.pb.Sample]) -> None:
        """Queue samples for the next batch (called by the sampler)."""
        with self._lock:
            self._pending_samples.extend(samples)

    def add_job_events(self, events: list[wire.pb.JobEvent]) -> None:
        """Queue job events for the next batch."""
        with self._lock:
            self._pending_events.extend(events)

    def seal(self) -> int:
        """Turn pending samples/events into numbered batches; returns how many were sealed."""
        with self._lock:
            sealed = 0
            while self._pending_samples or self._pending_events:
                chunk = self._pending_samples[: self.max_batch_samples]
                del self._pending_samples[: self.max_batch_samples]
                events, self._pending_events = self._pending_events, []
                self._seq += 1
                batch = wire.Batch(stream_id=self.stream_id, seq=self._seq, samples=chunk, job_events=events)
                batch.host.CopyFrom(self.host)
                self._sealed.append(batch)
                sealed += 1
            while len(self._sealed) > self.max_batches:
                old = self._sealed.popleft()
                self.dropped_batches += 1
                self.dropped_samples += len(old.samples)
                log.warning(
                    "spool full (%d batches): dropped batch %d with %d samples (%d batches dropped so far)",
                    self.max_batches,
                    old.seq,
                    len(old.samples),
                    self.dropped_batches,
                )
            return sealed

    def peek(self) -> wire.pb.Batch | None:
        """The oldest unacknowledged batch, stamped with the current send time."""
        with self._lock:
            if not self._sealed:
                return None
            batch = self._sealed[0]
            batch.sent_ns = time.time_ns()
            return batch

    def ack(self, seq: int) -> None:
        """Forget batch ``seq`` (and anything older) once the collector stored it."""
        with self._lock:
            while self._sealed and self._sealed[0].seq <= seq:
                done = self._sealed.popleft()
                self.acked_batches += 1
                self.acked_samples += len(done.samples)

    def backlog(self) -> int:
        """Unacknowledged batches (sealed) plus one if samples are pending."""
        with self._lock:
            return len(self._sealed) + (1 if self._pending_samples or self._pending_events else 0)
