"""Wall-clock steps while sampling, with injected clocks: stamps never go backwards, tile
the timeline, slew back after a backward step, and no joule depends on the clock."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import pytest
from sysfs_trees import Zone, powercap_tree, set_energy

from wattline import wire
from wattline.agent import registry
from wattline.agent.clock import StampClock
from wattline.agent.sampler import Sampler

S = 1_000_000_000
T0 = 1_767_225_600 * S


class Clocks:
    """A monotonic and a wall clock the test moves; ``step`` moves only the wall one."""

    def __init__(self) -> None:
        self.mono = 5 * S
        self.wall = T0

    def advance(self, ns: int) -> None:
        self.mono += ns
        self.wall += ns

    def step(self, ns: int) -> None:
        self.wall += ns

    def stamp_clock(self, slew: float = 0.01) -> StampClock:
        return StampClock(wall=lambda: self.wall, mono=lambda: self.mono, slew=slew)


def test_steady_clock_stamps_are_the_wall_clock() -> None:
    c = Clocks()
    clock = c.stamp_clock()
    for _ in range(5):
        c.advance(S // 10)
        mono, stamp = clock.now()
        assert (mono, stamp) == (c.mono, c.wall)
    assert (clock.offset_ns, clock.steps) == (0, 0)


def test_forward_step_reanchors(caplog: pytest.LogCaptureFixture) -> None:
    c = Clocks()
    clock = c.stamp_clock()
    c.advance(S)
    _, before = clock.now()
    c.step(3600 * S)
    c.advance(S)
    with caplog.at_level(logging.WARNING):
        _, after = clock.now()
    assert after == c.wall and after - before == 3601 * S
    assert (clock.offset_ns, clock.steps) == (0, 1)
    assert "stepped forward by 3600.000 s" in caplog.text


def test_small_forward_jitter_is_not_a_step() -> None:
    c = Clocks()
    clock = c.stamp_clock()
    c.step(S // 2)
    c.advance(S)
    _, stamp = clock.now()
    assert stamp == T0 + S  # still on the monotonic timeline
    assert clock.offset_ns == S // 2 and clock.steps == 0


def test_backward_step_never_goes_back_and_slews_home(caplog: pytest.LogCaptureFixture) -> None:
    c = Clocks()
    clock = c.stamp_clock(slew=0.01)
    c.advance(S)
    last = clock.now()[1]
    c.step(-10 * S)
    stamps = [last]
    with caplog.at_level(logging.WARNING):
        for _ in range(1100):  # 1100 s at 1 Hz
            c.advance(S)
            _mono, stamp = clock.now()
            stamps.append(stamp)
    assert "stepped backward by 10.000 s; timestamps slew back to it at 1 % (1000 s)" in caplog.text
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert min(gaps) >= 0.99 * S and max(gaps) <= S  # forward always, at most 1 % slower
    assert clock.offset_ns == 0 and stamps[-1] == c.wall  # rejoined the wall clock
    assert stamps[999] > c.wall - 101 * S  # not before ~1000 s
    assert clock.steps == 1


def test_backward_then_forward_correction_rejoins_without_a_jump() -> None:
    c = Clocks()
    clock = c.stamp_clock()
    c.advance(S)
    clock.now()
    c.step(-5 * S)
    c.advance(S)
    _, ahead = clock.now()
    assert clock.offset_ns < -4 * S
    c.step(5 * S)  # NTP puts it right again
    c.advance(S)
    _, stamp = clock.now()
    assert stamp - ahead == S  # no spike, no re-anchoring
    assert clock.offset_ns == S // 100  # the 1 % slewed during the backward tick


def test_without_slew_the_lead_is_kept() -> None:
    c = Clocks()
    clock = c.stamp_clock(slew=0.0)
    c.step(-2 * S)
    for _ in range(100):
        c.advance(S)
        clock.now()
    assert clock.offset_ns == -2 * S
    with pytest.raises(ValueError, match="slew"):
        StampClock(slew=1.0)


def test_sampler_tiles_and_keeps_every_joule_across_steps(tmp_path: Path) -> None:
    """RAPL counters at 40 W on a sysfs tree; the wall clock jumps back and forth meanwhile."""
    powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 0)])
    (status,) = registry.discover(["rapl"], tmp_path, {}, {})
    assert status.source is not None
    samples: list[wire.pb.Sample] = []
    c = Clocks()
    sampler = Sampler([status.source], samples.extend, c.stamp_clock())
    counter_uj = 0
    sampler.tick()
    steps = {20: -30 * S, 40: 7200 * S, 60: -S // 2, 80: -3600 * S}
    for i in range(1, 101):
        if i in steps:
            c.step(steps[i])
        c.advance(S // 10)
        counter_uj += 4_000_000  # 40 W x 0.1 s
        set_energy(tmp_path, "intel-rapl:0", counter_uj)
        sampler.tick()
    status.source.close()
    assert len(samples) == 100
    for a, b in itertools.pairwise(samples):
        assert b.start_ns == a.end_ns and b.end_ns > b.start_ns  # tiled, strictly forward
    assert sum(s.energy_j for s in samples) == pytest.approx(400.0, rel=1e-12)
    assert all(s.power_w == pytest.approx(40.0) for s in samples)  # monotonic interval lengths
    assert samples[-1].cumulative_j == pytest.approx(400.0, rel=1e-12)
