"""Dynamic batching as inference servers do it: the requests that arrive while the model is
busy, or within ``max_wait_s`` of the first one queued, run together as one batch of at most
``max_batch`` documents. No torch here: the batch is run by a callable.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Pending:
    documents: int
    arrived: float
    done: threading.Event = field(default_factory=threading.Event)
    batch: int = 0
    error: Exception | None = None


class Batcher:
    """One worker thread runs ``run(documents)`` for each batch it forms from :meth:`submit` calls.

    A batch is taken when the queue holds ``max_batch`` documents or the oldest request has
    waited ``max_wait_s``; requests keep their order and are never split across batches.
    ``worker_context``: entered once by the worker thread (torch's inference mode is per thread).
    """

    def __init__(
        self,
        run: Callable[[int], object],
        max_batch: int,
        max_wait_s: float,
        worker_context: Callable[[], Any] | None = None,
    ) -> None:
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError("max_batch must be >= 1 and max_wait_s >= 0")
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self._run, self._context = run, worker_context or contextlib.nullcontext
        self._cond = threading.Condition()
        self._queue: deque[_Pending] = deque()
        self._queued = 0  # documents in the queue
        self._flushing = self._closed = False
        self.batches = 0
        self._thread = threading.Thread(target=self._loop, name="batcher", daemon=True)
        self._thread.start()

    def submit(self, documents: int) -> int:
        """Run ``documents`` in the next batch with room and wait for it: the batch's size.
        Raises what running the batch raised, or ValueError for a count outside 1..max_batch."""
        if not 1 <= documents <= self.max_batch:
            raise ValueError(f"documents: {documents} is outside 1..{self.max_batch}")
        pending = _Pending(documents, time.monotonic())
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._queue.append(pending)
            self._queued += documents
            self._cond.notify_all()
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.batch

    @property
    def queued(self) -> int:
        """Documents waiting for a batch."""
        with self._cond:
            return self._queued

    def flush(self) -> None:
        """Stop waiting for batches to fill (no more requests will come): what is queued runs now."""
        with self._cond:
            self._flushing = True
            self._cond.notify_all()

    def close(self) -> None:
        """Run what is queued, then stop the worker; :meth:`submit` refuses from now on."""
        with self._cond:
            self._flushing = self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _take(self) -> list[_Pending] | None:
        """The next batch, once it is full or its oldest request has waited long enough; None
        when closed and empty."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            deadline = self._queue[0].arrived + self.max_wait_s
            while self._queued < self.max_batch and not self._flushing:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch: list[_Pending] = []
            total = 0
            while self._queue and total + self._queue[0].documents <= self.max_batch:
                pending = self._queue.popleft()
                batch.append(pending)
                total += pending.documents
            self._queued -= total
            return batch

    def _loop(self) -> None:
        with self._context():
            while (batch := self._take()) is not None:
                total = sum(p.documents for p in batch)
                error: Exception | None = None
                try:
                    self._run(total)
                except Exception as exc:  # every request of the batch gets it
                    error = exc
                self.batches += 1
                for pending in batch:
                    pending.batch, pending.error = total, error
                    pending.done.set()
