"""The collector's own Prometheus metrics, and the refusal reasons they count by."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from wattline.collector.livestreams import duplicate_gauges

#: Refusal reasons, the label values of ``wattline_collector_refused``.
REASONS = (
    "invalid",
    "too_large",
    "unauthenticated",
    "permission_denied",
    "rate_limited",
    "busy",
    "store_unavailable",
)


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
        self.refused = Counter(
            "wattline_collector_refused_calls",
            "Push calls answered with an error status, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:
            self.refused.labels(reason)
        self.latency = Histogram(
            "wattline_collector_write_seconds",
            "Time to write one group of batches to storage (one commit).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.group = Histogram(
            "wattline_collector_batches_per_commit",
            "Batches written together in one commit (group commit).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
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
        self.duplicate_streams, self.duplicate_hosts = duplicate_gauges(registry)
