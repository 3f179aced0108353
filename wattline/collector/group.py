"""Group commit: the batches waiting for storage are written together, one commit per group.

Every Push call waits until its batch is committed (the Ack follows the write), so a
collector serving many agents spends its time in commits: one SQLite transaction
(fsync) or one InfluxDB request per batch caps it at a few hundred batches a second
whatever the batch size. Here the calls that arrive while a commit is running queue up;
the next free writer takes all of them (up to ``max_group_points`` points) and hands the
store one :meth:`Store.write_group`. Under light load a group is one batch and nothing
waits; under heavy load the commit rate stays the same and each commit carries more.

No thread of its own: the waiting calls' own threads take turns as writers (leader and
followers). At most ``writers`` groups are written at once. Each waiting call sleeps on its
own condition and is woken only when its batch is done or it should lead the next group
(never every waiting call after each commit: that is O(waiting calls) thread wake-ups per
commit, each one a GIL hand-off). A batch that no writer has taken within ``busy_wait_s``
leaves the queue and its call gets :class:`Busy` (the agent backs off), so the wait is
bounded; memory is bounded by the calls gRPC admits.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wattline import wire
from wattline.collector.stores.base import Store, StoreUnavailable, WriteResult


class Busy(Exception):
    """No writer took the batch within the wait; nothing was written."""


@dataclass(slots=True, eq=False)
class _Pending:
    batch: wire.pb.Batch
    points: int
    #: Its call's own wake-up, on the committer's lock.
    wake: threading.Condition
    taken: bool = False
    done: bool = False
    result: WriteResult | None = None
    error: StoreUnavailable | None = None


class GroupCommitter:
    """Writes batches to ``store`` in groups; :meth:`write` returns once its batch is committed."""

    def __init__(
        self,
        store: Store,
        *,
        writers: int,
        max_group_points: int = 50_000,
        busy_wait_s: float = 1.0,
        on_commit: Callable[[int, float], None] | None = None,
    ) -> None:
        if writers < 1:
            raise ValueError("writers must be at least 1")
        self.store = store
        self.writers = writers
        self.max_group_points = max_group_points
        self.busy_wait_s = busy_wait_s
        #: Called after each successful commit with (batches, seconds).
        self.on_commit = on_commit
        self._lock = threading.Lock()
        self._queue: deque[_Pending] = deque()
        self._active = 0

    def write(self, batch: wire.pb.Batch) -> WriteResult:
        """Commit ``batch`` (with whatever else is waiting); raises Busy or StoreUnavailable."""
        item = _Pending(batch, len(batch.samples) + len(batch.job_events), threading.Condition(self._lock))
        deadline = time.monotonic() + self.busy_wait_s
        with self._lock:
            self._queue.append(item)
        while True:
            group: list[_Pending] = []
            with self._lock:
                while not item.done:
                    if self._queue and self._active < self.writers:
                        group = self._take()
                        self._active += 1
                        break
                    if item.taken:
                        item.wake.wait()
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self._queue.remove(item)
                        raise Busy(f"no writer free within {self.busy_wait_s:g} s")
                    item.wake.wait(remaining)
            if not group:
                if item.error is not None:
                    raise item.error
                assert item.result is not None
                return item.result
            try:
                self._commit(group)
            finally:
                with self._lock:
                    self._active -= 1
                    for pending in group:
                        pending.done = True
                        pending.wake.notify()
                    if self._queue:  # a writer is free: the oldest waiting call leads next
                        self._queue[0].wake.notify()

    def _take(self) -> list[_Pending]:
        """The oldest waiting batches, at least one, up to max_group_points points."""
        group = [self._queue.popleft()]
        points = group[0].points
        while self._queue and points + self._queue[0].points <= self.max_group_points:
            pending = self._queue.popleft()
            points += pending.points
            group.append(pending)
        for pending in group:
            pending.taken = True
        return group

    def _commit(self, group: Sequence[_Pending]) -> None:
        started = time.perf_counter()
        try:
            results = self.store.write_group([p.batch for p in group])
            if len(results) != len(group):
                raise TypeError(f"write_group returned {len(results)} results for {len(group)} batches")
        except StoreUnavailable as exc:
            for pending in group:
                pending.error = exc
            return
        except Exception as exc:  # a store bug: fail the group's calls, never leave them waiting
            error = StoreUnavailable(f"{type(self.store).__name__}: {type(exc).__name__}: {exc}")
            for pending in group:
                pending.error = error
            raise
        for pending, result in zip(group, results, strict=True):
            pending.result = result
        if self.on_commit is not None:
            self.on_commit(len(group), time.perf_counter() - started)
