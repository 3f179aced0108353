"""Bad input on the wire, and a collector under pressure: it answers with a clear status,
logs why, keeps serving everyone else, and never acknowledges what it did not write."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from servers import make_batch
from store_rows import energy_rows
from waits import wait_until

from wattline import wire
from wattline.agent.spool.memory import MemorySpool
from wattline.agent.uplink import Uplink
from wattline.collector import server as server_module
from wattline.collector.server import POOL_PER_WORKER, CollectorServer, HostLimiter
from wattline.stores.base import Store, StoreUnavailable, WriteResult
from wattline.stores.sqlite.store import SqliteStore

PUSH = "/wattline.v1.Telemetry/Push"


class GatedStore(Store):
    """A real SQLite store whose writes can be held (slow storage) or fail (storage down)."""

    kind = "gated"

    def __init__(self, path: Path) -> None:
        self.inner = SqliteStore(path)
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()
        self.failures = 0

    def write(self, batch: wire.pb.Batch) -> WriteResult:
        self.entered.set()
        self.open.wait(30)
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("InfluxDB answered 503")
        return self.inner.write(batch)

    def rows(self, host: str = "node-1") -> int:
        return len(energy_rows(self.inner, host=host))

    def close(self) -> None:
        self.inner.close()


Serve = Callable[..., tuple[CollectorServer, str]]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[GatedStore]:
    s = GatedStore(tmp_path / "w.db")
    yield s
    s.open.set()
    s.close()


@pytest.fixture
def serve(store: GatedStore) -> Iterator[Serve]:
    servers: list[CollectorServer] = []

    def start(**options: Any) -> tuple[CollectorServer, str]:
        server = CollectorServer(store, "127.0.0.1:0", **options)
        server.start()
        servers.append(server)
        return server, f"127.0.0.1:{server.port}"

    yield start
    store.open.set()
    for server in servers:
        server.stop(grace_s=1)


def stub(address: str) -> Any:
    return wire.telemetry_stub(grpc.insecure_channel(address))


def status_of(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code(), exc.details()  # type: ignore[attr-defined]
    return grpc.StatusCode.OK, ""


def refused(address: str) -> bool:
    """A new call (a health check: it writes nothing) is refused: the server is stopping."""
    with grpc.insecure_channel(address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        code, _ = status_of(lambda: check(health_pb2.HealthCheckRequest(service=""), timeout=2))
    return code == grpc.StatusCode.UNAVAILABLE


def big_batch(samples: int, seq: int = 1) -> wire.pb.Batch:
    batch = make_batch(samples=samples, seq=seq)
    for s in batch.samples:
        s.healthy, s.status = True, ""
    return batch


def test_oversized_batches_are_refused_clearly(serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    server, address = serve(max_message_bytes=64 << 10)
    client = stub(address)
    moderate = big_batch(600)  # ~1.5 x the limit (slack: 64 KiB): the collector reads it, logs and refuses it
    assert (64 << 10) < moderate.ByteSize() < (128 << 10)
    with caplog.at_level(logging.WARNING):
        code, details = status_of(lambda: client.Push(moderate, timeout=10))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"batch of {moderate.ByteSize()} bytes is larger than max 65536 bytes" in details
    assert f"refused a batch of {moderate.ByteSize()} bytes" in caplog.text
    assert "larger than collector.max_message_mb" in caplog.text
    huge = big_batch(3000)  # beyond twice the limit: gRPC refuses it without reading it
    code, details = status_of(lambda: client.Push(huge, timeout=10))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details
    assert client.Push(make_batch(), timeout=10).written == 4  # still serving
    too_large = server.registry.get_sample_value("wattline_collector_refused_calls_total", {"reason": "too_large"})
    assert too_large == 1


@pytest.mark.parametrize("limit", ["bytes", "points"])
def test_the_agent_splits_what_the_collector_finds_too_large(
    serve: Serve, store: GatedStore, limit: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, address = serve(**({"max_message_bytes": 16 << 10} if limit == "bytes" else {"max_batch_points": 50}))
    spool = MemorySpool(wire.Host(host_id="node-1"), max_batch_samples=5000)
    spool.add_samples(list(big_batch(400).samples))
    uplink = Uplink(spool, [address])
    spool.seal()
    with caplog.at_level(logging.WARNING):
        uplink.drain()
    uplink.close()
    assert spool.backlog() == 0 and uplink.rejected_batches == 0
    assert store.rows() == 400  # nothing lost to the split
    assert spool.acked_batches >= 4
    assert "too large for the collector: split in two" in caplog.text


def test_unknown_fields_of_a_newer_agent_are_ignored(serve: Serve, store: GatedStore) -> None:
    _, address = serve()
    batch = make_batch()
    unknown = b"\x98\x06\x01" + b"\xa2\x06\x03new"  # field 99 varint 1, field 100 bytes "new"
    batch.MergeFromString(unknown)
    batch.samples[0].MergeFromString(unknown)
    batch.host.MergeFromString(unknown)
    data = batch.SerializeToString()
    assert unknown in data
    call = grpc.insecure_channel(address).unary_unary(PUSH, response_deserializer=wire.pb.Ack.FromString)
    ack = call(data, timeout=10)
    assert (ack.written, ack.rejected) == (4, 0)
    assert store.rows() == 4


def test_unknown_enum_values_reject_only_their_point(serve: Serve, store: GatedStore) -> None:
    server, address = serve()
    batch = make_batch(job_id="job-1")
    batch.samples[1].quality = 9  # a quality this collector does not know
    batch.job_events[2].kind = 42  # type: ignore[assignment]
    ack = stub(address).Push(batch, timeout=10)
    assert (ack.written, ack.rejected) == (6, 2)
    assert "sample 1: unknown quality 9 (a newer agent? upgrade the collector)" in ack.message
    assert "job event 2: unknown job event kind 42" in ack.message
    assert store.rows() == 3
    assert server.registry.get_sample_value("wattline_collector_points_rejected_total") == 2


def test_malformed_points_and_batches(serve: Serve, store: GatedStore) -> None:
    _, address = serve()
    batch = make_batch()
    batch.samples[0].energy_j = float("nan")
    batch.samples[1].start_ns = batch.samples[1].end_ns + 1
    ack = stub(address).Push(batch, timeout=10)
    assert (ack.written, ack.rejected) == (2, 2)
    assert "sample 0: energy_j nan is negative or not finite" in ack.message
    no_host = make_batch(host="")
    code, details = status_of(lambda: stub(address).Push(no_host, timeout=10))
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, "host.host_id is empty")
    call = grpc.insecure_channel(address).unary_unary(PUSH)
    code, details = status_of(lambda: call(b"\xff\xff\xff\xff garbage", timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("not a wattline.v1.Batch")


def test_garbage_bytes_on_the_port(serve: Serve) -> None:
    _, address = serve()
    host, port = address.rsplit(":", 1)
    for payload in (
        bytes(range(256)) * 16,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),  # a TLS ClientHello to plaintext
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x04\x01\x00\xff\xff\xff\xff" * 8,  # preface + junk frames
    ):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(payload)
            sock.settimeout(5)
            try:
                while sock.recv(65536):
                    pass  # the server answers an error (or nothing) and closes
            except (ConnectionResetError, TimeoutError):
                pass
    assert stub(address).Push(make_batch(), timeout=10).written == 4


def test_silent_clients_do_not_block_the_others(serve: Serve) -> None:
    _server, address = serve(workers=1)  # POOL_PER_WORKER threads and calls admitted at most
    host, port = address.rsplit(":", 1)
    silent = [socket.create_connection((host, int(port)), timeout=5) for _ in range(30)]
    preface_only = [socket.create_connection((host, int(port)), timeout=5) for _ in range(30)]
    for sock in preface_only:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    release = threading.Event()

    def never_sends() -> Iterator[bytes]:
        release.wait(30)
        return
        yield b""  # a generator that yields nothing until released

    stalled_channel = grpc.insecure_channel(address)
    stalled_call = stalled_channel.stream_unary(PUSH)
    stalled = [stalled_call.future(never_sends(), timeout=30) for _ in range(3)]
    own: list[grpc.Channel] = []
    try:
        # time, not a state: the stalled calls take their slots (gRPC's count of admitted calls is
        # not observable; a stall not in yet only makes the next check easier, never fail)
        time.sleep(0.3)
        started = time.monotonic()
        assert stub(address).Push(make_batch(), timeout=10).written == 4
        assert time.monotonic() - started < 2.0
        # > admitted, over connections of their own (a connection carries at most 64 streams)
        own = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(2)]
        more = [
            channel.stream_unary(PUSH).future(never_sends(), timeout=30)
            for channel in own
            for _ in range(POOL_PER_WORKER // 2)
        ]

        def push() -> object:
            return stub(address).Push(make_batch(seq=2), timeout=10)

        # every slot taken once the new stalled calls are in: a push is then refused at once, not
        # queued behind the stalled ones (one admitted before that is written, its slot freed)
        wait_until(lambda: status_of(push)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED, "a push refused at once")
        stalled += more
    finally:
        release.set()
        for sock in silent + preface_only:
            sock.close()
        for call in stalled:
            with contextlib.suppress(grpc.RpcError):
                call.result(timeout=10)
        stalled_channel.close()
        for channel in own:
            channel.close()
    assert stub(address).Push(make_batch(seq=3), timeout=10).written == 4  # threads came back


def test_a_call_without_its_batch_is_refused_and_frees_its_slot(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that opens a Push and closes it without a message is refused at once (gRPC's
    asyncio server would leave such a unary call waiting forever); one that sends nothing
    is refused after REQUEST_TIMEOUT_S and its admission slot comes back: with every slot of
    a 1-worker server taken by silent calls, a real push goes through once they time out."""
    monkeypatch.setattr(server_module, "REQUEST_TIMEOUT_S", 1.0)
    _server, address = serve(workers=1)
    channel = grpc.insecure_channel(address)
    call = channel.stream_unary(PUSH)
    started = time.monotonic()
    code, details = status_of(lambda: call(iter(()), timeout=10))
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, "a Push carries one batch, not 0")
    code, details = status_of(lambda: call(iter((b"", b"")), timeout=10))
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, "a Push carries one batch, not 2")
    assert time.monotonic() - started < 2.0
    release = threading.Event()

    def silent() -> Iterator[bytes]:
        release.wait(30)
        return
        yield b""

    held = [call.future(silent(), timeout=30) for _ in range(POOL_PER_WORKER)]
    try:
        for future in held:
            with pytest.raises(grpc.RpcError) as refused:
                future.result(timeout=10)
            assert refused.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
            assert "no batch within 1 s" in refused.value.details()  # type: ignore[attr-defined]
        assert stub(address).Push(make_batch(), timeout=10).written == 4
    finally:
        release.set()
        channel.close()


