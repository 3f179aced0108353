"""Group commit: the batches waiting for storage are written together, one commit per group.

Every Push is answered only after its batch is committed (the Ack follows the write), so a
collector serving many agents spends its time in commits: one SQLite transaction (fsync)
or one InfluxDB request per batch caps it at a few hundred batches a second whatever the
batch size. Here a call hands its batch to the committer and waits on a future; up to
``writers`` writer threads each take all the batches waiting (up to ``max_group_points``
points) and hand the store one :meth:`Store.write_group`. Under light load a group is one
batch and nothing waits; under load (the last group, or the queue, held more than one
batch) of small batches a writer lets the group gather for ``linger_s`` (or up to
``linger_points`` points) first, so each commit carries more (one InfluxDB request or
SQLite transaction for many agents' batches: what costs the store's CPU is the number of
commits more than the number of points). Large batches (on average a tenth of
``linger_points`` or more: a few clients sending as fast as they are answered) already
amortize their commit and are not held back. Writers start as the
load needs them: another one only when none is free and a full group (``linger_points``)
waits, or the oldest waiting batch has waited twice the linger.

A waiting call holds no thread: the gRPC handlers await an asyncio future on the server's
event loop (:meth:`GroupCommitter.write_async`), and a writer settles all of a group's waiting
calls with one wake-up of that loop; :meth:`GroupCommitter.write` blocks for callers that
have a thread to spare. A batch that no writer has taken within ``busy_wait_s`` is
withdrawn (its future cancelled, so no writer takes it later) and its call gets
:class:`Busy` (the agent backs off), so the wait is bounded; memory is bounded by the
calls gRPC admits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from time import monotonic, perf_counter

from wattline import wire
from wattline.stores.base import Store, StoreUnavailable, WriteResult

log = logging.getLogger(__name__)


class Busy(Exception):
    """No writer took the batch within the wait; nothing was written."""


#: An asyncio caller's future, and the loop it waits on.
_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[WriteResult]"]


@dataclass(slots=True, eq=False)
class _Pending:
    batch: wire.pb.Batch
    points: int
    #: Taken by a writer (running) or withdrawn (cancelled); its result for blocking callers.
    future: Future[WriteResult]
    queued: float
    waiter: _Waiter | None = None


def _settle(outcomes: list[tuple[asyncio.Future[WriteResult], WriteResult | BaseException]]) -> None:
    """Give each waiting call its outcome (on the loop's thread; a call gone since is skipped)."""
    for waiter, outcome in outcomes:
        if waiter.done():
            continue
        if isinstance(outcome, BaseException):
            waiter.set_exception(outcome)
        else:
            waiter.set_result(outcome)


class GroupCommitter:
    """Writes batches to ``store`` in groups, on up to ``writers`` threads of its own."""

    def __init__(
        self,
        store: Store,
        *,
        writers: int,
        max_group_points: int = 50_000,
        busy_wait_s: float = 1.0,
        linger_s: float = 0.0,
        linger_points: int = 5000,
        on_commit: Callable[[int, float], None] | None = None,
    ) -> None:
        if writers < 1:
            raise ValueError("writers must be at least 1")
        self.store = store
        self.writers = writers
        self.max_group_points = max_group_points
        self.busy_wait_s = busy_wait_s
        #: How long a writer lets a group gather before committing it (unless it is full).
        self.linger_s = linger_s
        #: A group this large commits at once (InfluxDB's advice: 5,000 points a write).
        self.linger_points = min(linger_points, max_group_points)
        #: Called after each successful commit with (batches, seconds), on a writer thread.
        self.on_commit = on_commit
        self._ready = threading.Condition(threading.Lock())
        self._queue: deque[_Pending] = deque()
        self._threads: list[threading.Thread] = []
        self._queued_points = 0  #: points in the queue (withdrawn batches until a writer drops them)
        self._idle = 0
        self._last_group = 0
        self._closed = False

    def submit(self, batch: wire.pb.Batch, waiter: _Waiter | None = None) -> Future[WriteResult]:
        """Queue ``batch``; once committed, its future (or, if given, ``waiter``'s asyncio
        future) gets the result, or StoreUnavailable."""
        item = _Pending(batch, len(batch.samples) + len(batch.job_events), Future(), monotonic(), waiter)
        with self._ready:
            if self._closed:
                raise StoreUnavailable("the collector is stopping")
            self._queue.append(item)
            self._queued_points += item.points
            if self._idle:
                self._ready.notify()
            else:
                if self._queued_points >= self.linger_points:
                    self._ready.notify()  # a lingering writer: its group is full
                self._start_writer_if_behind()
        return item.future

    def queued(self) -> int:
        """Batches waiting for a writer (for tests: a state to wait for, not a guess of time)."""
        with self._ready:
            return len(self._queue)

    def _start_writer_if_behind(self) -> None:
        """Start another writer (lock held) if there may be one more and :meth:`_behind`."""
        if len(self._threads) < self.writers and self._queue and self._behind():
            thread = threading.Thread(target=self._run, name=f"commit-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def write(self, batch: wire.pb.Batch) -> WriteResult:
        """Commit ``batch`` (with whatever else is waiting), blocking; raises Busy or StoreUnavailable."""
        future = self.submit(batch)
        try:
            return future.result(timeout=self.busy_wait_s)
        except TimeoutError:
            self._withdraw(future)
            return future.result()

    async def write_async(self, batch: wire.pb.Batch) -> WriteResult:
        """:meth:`write` for a coroutine: the call waits without holding a thread."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[WriteResult] = loop.create_future()
        future = self.submit(batch, (loop, waiter))
        timer = loop.call_later(self.busy_wait_s, self._expire, future, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()

    def _expire(self, future: Future[WriteResult], waiter: asyncio.Future[WriteResult]) -> None:
        """The wait is over: a batch no writer has taken is withdrawn and its call gets Busy."""
        if future.cancel() and not waiter.done():
            waiter.set_exception(self._busy())

    def _withdraw(self, future: Future[WriteResult]) -> None:
        """Raise Busy if no writer has taken the batch yet (it never will now)."""
        if future.cancel():
            raise self._busy() from None

    def _busy(self) -> Busy:
        """What a call gets when no writer took its batch within ``busy_wait_s``."""
        return Busy(f"no writer free within {self.busy_wait_s:g} s")

    def close(self) -> None:
        """Commit what is queued, then stop the writer threads."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
            threads = list(self._threads)
        for thread in threads:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._idle += 1
                    self._ready.wait()
                    self._idle -= 1
                if self._should_linger():
                    self._linger()
                group = self._take()
                self._last_group = len(group) or self._last_group
                self._start_writer_if_behind()  # what is left may wait for no new call to notice it
                if not group and self._closed:
                    return
            if group:
                self._commit(group)

    def _should_linger(self) -> bool:
        """Under load (the queue or the last group held more than one batch) and the waiting
        batches are small (on average under a tenth of linger_points points)."""
        waiting = len(self._queue)
        return (
            waiting > 0
            and self.linger_s > 0
            and (waiting > 1 or self._last_group > 1)
            and self._queued_points * 10 < self.linger_points * waiting
        )

    def _behind(self) -> bool:
        """Whether another writer should start: none yet, a full group (linger_points) is
        waiting, or the oldest waiting batch has waited twice the linger (the writers are
        busy committing, not gathering)."""
        return (
            not self._threads
            or monotonic() - self._queue[0].queued > 2 * self.linger_s
            or self._queued_points >= self.linger_points
        )

    def _linger(self) -> None:
        """Wait (lock held, released while waiting) until the oldest batch has waited linger_s
        or the queue holds linger_points points."""
        deadline = self._queue[0].queued + self.linger_s
        while not self._closed and (left := deadline - monotonic()) > 0:
            if self._queued_points >= self.linger_points:
                return
            self._ready.wait(left)

    def _take(self) -> list[_Pending]:
        """The oldest batches still waiting (not withdrawn), up to max_group_points points."""
        group: list[_Pending] = []
        points = 0
        while self._queue:
            pending = self._queue[0]
            if group and points + pending.points > self.max_group_points:
                break
            self._queue.popleft()
            self._queued_points -= pending.points
            if pending.future.set_running_or_notify_cancel():
                group.append(pending)
                points += pending.points
        return group

    def _commit(self, group: Sequence[_Pending]) -> None:
        started = perf_counter()
        try:
            results = self.store.write_group([p.batch for p in group])
            if len(results) != len(group):
                raise TypeError(f"write_group returned {len(results)} results for {len(group)} batches")
        except StoreUnavailable as exc:
            self._finish(group, [exc] * len(group))
            return
        except Exception as exc:  # a store bug: fail the group's calls, never leave them waiting
            log.exception("%s failed a commit of %d batches", type(self.store).__name__, len(group))
            error = StoreUnavailable(f"{type(self.store).__name__}: {type(exc).__name__}: {exc}")
            self._finish(group, [error] * len(group))
            return
        self._finish(group, results)
        if self.on_commit is not None:
            self.on_commit(len(group), perf_counter() - started)

    @staticmethod
    def _finish(group: Sequence[_Pending], outcomes: Sequence[WriteResult | BaseException]) -> None:
        """Hand each batch's call its outcome: blocking callers through their future, asyncio
        callers with one wake-up of each loop for the whole group."""
        by_loop: defaultdict[
            asyncio.AbstractEventLoop, list[tuple[asyncio.Future[WriteResult], WriteResult | BaseException]]
        ]
        by_loop = defaultdict(list)
        for pending, outcome in zip(group, outcomes, strict=True):
            if pending.waiter is not None:
                loop, waiter = pending.waiter
                by_loop[loop].append((waiter, outcome))
            elif isinstance(outcome, BaseException):
                pending.future.set_exception(outcome)
            else:
                pending.future.set_result(outcome)
        for loop, outcomes_of_loop in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_settle, outcomes_of_loop)
