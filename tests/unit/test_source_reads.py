"""Each source's last read on the agent's /metrics: ``wattline_source_read_seconds{source}`` and
``wattline_source_read_success{source}``, as Prometheus reads them over HTTP.

Truth the test constructs: RAPL reads a powercap tree through a source whose read first sleeps
a known time, so its read lasts at least that and at most the tick the test timed around it;
the NIC source reads an interface whose ``rx_bytes`` holds no number (its channel's reading
fails, as a real read of a broken attribute does), then a number again; a third source raises
on every read.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from sysfs_trees import Iface, Zone, net_tree, powercap_tree, set_stat

from wattline.agent.exporter import AgentCollector, serve
from wattline.agent.sampler import Sampler
from wattline.agent.sources.base import Channel, Reading, Source
from wattline.agent.sources.nic import NicSource
from wattline.agent.sources.rapl import RaplSource

DELAY_S = 0.05


class SlowRapl(RaplSource):
    """The real RAPL source, each read after :data:`DELAY_S` of sleep."""

    def read(self) -> list[Reading]:
        time.sleep(DELAY_S)
        return super().read()


class Raising(Source):
    """A source whose every read raises (a broken library binding)."""

    name = "raising"

    def discover(self) -> list[Channel]:
        return []

    def read(self) -> list[Reading]:
        raise RuntimeError("device gone")


def last_reads(port: int) -> dict[tuple[str, str], float]:
    """(metric, source) -> value of the ``wattline_source_read_*`` series on /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (s.name, s.labels["source"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("wattline_source_read_")
        for s in family.samples
    }


def timed_tick(sampler: Sampler) -> float:
    """Seconds one tick took, by the test's own clock."""
    began = time.perf_counter()
    sampler.tick()
    return time.perf_counter() - began


def test_each_sources_last_read_duration_and_success_reach_metrics(tmp_path: Path) -> None:
    root = powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 10**6)])
    net_tree(root, [Iface("eth0")])
    rapl, nic = SlowRapl(root), NicSource(root)
    rapl.discover()
    nic.discover()
    sampler = Sampler([rapl, nic, Raising(root)], sink=lambda _samples: None)
    port = serve(AgentCollector(sampler), 0)
    assert last_reads(port) == {}  # nothing read yet: no series

    set_stat(root, "eth0", "rx_bytes", "garbage")
    tick_s = timed_tick(sampler)
    got = last_reads(port)
    seconds = {src: v for (name, src), v in got.items() if name == "wattline_source_read_seconds"}
    assert {src: v for (name, src), v in got.items() if name == "wattline_source_read_success"} == {
        "rapl": 1.0,
        "nic": 0.0,
        "raising": 0.0,
    }
    assert DELAY_S <= seconds["rapl"] <= tick_s
    assert all(v >= 0 for v in seconds.values())
    assert sum(seconds.values()) <= tick_s  # the reads are parts of the tick, one after another

    set_stat(root, "eth0", "rx_bytes", 1500)  # the attribute reads again: so does the source
    tick_s = timed_tick(sampler)
    got = last_reads(port)
    assert got[("wattline_source_read_success", "nic")] == 1.0
    assert got[("wattline_source_read_success", "raising")] == 0.0
    assert DELAY_S <= got[("wattline_source_read_seconds", "rapl")] <= tick_s

    sampler.set_sources([rapl], rapl.discover())  # sources no longer read lose their series
    assert {src for _name, src in last_reads(port)} == {"rapl"}
    rapl.close()
    nic.close()
