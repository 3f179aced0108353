"""LiveStreams on synthetic batches: duplicates flagged once, restarts not, memory bounded."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, Gauge

from wattline import wire
from wattline.collector.livestreams import LiveStreams

S = 10**9
TIMEOUT_S = 120.0


def batch(host: str, stream: str, start_s: float, end_s: float, samples: bool = True) -> wire.pb.Batch:
    """A batch of one tick per second from ``start_s`` to ``end_s`` (sample times, seconds)."""
    out = wire.Batch(stream_id=stream, seq=1, host=wire.Host(host_id=host))
    if samples:
        t = start_s
        while t < end_s:
            out.samples.add(source="rapl", component="cpu_package", device="package-0", start_ns=int(t * S))
            out.samples[-1].end_ns = int((t + 1) * S)
            t += 1
    else:
        out.job_events.add(job_id="j", time_ns=int(start_s * S))
    return out


class Rig:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.per_host = Gauge("dup", "d", ["host"], registry=self.registry)
        self.hosts = Gauge("dup_hosts", "d", registry=self.registry)
        self.live = LiveStreams(self.per_host, self.hosts, timeout_s=TIMEOUT_S, max_streams=3)

    def value(self, host: str) -> float | None:
        return self.registry.get_sample_value("dup", {"host": host})

    def flagged(self) -> float | None:
        return self.registry.get_sample_value("dup_hosts")


def test_two_live_streams_overlapping_in_time_are_flagged_once(caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig()
    caplog.set_level(logging.INFO)
    for n in range(10):  # two agents, batches interleaved, same sample times
        rig.live.seen(batch("h", "a", 10 * n, 10 * n + 10), now=n)
        rig.live.seen(batch("h", "b", 10 * n + 0.5, 10 * n + 10.5), now=n + 0.5)
    rig.live.seen(batch("other", "c", 0, 100), now=10)
    assert rig.value("h") == 2 and rig.value("other") is None and rig.flagged() == 1
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "host 'h': 2 agent streams" in caplog.text
    # b stops; once it has not been heard for the timeout, h is cleared (series removed)
    rig.live.seen(batch("h", "a", 100, 110), now=100)
    rig.live.sweep(now=100)
    assert rig.value("h") == 2
    rig.live.seen(batch("h", "a", 110, 120), now=TIMEOUT_S + 20)
    rig.live.sweep(now=TIMEOUT_S + 20)
    assert rig.value("h") is None and rig.flagged() == 0
    assert "host 'h': one agent stream again" in caplog.text


def test_restart_is_no_duplicate() -> None:
    rig = Rig()
    rig.live.seen(batch("h", "old", 0, 10), now=0)
    rig.live.seen(batch("h", "old", 10, 20), now=10)
    rig.live.seen(batch("h", "new", 20, 30), now=11)  # starts where the old one stopped
    rig.live.seen(batch("h", "new", 30, 40), now=21)
    rig.live.seen(batch("h", "old", 15, 20), now=22)  # a resent batch of the old stream
    assert rig.value("h") is None and rig.flagged() == 0


def test_job_event_batches_are_not_streams() -> None:
    rig = Rig()
    rig.live.seen(batch("h", "agent", 0, 50), now=0)
    rig.live.seen(batch("h", "wattline-run", 10, 20, samples=False), now=1)
    assert rig.value("h") is None


def test_memory_is_bounded_per_host_and_idle_hosts_are_forgotten() -> None:
    rig = Rig()
    for n in range(50):  # fifty restarts of one host, and fifty hosts
        rig.live.seen(batch("h", f"s{n}", 10 * n, 10 * n + 10), now=n)
        rig.live.seen(batch(f"h{n}", "s", 0, 10), now=n)
    assert len(rig.live._spans["h"]) == 3
    rig.live.sweep(now=48.5 + TIMEOUT_S)
    assert set(rig.live._spans) == {"h", "h49"}  # the hosts heard from in the last TIMEOUT_S
    assert len(rig.live._spans["h"]) == 1
    rig.live.sweep(now=100 + TIMEOUT_S)
    assert rig.live._spans == {}
