"""The counter module: wrap, reset, plausibility, power integration, never negative."""

from __future__ import annotations

import math

import pytest

from wattline.agent.counter import MAX_GAP_S, EnergyCounter, wrap_period_s
from wattline.agent.sources.base import Channel, Reading
from wattline.quality import Quality

RAPL = Channel("rapl", "cpu_package", "package-0", Quality.COUNTER, 1e-6, 262143328850, 95.0)


def feed(counter: EnergyCounter, values: list[tuple[float, Reading]]) -> list[float | None]:
    out: list[float | None] = []
    for t, reading in values:
        delta = counter.update(reading, t)
        out.append(None if delta is None else delta.energy_j)
    return out


def test_counter_difference_scaled_to_joules() -> None:
    c = EnergyCounter(RAPL)
    got = feed(c, [(0.0, Reading(RAPL, energy_raw=1_000_000)), (1.0, Reading(RAPL, energy_raw=51_000_000))])
    assert got == [None, 50.0]
    assert c.cumulative_j == 50.0


def test_wrap_uses_max_energy_range() -> None:
    c = EnergyCounter(RAPL)
    top = RAPL.counter_max
    assert top is not None
    got = feed(c, [(0.0, Reading(RAPL, energy_raw=top - 10_000_000)), (1.0, Reading(RAPL, energy_raw=30_000_000))])
    assert got[1] == pytest.approx(40.0, abs=1e-9)


def test_implausible_wrap_is_a_reset_and_counts_nothing() -> None:
    c = EnergyCounter(RAPL)
    got = feed(c, [(0.0, Reading(RAPL, energy_raw=200_000_000_000)), (1.0, Reading(RAPL, energy_raw=5_000_000))])
    delta = c.update(Reading(RAPL, energy_raw=15_000_000), 2.0)
    assert got[1] == 0.0
    assert delta is not None and delta.energy_j == pytest.approx(10.0)
    assert c.cumulative_j == pytest.approx(10.0)


def test_reset_without_wrap_range_is_never_negative() -> None:
    gpu = Channel("nvml", "gpu", "GPU-1", Quality.COUNTER, 1e-3, None, 700.0)
    c = EnergyCounter(gpu)
    got = feed(c, [(0.0, Reading(gpu, energy_raw=5_000_000)), (1.0, Reading(gpu, energy_raw=1000))])
    assert got == [None, 0.0]
    assert c.update(Reading(gpu, energy_raw=2000), 2.0).energy_j == pytest.approx(1.0)  # type: ignore[union-attr]


def test_absurd_jump_is_flagged_not_counted() -> None:
    c = EnergyCounter(RAPL)
    c.update(Reading(RAPL, energy_raw=0), 0.0)
    delta = c.update(Reading(RAPL, energy_raw=50_000_000_000), 1.0)  # 50 kJ in 1 s
    assert delta is not None and delta.energy_j == 0.0 and not delta.healthy
    assert "implausible" in delta.status


def test_failed_reads_keep_the_baseline_and_the_next_good_read_spans_the_gap() -> None:
    c = EnergyCounter(RAPL)
    c.update(Reading(RAPL, energy_raw=0), 0.0)
    assert c.update(Reading(RAPL, energy_raw=10_000_000), 1.0).energy_j == pytest.approx(10.0)  # type: ignore[union-attr]
    assert c.update(Reading(RAPL, error="bad value"), 2.0) is None
    assert c.update(Reading(RAPL, error="cannot read"), 3.0) is None
    assert c.gap_reads == 2
    d = c.update(Reading(RAPL, energy_raw=40_000_000), 4.0)
    assert d is not None and d.energy_j == pytest.approx(30.0) and d.interval_s == 3.0 and d.healthy
    assert d.status == "gap: 3.0 s without a reading" and c.gap_reads == 0
    assert c.cumulative_j == pytest.approx(40.0)


def test_plausibility_and_wrap_scale_with_the_gap() -> None:
    c = EnergyCounter(RAPL)  # 95 W bound: 142.5 W plausible
    top = RAPL.counter_max
    assert top is not None
    c.update(Reading(RAPL, energy_raw=top - 100_000_000), 0.0)
    for t in range(1, 10):
        c.update(Reading(RAPL, error="N/A"), float(t))
    d = c.update(Reading(RAPL, energy_raw=900_000_000), 10.0)  # 1000 J in 10 s across a wrap: 100 W
    assert d is not None and d.energy_j == pytest.approx(1000.0) and d.status.startswith("gap: 10.0 s")
    c.update(Reading(RAPL, error="N/A"), 11.0)
    d = c.update(Reading(RAPL, energy_raw=2_900_000_000), 12.0)  # 2000 J in 2 s: absurd even over the gap
    assert d is not None and d.energy_j == 0.0 and not d.healthy
    assert d.status == "implausible 1000 W; gap: 2.0 s without a reading"


def test_gap_longer_than_the_wrap_period_says_wraps_may_be_missing() -> None:
    small = Channel("rapl", "dram", "package-0/dram", Quality.COUNTER, 1e-6, 150_000_000, 100.0)  # 150 J: 1 s
    assert wrap_period_s(small) == pytest.approx(1.0)
    c = EnergyCounter(small)
    c.update(Reading(small, energy_raw=0), 0.0)
    c.update(Reading(small, error="EIO"), 0.5)
    d = c.update(Reading(small, energy_raw=50_000_000), 2.0)
    assert d is not None and d.energy_j == pytest.approx(50.0)
    assert d.status.endswith("longer than the counter's wrap period (1 s): whole wraps may be missing")