def test_one_host_over_its_rate_does_not_starve_another(serve: Serve) -> None:
    server, address = serve(host_rate=0.5, host_burst=3)
    now = [100.0]
    server.service.limiter = HostLimiter(0.5, 3, clock=lambda: now[0])  # time moves when the test says
    client = stub(address)
    for seq in (1, 2, 3):
        client.Push(make_batch(host="noisy", seq=seq), timeout=10)
    code, details = status_of(lambda: client.Push(make_batch(host="noisy", seq=4), timeout=10))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and details == "host 'noisy' is over 0.5 batches/s; back off"
    assert client.Push(make_batch(host="quiet"), timeout=10).written == 4
    now[0] += 1.9
    code, _ = status_of(lambda: client.Push(make_batch(host="noisy", seq=4), timeout=10))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED  # not yet one token back at 0.5 batches/s
    now[0] += 0.1
    assert client.Push(make_batch(host="noisy", seq=4), timeout=10).written == 4  # the bucket refilled
    assert server.registry.get_sample_value("wattline_collector_refused_calls_total", {"reason": "rate_limited"}) == 2


def test_busy_collector_answers_quickly_instead_of_queueing(serve: Serve, store: GatedStore) -> None:
    _server, address = serve(workers=1)
    store.open.clear()
    pool = futures.ThreadPoolExecutor(2)
    first = pool.submit(stub(address).Push, make_batch(seq=1), timeout=30)
    assert store.entered.wait(10)
    started = time.monotonic()
    code, details = status_of(lambda: stub(address).Push(make_batch(seq=2), timeout=30))
    waited = time.monotonic() - started
    assert (code, details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "collector busy; back off")
    assert 0.9 < waited < 3.0
    store.open.set()
    assert first.result(timeout=10).written == 4
    pool.shutdown()


