"""Group commit: waiting batches share one commit, each call still gets its own answer."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from servers import T0, Influxd, make_batch
from store_rows import energy_rows
from waits import wait_until

from wattline import wire
from wattline.collector import group
from wattline.collector.group import Busy, GroupCommitter
from wattline.collector.server import CollectorServer
from wattline.stores.base import Store, StoreUnavailable, WriteResult
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.sqlite.store import SqliteStore


class Gated(Store):
    """A real store whose commits wait for ``gate`` and are recorded (group sizes)."""

    kind = "gated"

    def __init__(self, inner: Store, max_concurrent_writes: int = 1) -> None:
        self.inner = inner
        self.max_concurrent_writes = max_concurrent_writes
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.groups: list[int] = []
        self.fail: StoreUnavailable | None = None

    def write(self, batch: wire.pb.Batch) -> WriteResult:
        return self.write_group([batch])[0]

    def write_group(self, batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
        self.entered.set()
        assert self.gate.wait(10)
        self.groups.append(len(batches))
        if self.fail is not None:
            raise self.fail
        return self.inner.write_group(batches)


def batch(i: int, samples: int = 3) -> wire.pb.Batch:
    return make_batch(host=f"node-{i}", samples=samples, stream=f"s-{i}", seq=1)


def rows(store: SqliteStore) -> int:
    return len(energy_rows(store))


class Caller:
    """Calls a committer as blocking callers do (``write`` on a thread of their own) or as
    the gRPC handlers do (``write_async`` on an event loop's thread)."""

    def __init__(self, committer: GroupCommitter, pool: ThreadPoolExecutor, loop: asyncio.AbstractEventLoop | None):
        self.committer, self.pool, self.loop = committer, pool, loop

    def start(self, b: wire.pb.Batch) -> Future[WriteResult]:
        if self.loop is None:
            return self.pool.submit(self.committer.write, b)
        return asyncio.run_coroutine_threadsafe(self.committer.write_async(b), self.loop)

    def write(self, b: wire.pb.Batch) -> WriteResult:
        return self.start(b).result(30)


@contextlib.contextmanager
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running on a thread of its own (as the collector's server loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(params=["blocking", "asyncio"])
def calls(request: pytest.FixtureRequest) -> Iterator[Callable[[GroupCommitter], Caller]]:
    with ThreadPoolExecutor(max_workers=32) as pool, contextlib.ExitStack() as stack:
        loop = stack.enter_context(loop_thread()) if request.param == "asyncio" else None
        yield lambda committer: Caller(committer, pool, loop)


def test_waiting_batches_are_committed_together_and_each_call_gets_its_own_result(
    tmp_path: Path, calls: Callable[[GroupCommitter], Caller]
) -> None:
    sqlite = SqliteStore(tmp_path / "w.db")
    store = Gated(sqlite)
    committer = GroupCommitter(store, writers=1, busy_wait_s=30)
    call = calls(committer)
    first = call.start(batch(0, samples=1))
    assert store.entered.wait(5)  # the first commit is running (and held)
    rest = [call.start(batch(i, samples=i)) for i in range(1, 20)]
    wait_until(lambda: committer.queued() == 19, "19 batches queued behind it")
    store.gate.set()
    results = [first.result(10)] + [f.result(10) for f in rest]
    assert [r.written for r in results] == [1, *range(1, 20)]
    assert store.groups == [1, 19]  # one commit for the 19 that waited
    assert rows(sqlite) == sum(range(1, 20)) + 1
    sqlite.close()


def test_group_size_is_bounded_by_points(tmp_path: Path) -> None:
    sqlite = SqliteStore(tmp_path / "w.db")
    store = Gated(sqlite)
    committer = GroupCommitter(store, writers=1, max_group_points=10, busy_wait_s=30)
    with ThreadPoolExecutor(max_workers=8) as pool:
        first = pool.submit(committer.write, batch(0))
        assert store.entered.wait(5)
        rest = [pool.submit(committer.write, batch(i, samples=4)) for i in range(1, 7)]
        wait_until(lambda: committer.queued() == 6, "6 batches queued behind it")
        store.gate.set()
        assert all(f.result(10).written == 4 for f in rest) and first.result(10).written == 3
    assert store.groups[0] == 1 and store.groups[1:] == [2, 2, 2]  # 4 + 4 points fit in 10, 12 do not
    sqlite.close()


def test_a_batch_no_writer_takes_in_time_is_busy_and_not_written(
    tmp_path: Path, calls: Callable[[GroupCommitter], Caller]
) -> None:
    sqlite = SqliteStore(tmp_path / "w.db")
    store = Gated(sqlite)
    committer = GroupCommitter(store, writers=1, busy_wait_s=0.2)
    call = calls(committer)
    first = call.start(batch(0))
    assert store.entered.wait(5)
    with pytest.raises(Busy):
        call.write(batch(1))
    store.gate.set()
    assert first.result(10).written == 3
    assert store.groups == [1] and rows(sqlite) == 3
    assert call.write(batch(2)).written == 3  # the queue is empty again, not stuck
    sqlite.close()


def test_a_failed_commit_fails_every_call_of_its_group(
    tmp_path: Path, calls: Callable[[GroupCommitter], Caller]
) -> None:
    sqlite = SqliteStore(tmp_path / "w.db")
    store = Gated(sqlite)
    committer = GroupCommitter(store, writers=1, busy_wait_s=30)
    call = calls(committer)
    first = call.start(batch(0))
    assert store.entered.wait(5)
    rest = [call.start(batch(i)) for i in range(1, 6)]
    wait_until(lambda: committer.queued() == 5, "5 batches queued behind it")
    store.fail = StoreUnavailable("disk gone")
    store.gate.set()
    for future in [first, *rest]:
        with pytest.raises(StoreUnavailable, match="disk gone"):
            future.result(10)
    store.fail = None
    assert call.write(batch(9)).written == 3  # later batches go through
    sqlite.close()


def test_a_call_that_goes_away_while_its_group_waits_leaves_the_others_their_results(tmp_path: Path) -> None:
    """A gRPC call cancelled (its agent gone) while its batch waits: the batch is still
    committed with its group (as its retry would find it: idempotent), the others answered."""
    sqlite = SqliteStore(tmp_path / "w.db")
    store = Gated(sqlite)
    committer = GroupCommitter(store, writers=1, busy_wait_s=30)
    with loop_thread() as loop:
        first = asyncio.run_coroutine_threadsafe(committer.write_async(batch(0)), loop)
        assert store.entered.wait(5)
        rest = [asyncio.run_coroutine_threadsafe(committer.write_async(batch(i, samples=i)), loop) for i in range(1, 6)]
        wait_until(lambda: committer.queued() == 5, "5 batches queued behind it")
        rest[1].cancel()
        store.gate.set()
        assert first.result(10).written == 3
        assert [f.result(10).written for i, f in enumerate(rest) if i != 1] == [1, 3, 4, 5]
        assert rest[1].cancelled() and rows(sqlite) == 3 + 1 + 2 + 3 + 4 + 5
    sqlite.close()


def test_a_store_bug_does_not_leave_the_group_waiting(
    tmp_path: Path, calls: Callable[[GroupCommitter], Caller]
) -> None:
    class Broken(SqliteStore):
        def write_group(self, batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
            raise KeyError("bug")

    store = Broken(tmp_path / "w.db")
    committer = GroupCommitter(store, writers=1)
    call = calls(committer)
    with pytest.raises(StoreUnavailable, match="Broken: KeyError: 'bug'"):  # the call is answered UNAVAILABLE
        call.write(batch(0))
    with pytest.raises(StoreUnavailable):  # and the writer lives on for the next one
        call.write(batch(1))
    committer.close()
    store.close()


def test_many_calls_over_several_writers_each_get_their_result_and_wake_a_writer_only_when_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Counting(Store):
        """Commits in memory after a short sleep; records concurrency and commits."""

        kind = "counting"

        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.running = self.most = self.commits = 0
            self.written: list[str] = []

        def write(self, batch: wire.pb.Batch) -> WriteResult:
            return self.write_group([batch])[0]

        def write_group(self, batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
            time.sleep(0.002)
            with self.lock:
                self.running -= 1
                self.commits += 1
                self.written += [b.stream_id for b in batches]
            return [WriteResult(written=len(b.samples)) for b in batches]

    wakes = 0

    class CountedCondition(threading.Condition):
        def notify(self, n: int = 1) -> None:
            nonlocal wakes
            wakes += 1
            super().notify(n)

    started: list[str] = []

    class CountedThread(threading.Thread):
        def start(self) -> None:
            started.append(self.name)
            super().start()

    monkeypatch.setattr(
        group, "threading", SimpleNamespace(Lock=threading.Lock, Condition=CountedCondition, Thread=CountedThread)
    )
    store = Counting()
    committer = GroupCommitter(store, writers=3, busy_wait_s=30)
    with ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(lambda i: (i, committer.write(batch(i, samples=1 + i % 5))), range(400)))
    assert all(r.written == 1 + i % 5 for i, r in results)
    assert sorted(store.written) == sorted(f"s-{i}" for i in range(400))  # each batch once
    assert store.most <= 3 and store.commits < 400  # calls waited and were grouped
    assert len(started) <= 3  # writer threads start as needed, never more than ``writers``
    assert wakes <= 400  # at most one writer woken per batch (none while all are busy)
    committer.close()


def test_under_load_a_group_lingers_to_gather_more_and_alone_a_batch_does_not_wait(tmp_path: Path) -> None:
    """Two batches waiting at once (load): the writer lets the group gather for linger_s, so
    a batch arriving 0.1 s later shares their commit. Then, the last group's load gone, a
    batch alone after an idle spell is committed at once, not after the linger."""
    sqlite = SqliteStore(tmp_path / "w.db")
    store = Gated(sqlite)
    committer = GroupCommitter(store, writers=1, busy_wait_s=30, linger_s=0.6)
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(committer.write, batch(0))
        assert store.entered.wait(5)  # the writer is committing batch 0 (held)
        queued = time.monotonic()
        waiting = [pool.submit(committer.write, batch(i)) for i in (1, 2)]
        wait_until(lambda: committer.queued() == 2, "both queued behind it")
        store.gate.set()
        time.sleep(0.1)  # time, not a state: the late batch comes 0.1 s later, inside the linger
        late = pool.submit(committer.write, batch(3))
        assert first.result(10).written == 3
        assert [f.result(10).written for f in [*waiting, late]] == [3, 3, 3]
        assert time.monotonic() - queued >= 0.55  # the linger counts from the oldest batch's arrival
    assert store.groups == [1, 3]
    committer.write(batch(4))  # the last group had 3: this one lingers too, alone
    time.sleep(0.1)  # time, not a state: an idle spell
    started = time.monotonic()
    committer.write(batch(5))  # the last group was 1 batch and it is alone: no linger
    assert time.monotonic() - started < 0.3
    assert store.groups == [1, 3, 1, 1] and rows(sqlite) == 18
    committer.close()
    sqlite.close()


def test_a_group_of_linger_points_commits_without_lingering(tmp_path: Path) -> None:
    """Small batches gathering under load: once the queue holds linger_points points the
    group is committed at once, not at the end of the linger."""
    sqlite = SqliteStore(tmp_path / "w.db")
    store = Gated(sqlite)
    committer = GroupCommitter(store, writers=1, busy_wait_s=30, linger_s=5.0, linger_points=40)
    with ThreadPoolExecutor(max_workers=24) as pool:
        first = pool.submit(committer.write, batch(0, samples=2))
        assert store.entered.wait(5)
        waiting = [pool.submit(committer.write, batch(i, samples=2)) for i in range(1, 21)]  # 20 x 2 points
        wait_until(lambda: committer.queued() == 20, "20 batches queued behind it")
        started = time.monotonic()
        store.gate.set()
        assert [f.result(10).written for f in [first, *waiting]] == [2] * 21
        assert time.monotonic() - started < 2.0  # not the 5 s linger
    assert store.groups == [1, 20]
    committer.close()
    sqlite.close()


def test_large_batches_under_load_are_not_held_back(tmp_path: Path) -> None:
    """Batches of a tenth of linger_points or more (here 3 of 30) already amortize their
    commit: under load they are committed at once, not after the linger."""
    sqlite = SqliteStore(tmp_path / "w.db")
    store = Gated(sqlite)
    committer = GroupCommitter(store, writers=1, busy_wait_s=30, linger_s=5.0, linger_points=30)
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(committer.write, batch(0))
        assert store.entered.wait(5)
        waiting = [pool.submit(committer.write, batch(i)) for i in (1, 2)]  # load: 2 queued
        wait_until(lambda: committer.queued() == 2, "both queued behind it")
        started = time.monotonic()
        store.gate.set()
        assert [f.result(10).written for f in [first, *waiting]] == [3, 3, 3]
        assert time.monotonic() - started < 2.0  # not the 5 s linger
    assert store.groups == [1, 2]
    committer.close()
    sqlite.close()


def test_a_full_group_waiting_behind_a_busy_writer_starts_another(tmp_path: Path) -> None:
    """Clients that push large batches and wait for their answers (no further call comes to
    notice the backlog): a full group queued behind a commit in progress is committed by a
    second writer at the same time, not after the first commit."""
    sqlite = SqliteStore(tmp_path / "w.db")
    store = Gated(sqlite, max_concurrent_writes=4)
    inside = threading.Semaphore(0)
    write_group = store.write_group

    def counted(batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
        inside.release()
        return write_group(batches)

    store.write_group = counted  # type: ignore[method-assign]
    committer = GroupCommitter(store, writers=4, busy_wait_s=30, linger_s=5.0, linger_points=10)
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(committer.write, batch(0, samples=6))
        assert inside.acquire(timeout=5)  # the first commit is in progress (held)
        rest = [pool.submit(committer.write, batch(i, samples=6)) for i in (1, 2)]  # 12 >= 10 points
        assert inside.acquire(timeout=3), "the full group waited for the first commit"
        store.gate.set()
        assert [f.result(10).written for f in [first, *rest]] == [6, 6, 6]
    assert sorted(store.groups) == [1, 2]
    committer.close()
    sqlite.close()


def test_line_protocol_group_attributes_refused_points_to_their_own_batch(influxd: Influxd) -> None:
    with InfluxV1Store(influxd.url, influxd.new_database()) as store:
        # A string field of the name the next batches send as a float: InfluxDB refuses those
        # points (field type conflict) without saying which batch of the group they came from.
        # (InfluxDB keeps field types per shard: the seed point is in the batches' shard.)
        store.write_lines([f'energy,host=seed memory_used_bytes="many" {T0}'])
        good = make_batch(host="a", stream="a")
        for sample in good.samples:
            sample.gauges.clear()
        bad = make_batch(host="b", stream="b", samples=3)  # 2 healthy samples carry the gauge
        results = store.write_group([good, bad])
        assert [(r.written, r.rejected) for r in results] == [(4, 0), (1, 2)]
        assert "field type conflict" in results[1].reasons[0]
        assert results[0].reasons == []


def test_server_acknowledges_each_batch_after_its_group_commit(tmp_path: Path) -> None:
    sqlite = SqliteStore(tmp_path / "w.db")
    store = Gated(sqlite)
    server = CollectorServer(store, "127.0.0.1:0", workers=4)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    push = channel.unary_unary(
        f"/{wire.SERVICE_NAME}/Push",
        request_serializer=wire.pb.Batch.SerializeToString,
        response_deserializer=wire.pb.Ack.FromString,
    )
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            calls = [pool.submit(push, batch(i), timeout=20) for i in range(8)]
            assert store.entered.wait(5)
            unacked = "wattline_collector_unacked_batches"  # queued, or in the commit held at the gate
            wait_until(lambda: server.registry.get_sample_value(unacked) == 8, "all 8 batches received")
            store.gate.set()
            acks = [c.result(20) for c in calls]
        assert sorted(a.stream_id for a in acks) == sorted(f"s-{i}" for i in range(8))
        assert all(a.written == 3 and a.rejected == 0 for a in acks)
        assert len(store.groups) < 8 and sum(store.groups) == 8
        assert rows(sqlite) == 24
        per_commit = "wattline_collector_batches_per_commit_sum"  # observed after a group's acks are out
        wait_until(lambda: server.registry.get_sample_value(per_commit) == 8, "8 batches observed per commit")
    finally:
        channel.close()
        server.stop(1)
        sqlite.close()
