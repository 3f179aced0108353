"""The agent's Prometheus endpoint: computed at scrape time from the sampler's state.

Series (Prometheus naming: base units, ``_total`` for counters, no kWh):
``wattline_energy_joules_total`` and ``wattline_power_watts`` per
{source, component, device, quality}; ``wattline_utilization_ratio``;
``wattline_channel_healthy``; ``wattline_channel_unusable`` (1: found but not sampled, its
counter can wrap within the sampling interval); ``wattline_source_up{source}``;
``wattline_source_read_seconds{source}`` and ``wattline_source_read_success{source}`` (the
source's last read: how long it took, and 1 when it raised nothing and no channel of it failed;
as node_exporter's ``node_scrape_collector_*``); and the agent's own delivery counters: the
spool's, and the uplink's pushes, failures, resends and bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, cast

from wattline.agent.registry import Discovery
from wattline.agent.sampler import Sampler
from wattline.agent.spool.base import Spool

if TYPE_CHECKING:
    from prometheus_client.core import Metric
    from prometheus_client.registry import Collector

    from wattline.agent.uplink import Uplink

LABELS = ["source", "component", "device", "quality"]


class AgentCollector:
    """Prometheus collector over a live :class:`Sampler` (and optionally its spool).

    prometheus_client is imported only when the endpoint is served: the import alone grows
    the agent's resident memory, which an agent without ``prometheus_port`` never needs.
    """

    def __init__(
        self,
        sampler: Sampler,
        spool: Spool | None = None,
        source_up: Callable[[], dict[str, bool]] | None = None,
        uplink: Uplink | None = None,
        discovery: Discovery | None = None,
    ) -> None:
        self.sampler = sampler
        self.spool = spool
        self.source_up = source_up
        self.uplink = uplink
        self.discovery = discovery  #: its channels found unusable at the interval, read at each scrape

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        energy = CounterMetricFamily(
            "wattline_energy_joules", "Energy since the agent started, by channel.", labels=LABELS
        )
        power = GaugeMetricFamily("wattline_power_watts", "Mean power over the last interval.", labels=LABELS)
        util = GaugeMetricFamily(
            "wattline_utilization_ratio", "Utilization over the last interval (0-1).", labels=LABELS
        )
        healthy = GaugeMetricFamily(
            "wattline_channel_healthy", "1 when the channel read fine last time.", labels=LABELS
        )
        unusable = GaugeMetricFamily(
            "wattline_channel_unusable",
            "1 when the channel is found but not sampled: its counter can wrap within the sampling interval.",
            labels=LABELS,
        )
        found = self.discovery.unusable if self.discovery is not None else []
        unsampled = {(u.channel.source, u.channel.component, u.channel.device): u.channel for u in found}
        for ch in unsampled.values():
            unusable.add_metric([ch.source, ch.component, ch.device, ch.quality.value], 1.0)
        for state in self.sampler.snapshot():
            ch = state.channel
            labels = [ch.source, ch.component, ch.device, ch.quality.value]
            if (ch.source, ch.component, ch.device) not in unsampled:  # else it was sampled before: said once
                unusable.add_metric(labels, 0.0)
            energy.add_metric(labels, state.counter.cumulative_j)
            healthy.add_metric(labels, 1.0 if state.healthy else 0.0)
            if state.last is not None:
                power.add_metric(labels, state.last.power_w)
            if state.utilization is not None:
                util.add_metric(labels, state.utilization)
        yield from (energy, power, util, healthy, unusable)
        if self.source_up is not None:
            up = GaugeMetricFamily("wattline_source_up", "1 when the source is present and reading.", labels=["source"])
            for name, ok in self.source_up().items():
                up.add_metric([name], 1.0 if ok else 0.0)
            yield up
        yield from read_metrics(self.sampler)
        yield CounterMetricFamily("wattline_agent_samples", "Samples produced.", value=self.sampler.samples_emitted)
        yield GaugeMetricFamily(
            "wattline_agent_clock_offset_seconds",
            "Wall clock minus sample timestamps (non-zero after a backward clock step).",
            value=self.sampler.clock.offset_ns / 1e9,
        )
        if self.spool is not None:
            yield GaugeMetricFamily(
                "wattline_agent_spool_batches", "Unacknowledged batches.", value=self.spool.backlog()
            )
            yield CounterMetricFamily(
                "wattline_agent_dropped_samples",
                "Samples dropped because the spool was full.",
                value=self.spool.dropped_samples,
            )
            yield CounterMetricFamily(
                "wattline_agent_acked_samples", "Samples acknowledged by a collector.", value=self.spool.acked_samples
            )
        if self.uplink is not None:
            yield from uplink_metrics(self.uplink)


def read_metrics(sampler: Sampler) -> Iterator[Metric]:
    """Each source's last read: its duration and whether it went well."""
    from prometheus_client.core import GaugeMetricFamily

    seconds = GaugeMetricFamily(
        "wattline_source_read_seconds", "Duration of the source's last read.", labels=["source"]
    )
    success = GaugeMetricFamily(
        "wattline_source_read_success",
        "1 when the source's last read raised nothing and no channel of it failed.",
        labels=["source"],
    )
    for name, read in sampler.last_reads():
        seconds.add_metric([name], read.seconds)
        success.add_metric([name], 1.0 if read.ok else 0.0)
    yield from (seconds, success)


def uplink_metrics(uplink: Uplink) -> Iterator[Metric]:
    """The uplink's delivery counters."""
    from prometheus_client.core import CounterMetricFamily

    for name, text, value in (
        ("pushes", "Batches pushed and acknowledged by a collector.", uplink.sent_batches),
        ("push_failures", "Pushes that failed (nothing acknowledged; the batch is sent again).", uplink.failed_pushes),
        ("resent_batches", "Pushes of a batch whose previous push failed.", uplink.resent_batches),
        ("sent_bytes", "Bytes of serialized batches pushed, resends included.", uplink.sent_bytes),
        ("refused_batches", "Batches a collector refused for good (dropped).", uplink.rejected_batches),
        ("refused_points", "Points a collector refused as invalid in acknowledged batches.", uplink.rejected_points),
        ("failovers", "Switches to another collector address.", uplink.failovers),
    ):
        yield CounterMetricFamily(f"wattline_agent_{name}", text, value=value)


def serve(collector: AgentCollector, port: int, addr: str = "127.0.0.1") -> int:
    """Serve ``collector`` on http://addr:port/metrics in a daemon thread; returns the port."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(cast("Collector", collector))  # a Collector by its collect() method
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return int(server.server_address[1])