def test_graceful_stop_acknowledges_what_is_in_flight(serve: Serve, store: GatedStore) -> None:
    server, address = serve()
    store.open.clear()
    pool = futures.ThreadPoolExecutor(1)
    in_flight = pool.submit(stub(address).Push, make_batch(), timeout=30)
    assert store.entered.wait(10)
    stopper = threading.Thread(target=server.stop, kwargs={"grace_s": 10})
    stopper.start()
    wait_until(lambda: refused(address), "the stopping server refusing new calls")
    code, _ = status_of(lambda: stub(address).Push(make_batch(seq=2), timeout=2))
    assert code == grpc.StatusCode.UNAVAILABLE  # no new calls once stopping
    store.open.set()
    assert in_flight.result(timeout=10).written == 4  # written, then acknowledged
    stopper.join(10)
    pool.shutdown()
    assert store.rows() == 4


def test_storage_down_is_unavailable_and_the_agent_resends(serve: Serve, store: GatedStore) -> None:
    server, address = serve()
    store.failures = 3
    spool = MemorySpool(wire.Host(host_id="node-1"))
    spool.add_samples(list(big_batch(10).samples))
    uplink = Uplink(spool, [address], max_backoff_s=0.2)
    stop = threading.Event()
    runner = threading.Thread(target=uplink.run, args=(stop,))
    runner.start()
    deadline = time.monotonic() + 20
    while spool.backlog() and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    runner.join(10)
    uplink.close()
    assert spool.backlog() == 0 and uplink.failed_pushes == 3
    assert store.rows() == 10
    assert server.registry.get_sample_value("wattline_collector_write_errors_total") == 3
    refused = server.registry.get_sample_value(
        "wattline_collector_refused_calls_total", {"reason": "store_unavailable"}
    )
    assert refused == 3


def test_host_limiter_token_bucket() -> None:
    now = [100.0]
    limiter = HostLimiter(rate=2.0, burst=2, clock=lambda: now[0])
    assert [limiter.allow("a") for _ in range(3)] == [True, True, False]
    assert limiter.allow("b")  # buckets are per host
    now[0] += 0.5  # one token back
    assert [limiter.allow("a") for _ in range(2)] == [True, False]
    now[0] += 100  # never more than the burst
    assert [limiter.allow("a") for _ in range(3)] == [True, True, False]
    assert all(HostLimiter(rate=0, burst=1).allow("x") for _ in range(1000))  # 0: no limit
