"""gRPC ingest: authenticate, admit, decode, validate, write, THEN acknowledge.

Delivery: a Push returns an Ack only after the store wrote the batch. A failed write
(InfluxDB down, 5xx, timeout) answers UNAVAILABLE and nothing is acknowledged: the agent
keeps the batch and resends it with back-off (the retry lives in the agent, which holds
the data anyway; the collector never buffers). Writes are idempotent, so a batch written
but not acknowledged (collector killed between the two) leaves one copy when resent.

Group commit (:mod:`wattline.collector.group`): the batches waiting for storage are
written together, one commit (transaction, HTTP request) per group, so the commit rate no
longer caps the batch rate; each call is still answered only after its batch is written.

Back-pressure, not unbounded memory: at most ``workers`` group commits run at once (one
for SQLite); a batch that no writer takes within ``BUSY_WAIT_S`` is answered
RESOURCE_EXHAUSTED ("busy") so its agent backs off or fails over, and gRPC admits at most
``POOL_PER_WORKER * workers`` calls in all (beyond: RESOURCE_EXHAUSTED at once, no
message read; a waiting call holds no thread, see :class:`CollectorServer`). Per host, a
token bucket (``host_rate`` batches/s, bursts of ``host_burst``) answers
RESOURCE_EXHAUSTED too, so one host replaying a long outage, or misbehaving, cannot
starve the others; batches beyond ``max_batch_points`` points or ``max_message_bytes``
are refused the same way (the agent splits them). Memory is thus bounded by
``POOL_PER_WORKER * workers`` messages.

Bad input (:mod:`wattline.collector.validation`): a batch without host id, stream id or
seq is INVALID_ARGUMENT (the agent drops it); a malformed sample or job event (bad
interval, negative or non-finite energy, a quality or event kind this version does not
know) is refused alone, counted in ``Ack.rejected`` with the reason, and the rest of the
batch is written. Unknown fields of a newer agent are ignored. Undecodable bytes are
INVALID_ARGUMENT.

Security (see :mod:`wattline.security`): the bearer token is checked before the call's
handler runs, before anything is read (:mod:`wattline.collector.admission`); with mutual TLS a
batch's ``host.host_id`` must be a name of the client certificate (PERMISSION_DENIED
otherwise). The health service stays open (probes carry no credentials).

Job hook: after a batch with job events is written, ``on_job_events`` (if given) gets its
jobs as (job id, whether a close is among them); it must not block (the job summaries'
writer only marks the jobs due, :mod:`wattline.reports.summaries.summary`, wired in by the CLI so
that this floor imports nothing above it). Its failure is logged, never the batch's.

The collector keeps no state beyond in-flight batches (and the per-host buckets, which
only limit, and the live streams per host, which only watch for two agents under one host
id: :mod:`wattline.collector.livestreams`), so several can run behind one name, or as processes
of one collector on one port (:mod:`wattline.collector.processes`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import _async as health_aio  # = grpc_health.v1.health.aio (which mypy cannot see)
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from wattline import wire
from wattline.collector.admission import Gate, HostLimiter, server_options
from wattline.collector.group import Busy, GroupCommitter
from wattline.collector.listen import check_free
from wattline.collector.livestreams import LiveStreams, StreamWatch
from wattline.collector.metrics import Metrics
from wattline.collector.validation import drop_invalid_points, validate
from wattline.security import TokenCheck, peer_identities
from wattline.stores.base import Store, StoreUnavailable
from wattline.text import clip

log = logging.getLogger(__name__)

#: A stream not heard from for this long no longer counts as a connected agent.
AGENT_TIMEOUT_S = 120.0
#: How long a batch waits for a free writer before the answer is "busy".
BUSY_WAIT_S = 1.0
#: How long a group gathers under load before its commit (see :mod:`wattline.collector.group`).
GROUP_LINGER_S = 0.05
#: Calls admitted at once, per worker. A call waits for its group commit (holding no
#: thread), so the calls in flight are about batches/s x (linger + commit time), many more
#: while the host is short of CPU; calls beyond the bound are refused at once and each
#: refusal costs its agent a push later, so the bound sits well above the steady number
#: (a tighter one refused a large fleet's calls over and over whenever commits slowed).
#: Memory bound: each admitted call holds at most one message of max_message_bytes (+ slack).
POOL_PER_WORKER = 64
#: How long a call may take to bring its batch (then it is refused and its slot freed).
REQUEST_TIMEOUT_S = 30.0
#: Clock skew beyond which a host is named in the log (at most every SKEW_LOG_EVERY_S).
SKEW_WARN_S = 5.0
SKEW_LOG_EVERY_S = 600.0
#: Longest ``Ack.message`` (the first three reasons): a reply stays far below gRPC's limits.
MAX_ACK_MESSAGE = 2000

#: ``on_job_events`` hook: the jobs of a written batch, (job id, a close among its events).
JobEventsHook = Callable[[list[tuple[str, bool]]], None]
T = TypeVar("T")


class TelemetryService:
    """The Telemetry servicer: one Push = one idempotent store write."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        *,
        workers: int = 8,
        max_message_bytes: int = 16 << 20,
        max_batch_points: int = 20000,
        host_rate: float = 0.0,
        host_burst: float = 60.0,
        require_identity: bool = False,
        on_job_events: JobEventsHook | None = None,
        live: StreamWatch | None = None,
    ) -> None:
        self.store = store
        self.on_job_events = on_job_events
        self.metrics = metrics
        self.max_message_bytes = max_message_bytes
        self.max_batch_points = max_batch_points
        self.require_identity = require_identity
        self.limiter = HostLimiter(host_rate, host_burst)
        writers = min(workers, store.max_concurrent_writes or workers)
        self.committer = GroupCommitter(
            store,
            writers=writers,
            max_group_points=max(max_batch_points, 50_000),
            busy_wait_s=BUSY_WAIT_S,
            linger_s=GROUP_LINGER_S,
            on_commit=self._committed,
        )
        self._streams: dict[str, float] = {}
        self._expired = -math.inf
        self._skew_logged: dict[str, float] = {}
        self._lock = threading.Lock()
        self.live: StreamWatch = live or LiveStreams(
            metrics.duplicate_streams, metrics.duplicate_hosts, timeout_s=AGENT_TIMEOUT_S
        )

    async def _refuse(
        self, context: grpc.aio.ServicerContext[Any, Any], reason: str, code: grpc.StatusCode, details: str
    ) -> NoReturn:
        self.metrics.refused.labels(reason).inc()
        await context.abort(code, details)
        raise AssertionError("abort returned")  # abort raises; this keeps NoReturn honest

    async def push_call(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.Ack:
        """The wire entry point: one message per call. (Push is unary on the wire; read as a
        stream here because gRPC's asyncio server leaves a unary call whose client closed
        without a message waiting forever.) A call whose message does not come within
        ``REQUEST_TIMEOUT_S`` is refused, so a silent client frees its admission slot."""
        messages: list[bytes] = []
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                async for message in requests:
                    messages.append(message)
                    if len(messages) > 1:
                        break
        except TimeoutError:
            await self._refuse(
                context, "invalid", grpc.StatusCode.DEADLINE_EXCEEDED, f"no batch within {REQUEST_TIMEOUT_S:g} s"
            )
        if len(messages) != 1:
            await self._refuse(
                context, "invalid", grpc.StatusCode.INVALID_ARGUMENT, f"a Push carries one batch, not {len(messages)}"
            )
        return await self.push_bytes(messages[0], context)

    async def push_bytes(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> wire.pb.Ack:
        """The wire entry point: size check and decoding are ours, so both are logged clearly."""
        if len(request) > self.max_message_bytes:
            log.warning(
                "refused a batch of %d bytes from %s: larger than collector.max_message_mb (%d bytes)",
                len(request),
                context.peer(),
                self.max_message_bytes,
            )
            await self._refuse(
                context,
                "too_large",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"batch of {len(request)} bytes is larger than max {self.max_message_bytes} bytes; split it",
            )
        try:
            batch = wire.Batch.FromString(request)
        except DecodeError as exc:
            log.warning("refused undecodable bytes (%d) from %s: %s", len(request), context.peer(), exc)
            await self._refuse(context, "invalid", grpc.StatusCode.INVALID_ARGUMENT, f"not a wattline.v1.Batch: {exc}")
        return await self.Push(batch, context)

    async def Push(self, batch: wire.pb.Batch, context: grpc.aio.ServicerContext[Any, Any]) -> wire.pb.Ack:
        problem = validate(batch)
        if problem:
            log.warning("refused batch from %s: %s", clip(batch.host.host_id), problem)
            self.metrics.rejected.inc(len(batch.samples) + len(batch.job_events))
            await self._refuse(context, "invalid", grpc.StatusCode.INVALID_ARGUMENT, problem)
        host = batch.host.host_id
        points = len(batch.samples) + len(batch.job_events)
        if points > self.max_batch_points:
            log.warning(
                "refused batch %d of %s: %d points, more than %d", batch.seq, clip(host), points, self.max_batch_points
            )
            await self._refuse(
                context,
                "too_large",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"batch of {points} points is larger than max {self.max_batch_points} points; split it",
            )
        if self.require_identity:
            names = peer_identities(context.auth_context())
            if host not in names:
                log.warning("refused batch for host %s from a certificate of %s", clip(host), sorted(names))
                await self._refuse(
                    context,
                    "permission_denied",
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"the client certificate does not name host {clip(host)}",
                )
        if not self.limiter.allow(host):
            await self._refuse(
                context,
                "rate_limited",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"host {clip(host)} is over {self.limiter.rate:g} batches/s; back off",
            )
        reasons = drop_invalid_points(batch)
        self._seen(batch)
        self.metrics.in_flight.inc()
        try:
            result = await self.committer.write_async(batch)
        except Busy:
            await self._refuse(context, "busy", grpc.StatusCode.RESOURCE_EXHAUSTED, "collector busy; back off")
        except StoreUnavailable as exc:
            self.metrics.errors.inc()
            log.warning("store unavailable, batch %s/%d not acknowledged: %s", clip(batch.stream_id), batch.seq, exc)
            await self._refuse(context, "store_unavailable", grpc.StatusCode.UNAVAILABLE, f"storage unavailable: {exc}")
        finally:
            self.metrics.in_flight.dec()
        self.metrics.points.inc(result.written)
        self.metrics.batches.inc()
        if self.on_job_events is not None and batch.job_events:
            self._job_events(batch)
        reasons += result.reasons
        rejected = result.rejected + len(reasons) - len(result.reasons)
        message = "; ".join(reasons[:3])
        if len(message) > MAX_ACK_MESSAGE:  # each reason quotes ~100 characters of a value; this is a bound
            message = message[:MAX_ACK_MESSAGE] + "..."
        if rejected:
            self.metrics.rejected.inc(rejected)
            log.warning("refused %d points of %s batch %d: %s", rejected, clip(host), batch.seq, message)
        return wire.Ack(
            stream_id=batch.stream_id,
            seq=batch.seq,
            written=result.written,
            rejected=rejected,
            message=message,
        )

    def _job_events(self, batch: wire.pb.Batch) -> None:
        """Tell the hook which jobs this (written) batch had events of, and which closed."""
        jobs: dict[str, bool] = {}
        for event in batch.job_events:
            jobs[event.job_id] = jobs.get(event.job_id, False) or event.kind == wire.pb.JobEvent.KIND_CLOSE
        try:
            self.on_job_events(list(jobs.items()))  # type: ignore[misc]
        except Exception:
            log.exception("job events hook failed for batch %s/%d", clip(batch.stream_id), batch.seq)

    def _committed(self, batches: int, seconds: float) -> None:
        self.metrics.latency.observe(seconds)
        self.metrics.group.observe(batches)

    def _seen(self, batch: wire.pb.Batch) -> None:
        now = time.monotonic()
        skew = (time.time_ns() - batch.sent_ns) / 1e9 if batch.sent_ns else 0.0
        if batch.sent_ns:
            self.metrics.skew.observe(skew)
        host = batch.host.host_id
        with self._lock:
            known = len(self._streams)
            self._streams[batch.stream_id] = now
            sweep = now - self._expired > 1.0  # a sweep over every stream at most once a second
            if sweep:
                self._expired = now
                self._streams = {s: seen for s, seen in self._streams.items() if now - seen <= AGENT_TIMEOUT_S}
            if len(self._streams) != known:
                self.metrics.agents.set(len(self._streams))
            warn = abs(skew) > SKEW_WARN_S and now - self._skew_logged.get(host, -math.inf) > SKEW_LOG_EVERY_S
            if warn:
                self._skew_logged[host] = now
        self.live.seen(batch, now)
        if sweep:
            self.live.sweep(now)
        if warn:
            log.warning(
                "host %s: agent clock %+.1f s from the collector's (sample times are the agent's; check NTP)",
                clip(host),
                -skew,
            )


class CollectorServer:
    """A running gRPC server with the Telemetry and health services.

    The server is gRPC's asyncio server on an event loop of its own thread: a call waiting
    for its group commit holds no thread (gRPC's threaded server needs one per waiting call,
    and switching between that many threads costs CPU on every push: ``bench/run``'s scale
    part). The store's writes run on the committer's writer threads.
    The methods here are plain calls from any thread."""

    def __init__(
        self,
        store: Store,
        listen: str,
        *,
        workers: int = 8,
        max_message_bytes: int = 16 << 20,
        max_batch_points: int = 20000,
        host_rate: float = 0.0,
        host_burst: float = 60.0,
        registry: CollectorRegistry | None = None,
        server_credentials: grpc.ServerCredentials | None = None,
        token: str | None = None,
        require_identity: bool = False,
        on_job_events: JobEventsHook | None = None,
        reuse_port: bool = False,
        live: StreamWatch | None = None,
    ) -> None:
        if require_identity and server_credentials is None:
            raise ValueError("client identities need TLS (server_credentials with a client CA)")
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.service = TelemetryService(
            store,
            self.metrics,
            workers=workers,
            max_message_bytes=max_message_bytes,
            max_batch_points=max_batch_points,
            host_rate=host_rate,
            host_burst=host_burst,
            require_identity=require_identity,
            on_job_events=on_job_events,
            live=live,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ingest-loop", daemon=True)
        self._thread.start()
        self._stopped = False
        gates = [Gate(TokenCheck(token), self.metrics)] if token else []
        try:
            self.server, self.health, self.port = self._run(
                self._build(gates, POOL_PER_WORKER * workers, max_message_bytes, reuse_port, server_credentials, listen)
            )
        except BaseException:
            self._close_loop()
            raise

    async def _build(
        self,
        gates: list[Gate],
        calls: int,
        max_message_bytes: int,
        reuse_port: bool,
        credentials: grpc.ServerCredentials | None,
        listen: str,
    ) -> tuple[grpc.aio.Server, health_aio.HealthServicer, int]:
        server = grpc.aio.server(
            interceptors=gates,
            options=server_options(max_message_bytes, reuse_port),
            maximum_concurrent_rpcs=calls,
        )
        push = grpc.stream_unary_rpc_method_handler(
            self.service.push_call, request_deserializer=None, response_serializer=wire.pb.Ack.SerializeToString
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(wire.SERVICE_NAME, {"Push": push}),))
        servicer = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        if not reuse_port:  # (several processes: the supervisor checked and holds the port)
            check_free(listen)
        try:
            port = (
                server.add_insecure_port(listen) if credentials is None else server.add_secure_port(listen, credentials)
            )
        except RuntimeError:  # gRPC's "Failed to bind": lost a race with another process
            port = 0
        if port == 0:
            raise OSError(f"cannot listen on {listen}")
        return server, servicer, port

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def start(self) -> None:
        self._run(self._start())

    async def _start(self) -> None:
        await self.server.start()
        for name in ("", wire.SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop accepting calls; in-flight writes finish (and are acknowledged) first."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._run(self._stop(grace_s))
        finally:
            self._close_loop()
            self.service.committer.close()

    async def _stop(self, grace_s: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
