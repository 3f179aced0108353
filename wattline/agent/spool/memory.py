"""The in-memory spool: batches lost when the agent process dies.

When the bound is reached (``max_batches`` unacknowledged batches), the **oldest** batch is
dropped to make room: the newest data is the most useful for live dashboards and alerting,
and an outage long enough to fill the spool has usually been noticed by then. Every drop is
counted (``dropped_batches``, ``dropped_samples``, exported to Prometheus) and logged,
never silent.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence

from wattline import wire
from wattline.agent.encoding import encode
from wattline.agent.spool.base import SpoolBase

log = logging.getLogger(__name__)


class MemorySpool(SpoolBase):
    """In-memory spool of one agent stream: lost when the process dies; bounded by ``max_batches``."""

    where = "memory"

    def __init__(self, host: wire.pb.Host, *, max_batch_samples: int = 5000, max_batches: int = 3600) -> None:
        super().__init__(host, max_batch_samples)
        self.max_batches = max_batches
        #: Serialized ``Batch.samples`` entries, one bytes per add (a sampler tick), and their count.
        self._pending_samples: list[bytes] = []
        self._pending_count = 0
        self._pending_events: list[wire.pb.JobEvent] = []
        self._sealed: collections.deque[wire.pb.Batch] = collections.deque()

    def add_samples(self, samples: Sequence[wire.pb.Sample]) -> None:
        """Queue samples for the next batch (called by the sampler; its encoded samples are kept as bytes)."""
        data, count = encode(samples)
        with self._lock:
            self._pending_samples.append(data)
            self._pending_count += count

    def add_job_events(self, events: list[wire.pb.JobEvent]) -> None:
        """Queue job events for the next batch."""
        with self._lock:
            self._pending_events.extend(events)

    def seal(self) -> int:
        """Turn pending samples/events into numbered batches; returns how many were sealed."""
        with self._lock:
            sealed = 0
            data, count = b"".join(self._pending_samples), self._pending_count
            self._pending_samples, self._pending_count = [], 0
            events, self._pending_events = self._pending_events, []
            if count <= self.max_batch_samples:
                if count or events:
                    # The usual case: one batch, parsed once from the sampler's bytes.
                    self._sealed.append(self._batch(wire.Batch.FromString(data), events))
                    sealed = 1
            else:
                samples = wire.Batch.FromString(data).samples
                for i in range(0, count, self.max_batch_samples):
                    batch = wire.Batch(samples=samples[i : i + self.max_batch_samples])
                    self._sealed.append(self._batch(batch, events if i == 0 else []))
                    sealed += 1
            while len(self._sealed) > self.max_batches:
                old = self._sealed.popleft()
                self._count_drop(
                    1,
                    len(old.samples),
                    f"spool full ({self.max_batches} batches): dropped batch {old.seq}",
                    len(old.job_events),
                )
            return sealed

    def _batch(self, batch: wire.pb.Batch, events: list[wire.pb.JobEvent]) -> wire.pb.Batch:
        """Number ``batch`` and give it the stream's identity (called with the lock held)."""
        self._seq += 1
        batch.stream_id = self.stream_id
        batch.seq = self._seq
        batch.host.CopyFrom(self.host)
        if events:
            batch.job_events.extend(events)
        return batch

    def peek(self) -> wire.pb.Batch | None:
        """The oldest unacknowledged batch, stamped with the current send time."""
        with self._lock:
            if not self._sealed:
                return None
            batch = self._sealed[0]
            batch.sent_ns = time.time_ns()
            return batch

    def ack(self, seq: int, stream_id: str | None = None) -> None:
        """Forget batch ``seq`` (and anything older) once the collector stored it.

        With ``stream_id``, only batches of that stream are acknowledged (an
        acknowledgement for a batch dropped meanwhile changes nothing).
        """
        with self._lock:
            while self._sealed and self._sealed[0].seq <= seq:
                if stream_id is not None and self._sealed[0].stream_id != stream_id:
                    break
                done = self._sealed.popleft()
                self.acked_batches += 1
                self.acked_samples += len(done.samples)

    def split_head(self) -> bool:
        """Cut the oldest batch in two (a collector found it too large); False if it cannot be cut.

        The batches behind it are renumbered; none of them has been sent yet, since
        delivery is strictly in order.
        """
        with self._lock:
            if not self._sealed:
                return False
            head = self._sealed[0]
            if len(head.samples) < 2:
                return False
            half = len(head.samples) // 2
            second = wire.Batch(stream_id=head.stream_id, seq=head.seq + 1, samples=head.samples[half:])
            second.host.CopyFrom(head.host)
            del head.samples[half:]
            for batch in self._sealed:
                if batch is not head:
                    batch.seq += 1
            self._sealed.insert(1, second)
            self._seq += 1
            self.max_batch_samples = max(1, min(self.max_batch_samples, half))
            log.warning(
                "batch %d was too large for the collector: split in two; batches now hold at most %d samples",
                head.seq,
                self.max_batch_samples,
            )
            return True

    def backlog(self) -> int:
        """Unacknowledged batches (sealed) plus one if samples are pending."""
        with self._lock:
            return len(self._sealed) + (1 if self._pending_count or self._pending_events else 0)

    def close(self) -> None:
        """Nothing to release in memory."""
