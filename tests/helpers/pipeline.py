"""A synthetic host for end-to-end tests: a RAPL sysfs tree with counters of known power,
sampled by the real agent pipeline on a test-driven clock, shipped to a real collector.

Time is synthetic (the sampler's clock is driven by :meth:`SyntheticHost.advance`), so the
energy between any two instants is known exactly: the tests compare to the joule.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from sysfs_trees import INTEL_RANGE_UJ, Zone, powercap_tree, set_energy

from wattline.agent import registry
from wattline.agent.clock import StampClock
from wattline.agent.sampler import Sampler
from wattline.agent.spool.memory import MemorySpool
from wattline.agent.uplink import Uplink
from wattline.wire import Host

T0_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z: far from "now", so nothing else collides


@dataclass
class ZoneSpec:
    """One RAPL zone with a constant power (W) and a starting counter value (uJ)."""

    zone: str
    name: str
    power_w: float
    start_uj: int = 0
    range_uj: int = INTEL_RANGE_UJ


@dataclass
class SyntheticHost:
    """A host whose only source is RAPL on a temp tree, with a synthetic clock."""

    root: Path
    host_id: str
    zones: list[ZoneSpec]
    collector: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    t_ns: int = T0_NS

    def __post_init__(self) -> None:
        powercap_tree(self.root, [Zone(z.zone, z.name, z.start_uj, z.range_uj) for z in self.zones])
        self.counters = {z.zone: z.start_uj for z in self.zones}
        self.energy_j = {z.zone: 0.0 for z in self.zones}
        statuses = registry.discover(["rapl"], self.root, {}, {})
        self.sources = [s.source for s in statuses if s.source is not None]
        assert self.sources, statuses[0].reason
        self.spool = MemorySpool(Host(host_id=self.host_id, labels=self.labels, agent_version="test"))
        clock = StampClock(wall=lambda: self.t_ns, mono=lambda: self.t_ns - T0_NS)
        self.sampler = Sampler(self.sources, self.spool.add_samples, clock)
        self.uplink = Uplink(self.spool, [self.collector], timeout_s=10) if self.collector else None
        self.sampler.tick()  # baseline

    def advance(self, seconds: float, ticks: int = 1) -> None:
        """Let ``seconds`` pass in ``ticks`` equal steps, sampling after each."""
        step_ns = round(seconds * 1e9 / ticks)
        for _ in range(ticks):
            self.t_ns += step_ns
            for z in self.zones:
                delta_uj = round(z.power_w * step_ns / 1e3)
                self.counters[z.zone] = (self.counters[z.zone] + delta_uj) % z.range_uj
                self.energy_j[z.zone] += delta_uj / 1e6
                set_energy(self.root, z.zone, self.counters[z.zone])
            self.sampler.tick()

    def ship(self) -> None:
        """Seal and deliver everything sampled so far; fails if the collector does not ack."""
        assert self.uplink is not None
        self.spool.seal()
        self.uplink.drain()
        assert self.spool.backlog() == 0

    def close(self) -> None:
        if self.uplink is not None:
            self.uplink.close()
        for source in self.sources:
            source.close()


def equal_share_truth(windows: dict[str, tuple[int, int]], power_w: float) -> dict[str, float]:
    """Each job's joules under the equal-share rule on a host drawing ``power_w``: every piece of
    time between job edges (ns) split equally among the jobs whose window covers it."""
    truth = dict.fromkeys(windows, 0.0)
    for a, b in itertools.pairwise(sorted({t for w in windows.values() for t in w})):
        active = [j for j, (start, end) in windows.items() if start <= a and b <= end]
        for j in active:
            truth[j] += power_w * (b - a) / 1e9 / len(active)
    return truth
