"""gRPC ingest: decode, validate, write, THEN acknowledge.

Each Push is handled on one of ``workers`` threads and returns only after the store
wrote the batch; when every worker is busy, further calls queue in gRPC and agents slow
down (back-pressure) instead of the collector buffering without bound. The collector
keeps no state beyond in-flight batches, so several can run behind one name.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from wattline import wire
from wattline.collector.stores.base import Store, StoreUnavailable

log = logging.getLogger(__name__)

#: A stream not heard from for this long no longer counts as a connected agent.
AGENT_TIMEOUT_S = 120.0


class Metrics:
    """The collector's own Prometheus metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.points = Counter("wattline_collector_points_written", "Points written to storage.", registry=registry)
        self.rejected = Counter(
            "wattline_collector_points_rejected", "Points refused by storage or validation.", registry=registry
        )
        self.batches = Counter("wattline_collector_batches", "Batches acknowledged.", registry=registry)
        self.errors = Counter(
            "wattline_collector_write_errors", "Batch writes that failed (not acknowledged).", registry=registry
        )
        self.latency = Histogram(
            "wattline_collector_write_seconds",
            "Time to write one batch to storage.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.skew = Histogram(
            "wattline_collector_agent_clock_skew_seconds",
            "Collector receive time minus the agent's send stamp (includes transit).",
            buckets=(-60, -5, -1, -0.1, 0, 0.1, 1, 5, 60),
            registry=registry,
        )
        self.in_flight = Gauge(
            "wattline_collector_unacked_batches", "Batches received, not yet written/acknowledged.", registry=registry
        )
        self.agents = Gauge(
            "wattline_collector_connected_agents", "Agent streams heard from in the last 120 s.", registry=registry
        )


class TelemetryService:
    """The Telemetry servicer: one Push = one idempotent store write."""

    def __init__(self, store: Store, metrics: Metrics) -> None:
        self.store = store
        self.metrics = metrics
        self._streams: dict[str, float] = {}
        self._lock = threading.Lock()

    def Push(self, batch: wire.pb.Batch, context: grpc.ServicerContext) -> wire.pb.Ack:
        problem = validate(batch)
        if problem:
            log.warning("refused batch from %r: %s", batch.host.host_id, problem)
            self.metrics.rejected.inc(len(batch.samples) + len(batch.job_events))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        self._seen(batch)
        self.metrics.in_flight.inc()
        started = time.perf_counter()
        try:
            result = self.store.write(batch)
        except StoreUnavailable as exc:
            self.metrics.errors.inc()
            log.warning("store unavailable, batch %s/%d not acknowledged: %s", batch.stream_id, batch.seq, exc)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"storage unavailable: {exc}")
        finally:
            self.metrics.in_flight.dec()
        self.metrics.latency.observe(time.perf_counter() - started)
        self.metrics.points.inc(result.written)
        self.metrics.batches.inc()
        if result.rejected:
            self.metrics.rejected.inc(result.rejected)
            log.warning(
                "storage rejected %d points of %s batch %d: %s",
                result.rejected,
                batch.host.host_id,
                batch.seq,
                "; ".join(result.reasons[:3]),
            )
        return wire.Ack(
            stream_id=batch.stream_id,
            seq=batch.seq,
            written=result.written,
            rejected=result.rejected,
            message="; ".join(result.reasons[:3]),
        )

    def _seen(self, batch: wire.pb.Batch) -> None:
        now = time.monotonic()
        if batch.sent_ns:
            self.metrics.skew.observe((time.time_ns() - batch.sent_ns) / 1e9)
        with self._lock:
            self._streams[batch.stream_id] = now
            for stream, seen in list(self._streams.items()):
                if now - seen > AGENT_TIMEOUT_S:
                    del self._streams[stream]
            self.metrics.agents.set(len(self._streams))


def validate(batch: wire.pb.Batch) -> str:
    """Why ``batch`` can never be stored, or "" when it is acceptable."""
    if not batch.host.host_id:
        return "host.host_id is empty"
    if not batch.stream_id or batch.seq == 0:
        return "stream_id and seq are required"
    for i, s in enumerate(batch.samples):
        if not (s.source and s.component and s.device):
            return f"sample {i}: source, component and device are required"
        if s.end_ns <= 0 or s.start_ns > s.end_ns:
            return f"sample {i}: bad interval {s.start_ns}..{s.end_ns}"
        for name, value in (("energy_j", s.energy_j), ("power_w", s.power_w), ("cumulative_j", s.cumulative_j)):
            if not math.isfinite(value) or value < 0:
                return f"sample {i}: {name} {value} is negative or not finite"
        if s.quality not in wire.QUALITY_NAMES:
            return f"sample {i}: unknown quality {s.quality}"
    for i, e in enumerate(batch.job_events):
        if not e.job_id or e.time_ns <= 0:
            return f"job event {i}: job_id and time_ns are required"
    return ""


class CollectorServer:
    """A running gRPC server with the Telemetry and health services."""

    def __init__(
        self,
        store: Store,
        listen: str,
        *,
        workers: int = 8,
        max_message_bytes: int = 16 << 20,
        registry: CollectorRegistry | None = None,
        server_credentials: grpc.ServerCredentials | None = None,
        interceptors: list[Any] | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.service = TelemetryService(store, self.metrics)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ingest"),
            interceptors=interceptors or [],
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_concurrent_streams", 1000),
            ],
            maximum_concurrent_rpcs=workers * 64,
        )
        wire.add_telemetry_servicer(self.service, self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if server_credentials is None:
            self.port = self.server.add_insecure_port(listen)
        else:
            self.port = self.server.add_secure_port(listen, server_credentials)
        if self.port == 0:
            raise OSError(f"cannot listen on {listen}")

    def start(self) -> None:
        self.server.start()
        for name in ("", wire.SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop accepting calls; in-flight writes finish (and are acknowledged) first."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait()
