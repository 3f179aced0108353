"""What a call passes before the servicer reads it: the gRPC server's limits and
timeouts, the bearer-token :class:`Gate` and the per-host token bucket."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from wattline.collector.metrics import Metrics
from wattline.security import TokenCheck

log = logging.getLogger(__name__)


#: Messages up to this much beyond max_message_bytes are read, logged and refused by name.
SIZE_SLACK_BYTES = 1 << 20


class HostLimiter:
    """Token bucket per host: ``rate`` batches/s, bursts of ``burst``; rate 0 is no limit."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._swept = clock()

    def allow(self, host: str) -> bool:
        if self.rate <= 0:
            return True
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.get(host, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            allowed = tokens >= 1.0
            self._buckets[host] = (tokens - 1.0 if allowed else tokens, now)
            if now - self._swept > 60.0:  # forget hosts whose bucket is full again
                self._swept = now
                full_after = self.burst / self.rate
                self._buckets = {h: v for h, v in self._buckets.items() if now - v[1] < full_after}
            return allowed


def _refuse_handler(code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that answers ``code`` at once, without reading the request."""

    async def refuse(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, details)

    return grpc.stream_unary_rpc_method_handler(refuse)


class Gate(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Bearer-token check, on the server's event loop before the call's handler runs."""

    def __init__(self, token: TokenCheck, metrics: Metrics) -> None:
        self.token = token
        self.metrics = metrics
        self._logged = -math.inf

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        if details.method.startswith("/grpc.health.v1.Health/") or self.token.check(details.invocation_metadata):
            return await continuation(details)
        self.metrics.refused.labels("unauthenticated").inc()
        if time.monotonic() - self._logged > 60.0:
            self._logged = time.monotonic()
            log.warning("refused a %s call: missing or wrong bearer token", details.method)
        return _refuse_handler(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


def server_options(max_message_bytes: int, reuse_port: bool = False) -> list[tuple[str, int]]:
    """Limits and timeouts of the gRPC server (each one a defence against a bad client);
    ``reuse_port``: the port is shared with the collector's other processes."""
    return [
        # Messages a little over the limit reach push_bytes, which logs and refuses them by
        # name; beyond, gRPC refuses them (RESOURCE_EXHAUSTED) without reading them.
        ("grpc.max_receive_message_length", max_message_bytes + min(max_message_bytes, SIZE_SLACK_BYTES)),
        ("grpc.max_send_message_length", 1 << 20),
        ("grpc.max_concurrent_streams", 64),  # per connection
        # A port in use is an error, not silently shared with another process (several
        # processes of one collector share it: the supervisor checked and holds it).
        ("grpc.so_reuseport", int(reuse_port)),
        # A connection that never completes its (TLS/HTTP2) handshake is closed.
        ("grpc.server_handshake_timeout_ms", 10_000),
        # Dead peers are found by pings; agents may ping every 30 s.
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        # A fixed 1 MiB receive window per stream (Go's and Java's gRPC default) instead of
        # gRPC's BDP probe, which pinged the agent after every push (GRPC_TRACE=bdp_estimator
        # shows it): a PING round trip per push costs the collector CPU and tunes a window
        # that an agent's small batch never fills. A 16 MB batch then takes 16 round trips, not 256.
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", 1 << 20),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        # Idle connections are closed; every connection is recycled after 30 min (a
        # stalled call on it ends 60 s later), which also rebalances agents over replicas.
        ("grpc.max_connection_idle_ms", 300_000),
        ("grpc.max_connection_age_ms", 1_800_000),
        ("grpc.max_connection_age_grace_ms", 60_000),
    ]