def test_a_gap_is_given_up_past_its_limit_or_at_the_final_read() -> None:
    c = EnergyCounter(RAPL)  # wrap period 262143 J / 142.5 W = 1840 s: MAX_GAP_S is the limit
    c.update(Reading(RAPL, energy_raw=0), 0.0)
    assert c.update(Reading(RAPL, error="EIO"), MAX_GAP_S - 1) is None
    given_up = c.update(Reading(RAPL, error="EIO"), MAX_GAP_S)
    assert given_up is not None and given_up.interval_s == MAX_GAP_S and given_up.energy_j == 0.0
    assert (given_up.healthy, given_up.status, c.gap_reads) == (False, "EIO", 0)
    assert c.update(Reading(RAPL, energy_raw=5_000_000), MAX_GAP_S + 1) is None  # a new baseline
    c.update(Reading(RAPL, energy_raw=6_000_000), MAX_GAP_S + 2)
    last = c.update(Reading(RAPL, error="GPU is lost"), MAX_GAP_S + 3, final=True)
    assert last is not None and last.energy_j == 0.0 and not last.healthy and last.status == "GPU is lost"
    assert c.cumulative_j == pytest.approx(1.0)


def test_power_channel_cannot_recover_a_gap_and_invents_nothing() -> None:
    ch = Channel("nvml", "gpu", "GPU-0", Quality.INTEGRATED, max_power_w=700.0)
    c = EnergyCounter(ch)
    c.update(Reading(ch, power_w=100.0), 0.0)
    bad = c.update(Reading(ch, error="GPU is lost"), 1.0)
    assert bad is not None and bad.energy_j == 0.0 and not bad.healthy and bad.status == "GPU is lost"
    assert c.gap_reads == 0
    d = c.update(Reading(ch, power_w=100.0), 2.0)  # no previous power: rectangle over this interval only
    assert d is not None and d.energy_j == pytest.approx(100.0) and d.interval_s == 1.0


def test_power_trapezoid_and_bounds() -> None:
    ch = Channel("neuron", "accelerator", "neuron0", Quality.MODEL, max_power_w=500.0)
    c = EnergyCounter(ch)
    c.update(Reading(ch, power_w=100.0), 0.0)
    d = c.update(Reading(ch, power_w=200.0, power_bounds_w=(150.0, 250.0)), 2.0)
    assert d is not None
    assert d.energy_j == pytest.approx(300.0)
    assert d.energy_error_j == pytest.approx(200.0)  # max(|250-150|, |150-150|) x 2 s


@pytest.mark.parametrize("bad", [math.nan, -5.0, 50_000.0])
def test_bad_power_never_counts(bad: float) -> None:
    ch = Channel("nvml", "gpu", "GPU-0", Quality.INTEGRATED, max_power_w=700.0)
    c = EnergyCounter(ch)
    c.update(Reading(ch, power_w=100.0), 0.0)
    d = c.update(Reading(ch, power_w=bad), 1.0)
    assert d is not None and d.energy_j == 0.0 and not d.healthy
    assert c.cumulative_j == 0.0


def test_model_energy_per_interval() -> None:
    ch = Channel("nic", "nic", "eth0", Quality.MODEL, max_power_w=50.0)
    c = EnergyCounter(ch)
    assert c.update(Reading(ch, energy_j=0.0), 0.0) is None
    d = c.update(Reading(ch, energy_j=3.5), 1.0)
    assert d is not None and d.energy_j == 3.5 and d.power_w == 3.5


def test_a_short_interval_that_sees_a_whole_step_of_a_stepping_counter_counts_it() -> None:
    """An NVML energy counter steps about every 100 ms: an edge tick 1 ms after a regular tick
    may see a whole step (60 J at 600 W), 60 kW over its millisecond. Against the bound over the
    interval alone (700 W limit x 1.5 x 1.5 over 1 ms) it was "implausible": 0 J, unhealthy, the
    step's energy lost. Over the interval plus one step it counts; the truth is the counter's."""
    gpu = Channel("nvml", "gpu", "GPU-0", Quality.COUNTER, 1e-3, None, 700.0 * 1.5, counter_step_s=0.2)
    power_w, step_s = 600.0, 0.1

    def raw(t: float) -> int:  # mJ at the last step before t
        return int(power_w * 1e3 * step_s * math.floor(t / step_s + 1e-9))

    times = [0.0, 0.05, 0.0995, 0.1005, 0.15, 0.1999, 0.2001, 0.2002, 0.3, 0.30001]
    c = EnergyCounter(gpu)
    deltas = [c.update(Reading(gpu, energy_raw=raw(t)), t) for t in times]
    got = [d for d in deltas if d is not None]
    assert all(d.healthy and not d.status for d in got), [(d.energy_j, d.status) for d in got]
    assert math.fsum(d.energy_j for d in got) == pytest.approx((raw(times[-1]) - raw(0.0)) * 1e-3)
    assert [round(d.energy_j, 6) for d in got] == [0.0, 0.0, 60.0, 0.0, 0.0, 60.0, 0.0, 60.0, 0.0]
    # a delta no step can explain is still absurd: 400 J within 1 ms, over 1050 W x 1.5 x 0.201 s
    absurd = c.update(Reading(gpu, energy_raw=raw(0.30001) + 400_000), 0.30101)
    assert absurd is not None and absurd.energy_j == 0.0 and not absurd.healthy
    assert absurd.status.startswith("implausible")
