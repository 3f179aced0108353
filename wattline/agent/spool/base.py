"""Batches waiting for the collector's acknowledgement: the :class:`Spool` interface.

The sampler appends samples (cheap, never blocks on the network); the uplink seals them
into numbered batches and removes a batch only when a collector acknowledged it, always
the oldest first (delivery is in order).

Two implementations (the agent, the uplink and the exporter do not know which one they have):

- :class:`~wattline.agent.spool.memory.MemorySpool`: in memory, bounded by a number of
  batches. Lost when the agent process dies.
- :class:`~wattline.agent.spool.disk.DiskSpool`: append-only segment files
  (:mod:`wattline.agent.spool.format`) that survive ``kill -9`` and power cuts, bounded by
  size and age (``agent.spool_dir``).

At a bound the **oldest** data is dropped, counted (``dropped_batches``,
``dropped_samples``, exported to Prometheus) and logged: never silent.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from typing import Protocol

from wattline import wire

log = logging.getLogger(__name__)


class Spool(Protocol):
    """One agent stream's batches from the sampler to the collector's acknowledgement."""

    #: Where batches are kept, for logs ("memory" or the spool directory).
    where: str
    host: wire.pb.Host
    stream_id: str
    #: Samples per batch at most (lowered when a collector found a batch too large).
    max_batch_samples: int
    dropped_batches: int
    dropped_samples: int
    dropped_events: int
    acked_batches: int
    acked_samples: int

    def add_samples(self, samples: Sequence[wire.pb.Sample]) -> None:
        """Queue samples for the next batch (the sampler's call: never blocks on the network)."""

    def add_job_events(self, events: list[wire.pb.JobEvent]) -> None:
        """Queue job events for the next batch."""

    def seal(self) -> int:
        """Turn what is queued into numbered batches; returns how many were sealed."""

    def peek(self) -> wire.pb.Batch | None:
        """The oldest unacknowledged batch, stamped with the current send time."""

    def ack(self, seq: int, stream_id: str | None = None) -> None:
        """Forget batch ``seq`` (and anything older) once the collector stored it.

        With ``stream_id``, only batches of that stream are acknowledged (an
        acknowledgement for a batch dropped meanwhile changes nothing)."""

    def split_head(self) -> bool:
        """Cut the oldest batch in two (a collector found it too large); False if it cannot be cut.

        The batches behind it are renumbered: none of them has been sent yet, since delivery
        is strictly in order."""

    def backlog(self) -> int:
        """Unacknowledged batches, plus one if samples or events are queued."""

    def close(self) -> None:
        """Release what the spool holds (files); what is unacknowledged stays where it is kept."""


class SpoolBase:
    """What every spool keeps: its stream's identity, the sequence, the counters, the drop log."""

    where = "memory"

    def __init__(self, host: wire.pb.Host, max_batch_samples: int) -> None:
        self.host = host
        self.stream_id = uuid.uuid4().hex
        self.max_batch_samples = max_batch_samples
        self._seq = 0
        self._lock = threading.Lock()
        self.dropped_batches = 0
        self.dropped_samples = 0
        self.dropped_events = 0
        self.acked_batches = 0
        self.acked_samples = 0

    def _count_drop(self, batches: int, samples: int, why: str, events: int = 0) -> None:
        """Count and log a drop (called with the lock held), naming the job events it held: the
        outbox holds nothing else, and "0 samples" alone would say nothing was lost."""
        self.dropped_batches += batches
        self.dropped_samples += samples
        self.dropped_events += events
        also, so_far = (f" and {events} job events", f" and {self.dropped_events} job events") if events else ("", "")
        log.warning(
            "%s with %d samples%s (%d batches, %d samples%s dropped so far)",
            why,
            samples,
            also,
            self.dropped_batches,
            self.dropped_samples,
            so_far,
        )
