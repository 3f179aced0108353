"""The uplink's delivery counters reach the agent's /metrics, each equal to a count we know.

A synthetic host pushes batches to a real CollectorServer (SQLite); the server is stopped
for two pushes and started again on its port, so the truth is known: pushes acknowledged,
pushes failed, the pushes of a batch sent before, and the bytes (the store's copy of each batch
serializes to what crossed the wire, resends counted again). The figures are read from
the exporter served over HTTP, as Prometheus reads them.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest
from pipeline import SyntheticHost, ZoneSpec
from servers import free_port

from wattline import wire
from wattline.agent.exporter import AgentCollector, serve
from wattline.agent.uplink import channel_options
from wattline.collector.server import CollectorServer
from wattline.stores.base import WriteResult
from wattline.stores.sqlite.store import SqliteStore

ZONES = [ZoneSpec("intel-rapl:0", "package-0", 40.0)]


class SizedStore(SqliteStore):
    """SQLite that also records the serialized size of every batch it is given."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.sizes: list[int] = []
        self._sizes_lock = threading.Lock()

    def write_group(self, batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
        with self._sizes_lock:
            self.sizes += [b.ByteSize() for b in batches]
        return super().write_group(batches)


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        name: float(value)
        for line in text.splitlines()
        if line.startswith("wattline_agent_") and not line.startswith("#")
        for name, value in [line.rsplit(" ", 1)]
    }


def test_uplink_counters_on_metrics_are_the_known_counts(tmp_path: Path) -> None:
    store = SizedStore(tmp_path / "w.db")
    port = free_port()
    server = CollectorServer(store, f"127.0.0.1:{port}")
    server.start()
    host = SyntheticHost(tmp_path / "host", "counted", ZONES, collector=f"127.0.0.1:{port}")
    assert host.uplink is not None
    uplink = host.uplink
    uplink.timeout_s = 2.0
    metrics_port = serve(AgentCollector(host.sampler, host.spool, uplink=uplink), 0)
    try:
        for _ in range(3):
            host.advance(1.0)
            host.ship()
        server.stop(grace_s=1)
        host.advance(1.0)
        host.spool.seal()
        for _ in range(2):  # the 4th batch, refused twice (no collector): its 1st push, then a resend
            with pytest.raises(ConnectionError):
                uplink.drain()
        server = CollectorServer(store, f"127.0.0.1:{port}")
        server.start()
        host.ship()  # the 4th batch a third time: the 2nd resend, acknowledged
        got = scrape(metrics_port)
    finally:
        server.stop(grace_s=1)
    sent = store.sizes  # four batches, each once
    assert len(sent) == 4
    assert got["wattline_agent_pushes_total"] == 4
    assert got["wattline_agent_push_failures_total"] == 2
    assert got["wattline_agent_resent_batches_total"] == 2
    # Bytes: every push, the failed two included (the 4th batch went out three times).
    assert got["wattline_agent_sent_bytes_total"] == sum(sent) + 2 * sent[-1]
    assert got["wattline_agent_refused_batches_total"] == 0
    assert got["wattline_agent_failovers_total"] == 0  # one address: a retry, not a fail-over
    store.close()


def test_channel_sends_no_bdp_pings() -> None:
    """A batch of a few kB never fills a window: no PING round trip after each response."""
    assert ("grpc.http2.bdp_probe", 0) in channel_options()
