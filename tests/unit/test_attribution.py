"""Window energy, the cumulative O(1) path, sharing between jobs, idle and coverage."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wattline.accounting.attribution import (
    Attribution,
    ChannelEnergy,
    IdlePolicy,
    JobWindow,
    ShareRule,
    UseInterval,
    UseTimeline,
    split_shared,
)
from wattline.accounting.coverage import coverage
from wattline.accounting.device_shares import device_shares
from wattline.accounting.window_energy import (
    EdgeSample,
    Interval,
    cumulative_window_energy,
    find_edges,
    window_energy,
)
from wattline.quality import Quality

NS = 1_000_000_000

# ------------------------------------------------------------------ window_energy

SERIES = [(0, 10, 10.0), (10, 20, 20.0), (25, 30, 5.0)]  # a gap in (20, 25]


def test_window_energy_exact_with_straddles_and_a_gap() -> None:
    assert window_energy(SERIES, 5, 27) == 5.0 + 20.0 + 2.0
    assert window_energy(SERIES, 0, 30) == 35.0
    assert window_energy(SERIES, -100, 100) == 35.0
    assert window_energy(SERIES, 21, 24) == 0.0  # inside the gap
    assert window_energy(SERIES, 10, 20) == 20.0


def test_window_energy_sample_straddling_both_edges() -> None:
    assert window_energy([(0, 8, 8.0)], 2, 6) == 4.0
    assert window_energy([(0, 8, 1.0)], 1, 3) == 0.25


def test_window_energy_zero_length() -> None:
    assert window_energy(SERIES, 7, 7) == 0.0
    point = [(10, 10, 3.0)]
    assert window_energy(point, 5, 10) == 3.0  # keyed by its end: (t0, t1]
    assert window_energy(point, 10, 15) == 0.0
    assert window_energy([], 0, 10) == 0.0


def test_window_energy_accepts_intervals_and_rejects_bad_input() -> None:
    assert window_energy([Interval(*s) for s in SERIES], 5, 27) == 27.0
    with pytest.raises(ValueError):
        window_energy(SERIES, 5, 4)
    with pytest.raises(ValueError):
        window_energy([(5, 4, 1.0)], 0, 10)
    with pytest.raises(ValueError):
        Interval(5, 4, 1.0)


# ------------------------------------------------------------------ cumulative path


def stream(samples: list[tuple[int, int, float]], name: str, offset: float = 0.0) -> list[EdgeSample]:
    out: list[EdgeSample] = []
    cum = offset
    for start, end, e in samples:
        cum += e
        out.append(EdgeSample(start, end, e, cum, name))
    return out


def cumulative(samples: list[EdgeSample], t0: int, t1: int) -> float | None:
    return cumulative_window_energy(*find_edges(samples, t0), *find_edges(samples, t1), t0, t1)


EDGE = stream([(0, 10, 10.0), (10, 20, 20.0), (25, 30, 5.0), (30, 40, 7.5), (42, 43, 1.0)], "A", offset=100.0)


def test_find_edges() -> None:
    assert find_edges(EDGE, 15) == (EDGE[0], EDGE[1])
    assert find_edges(EDGE, 20) == (EDGE[1], EDGE[2])
    assert find_edges(EDGE, -1) == (None, EDGE[0])
    assert find_edges(EDGE, 43) == (EDGE[-1], None)
    assert find_edges([], 0) == (None, None)


@pytest.mark.parametrize("t0", range(-2, 46, 3))
@pytest.mark.parametrize("t1_offset", [0, 1, 4, 9, 17, 50])
def test_cumulative_equals_window_energy(t0: int, t1_offset: int) -> None:
    t1 = t0 + t1_offset
    plain = [(s.start_ns, s.end_ns, s.energy_j) for s in EDGE]
    assert cumulative(EDGE, t0, t1) == pytest.approx(window_energy(plain, t0, t1), abs=1e-9)


def test_cumulative_of_no_samples_is_zero() -> None:
    assert cumulative([], 0, 10) == 0.0


def test_restart_inside_the_window_gives_none() -> None:
    a = stream([(0, 10, 10.0), (10, 20, 10.0)], "A", offset=50.0)
    b = stream([(25, 35, 4.0), (35, 45, 4.0)], "B")
    both = a + b
    assert cumulative(both, 5, 40) is None
    plain = [(s.start_ns, s.end_ns, s.energy_j) for s in both]
    assert window_energy(plain, 5, 40) == 5.0 + 10.0 + 4.0 + 2.0
    # Windows within one stream, or ending/starting in the restart gap, need no fallback.
    assert cumulative(both, 30, 40) == pytest.approx(4.0)
    assert cumulative(both, 5, 22) == pytest.approx(15.0)
    assert cumulative(both, 22, 30) == pytest.approx(2.0)


def test_cumulative_counts_samples_missing_from_the_store() -> None:
    full = stream([(0, 10, 10.0), (10, 20, 30.0), (20, 30, 10.0)], "A")
    stored = [full[0], full[2]]  # the middle sample was lost
    assert cumulative(stored, 0, 30) == pytest.approx(50.0)
    assert cumulative(stored, 5, 15) == pytest.approx(5.0 + 15.0)  # lost energy spread over its gap
    assert window_energy([(s.start_ns, s.end_ns, s.energy_j) for s in stored], 0, 30) == 20.0


# ------------------------------------------------------------------ split_shared

H = "host-1"


def chan(component: str, device: str, samples: list[tuple[int, int, float]], **kw: object) -> ChannelEnergy:
    host = str(kw.pop("host", H))
    quality = kw.pop("quality", Quality.COUNTER)
    assert isinstance(quality, Quality)
    keys = kw.pop("keys", frozenset())
    assert isinstance(keys, frozenset)
    return ChannelEnergy(host, component, device, quality, [Interval(*s) for s in samples], keys)


def per_second(n: int, watts: float) -> list[tuple[int, int, float]]:
    return [(i * NS, (i + 1) * NS, watts) for i in range(n)]


def job(job_id: str, start_s: float, end_s: float, *devices: str, host: str = H) -> JobWindow:
    return JobWindow(job_id, host, round(start_s * NS), round(end_s * NS), frozenset(devices))


def conserved(attr: Attribution, host: str = H) -> None:
    jobs = math.fsum(attr.by_job(host).values())
    assert attr.node_total_j(host) == pytest.approx(jobs + attr.unattributed_j(host) + attr.excluded_idle_j(host))


def test_single_job_gets_its_window_and_its_devices() -> None:
    chans = [chan("cpu_package", "package-0", per_second(10, 100.0)), chan("gpu", "0", per_second(10, 300.0))]
    attr = split_shared(chans, [job("j", 2, 6.5, "gpu:0")], "equal")
    assert attr.by_job() == {"j": pytest.approx(4.5 * 400)}
    assert attr.unattributed_j() == pytest.approx(5.5 * 400)
    assert attr.node_total_j() == pytest.approx(4000.0)
    conserved(attr)


def test_unclaimed_device_is_unattributed() -> None:
    chans = [chan("gpu", "0", per_second(4, 300.0)), chan("gpu", "1", per_second(4, 200.0))]
    attr = split_shared(chans, [job("j", 0, 4, "gpu:0")])
    assert attr.by_job() == {"j": pytest.approx(1200.0)}
    assert attr.unattributed_j() == pytest.approx(800.0)


def test_equal_rule_splits_host_wide_energy_among_active_jobs() -> None:
    chans = [chan("dram", "package-0", per_second(4, 40.0)), chan("gpu", "0", per_second(4, 300.0))]
    jobs = [job("a", 0, 4, "gpu:0"), job("b", 2, 4)]
    attr = split_shared(chans, jobs, "equal")
    assert attr.by_job() == {"a": pytest.approx(80 + 40 + 1200), "b": pytest.approx(40.0)}
    assert attr.unattributed_j() == pytest.approx(0.0)
    conserved(attr)


def test_device_share_rule() -> None:
    chans = [chan("cpu_package", "package-0", per_second(1, 100.0))]
    jobs = [job("a", 0, 1, "gpu:0", "gpu:1", "gpu:2"), job("b", 0, 1, "gpu:3")]
    attr = split_shared(chans, jobs, "device-share")
    assert attr.by_job() == {"a": pytest.approx(75.0), "b": pytest.approx(25.0)}
    jobs.append(job("c", 0, 1))  # no devices: 10 % between the jobs without devices
    attr = split_shared(chans, jobs, ShareRule("device-share", deviceless_fraction=0.1))
    assert attr.by_job() == {"a": pytest.approx(67.5), "b": pytest.approx(22.5), "c": pytest.approx(10.0)}
    only_deviceless = [job("x", 0, 1), job("y", 0, 1)]
    assert split_shared(chans, only_deviceless, "device-share").by_job() == {
        "x": pytest.approx(50.0),
        "y": pytest.approx(50.0),
    }


def test_exclusive_rule_leaves_concurrent_energy_unattributed() -> None:
    chans = [chan("psys", "psys", per_second(4, 50.0))]
    attr = split_shared(chans, [job("a", 0, 3), job("b", 2, 4)], "exclusive")
    assert attr.by_job() == {"a": pytest.approx(100.0), "b": pytest.approx(50.0)}
    assert attr.unattributed_j() == pytest.approx(50.0)
    conserved(attr)


def test_job_boundaries_inside_a_sample_are_pro_rata() -> None:
    chans = [chan("cpu_package", "package-0", [(0, 10 * NS, 100.0)])]
    attr = split_shared(chans, [job("a", 2.5, 10), job("b", 5, 7.5)], "equal")
    assert attr.by_job() == {"a": pytest.approx(25.0 + 12.5 + 25.0), "b": pytest.approx(12.5)}
    assert attr.unattributed_j() == pytest.approx(25.0)


def test_shared_neuron_device_is_split_by_claimed_cores() -> None:
    cores = frozenset({"neuroncore:0", "neuroncore:1"})
    chans = [chan("accelerator", "neuron0", per_second(2, 90.0), keys=cores)]
    attr = split_shared(chans, [job("a", 0, 2, "neuroncore:0"), job("b", 0, 1, "neuroncore:1")])
    assert attr.by_job() == {"a": pytest.approx(45.0 + 90.0), "b": pytest.approx(45.0)}


def test_a_shared_devices_span_is_the_jobs_first_start_to_last_end() -> None:
    """A GPU at 200 W in 1 s samples; a [0.3, 5.7] s uses 30 %, b [2.2, 6.4] s 10 %, a
    process of no job 10 % throughout; each job's one use period spans its window (its
    device_use the mean of all three over it). By rate: alone, a gets 30/40 of 380 J; both
    running, a 30/50 and b 10/50 of 700 J; b alone 10/20 of 140 J. Over the span [0.3, 6.4] s:
    1220 J = a's 705 + b's 210 + 305 no job was charged. The parts of the straddling samples
    outside the span are none of it (counted in, the span was 1400 J)."""
    gpu = chan("gpu", "0", per_second(7, 200.0))
    a0, a1, b0, b1 = 0.3, 5.7, 2.2, 6.4
    both = a1 - b0
    a_dev = 30 + 10 * both / (a1 - a0) + 10
    b_dev = 10 + 30 * both / (b1 - b0) + 10
    use = {
        "a": {"gpu:0": UseTimeline([UseInterval(int(a0 * NS), int(a1 * NS), 30.0, a_dev, "sm")])},
        "b": {"gpu:0": UseTimeline([UseInterval(int(b0 * NS), int(b1 * NS), 10.0, b_dev, "sm")])},
    }
    jobs = [JobWindow("a", H, int(a0 * NS), int(a1 * NS), uses=use["a"]),
            JobWindow("b", H, int(b0 * NS), int(b1 * NS), uses=use["b"])]  # fmt: skip
    attr = split_shared([gpu], jobs)
    [share] = device_shares(attr, ["a"], [gpu], (int(a0 * NS), int(a1 * NS)), use["a"], (int(a0 * NS), int(b1 * NS)))
    assert (share.basis, share.energy_j, share.device_energy_j) == (
        "measured share",
        pytest.approx(380 * 30 / 40 + 700 * 30 / 50),
        pytest.approx(1080.0),
    )
    assert share.span_energy_j == pytest.approx(1220.0)
    assert share.unattributed_j == pytest.approx(1220.0 - 705.0 - 210.0)
    assert attr.by_job()["b"] == pytest.approx(700 * 10 / 50 + 140 * 10 / 20)


def test_hosts_are_independent() -> None:
    chans = [chan("cpu", "cpu", per_second(2, 10.0)), chan("cpu", "cpu", per_second(2, 20.0), host="host-2")]
    attr = split_shared(chans, [job("a", 0, 2), job("a", 0, 1, host="host-2")])
    assert attr.job_total_j("a") == pytest.approx(40.0)
    assert attr.job_total_j("a", host="host-2") == pytest.approx(20.0)
    assert attr.unattributed_j("host-2") == pytest.approx(20.0)


def test_zero_length_sample_goes_to_the_job_active_at_its_end() -> None:
    chans = [chan("nic", "eth0", [(5, 5, 2.0), (20, 20, 4.0)])]
    attr = split_shared(chans, [job("a", 0, 10e-9)])
    assert attr.by_job() == {"a": 2.0}
    assert attr.unattributed_j() == 4.0


def test_idle_subtract() -> None:
    # 100 W then 30 W against a 50 W idle baseline: dynamic 50 J then 0 (never negative).
    chans = [chan("cpu_package", "package-0", [(0, NS, 100.0), (NS, 2 * NS, 30.0)])]
    idle = IdlePolicy("subtract", {(H, "cpu_package", "package-0"): 50.0})
    attr = split_shared(chans, [job("a", 0, 2)], idle=idle)
    assert attr.by_job() == {"a": pytest.approx(50.0)}
    assert attr.node_idle_j() == pytest.approx(80.0)
    assert attr.excluded_idle_j() == pytest.approx(80.0)
    (share,) = attr.shares
    assert (share.energy_j, share.dynamic_j, share.idle_j) == pytest.approx((130.0, 50.0, 80.0))
    conserved(attr)
    total = split_shared(chans, [job("a", 0, 2)], idle=IdlePolicy("none", idle.baseline_w))
    assert total.by_job() == {"a": pytest.approx(130.0)}
    assert total.shares[0].dynamic_j == pytest.approx(50.0)  # both totals are available
    conserved(total)


def test_job_by_quality_and_bad_rules() -> None:
    chans = [chan("gpu", "0", per_second(1, 300.0)), chan("nic", "eth0", per_second(1, 10.0), quality=Quality.MODEL)]
    attr = split_shared(chans, [job("a", 0, 1, "gpu:0")])
    assert attr.job_by_quality("a") == {Quality.COUNTER: 300.0, Quality.MODEL: 10.0}
    with pytest.raises(ValueError):
        split_shared(chans, [], "fair")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ShareRule("device-share", deviceless_fraction=1.5)
    with pytest.raises(ValueError):
        IdlePolicy("sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        JobWindow("j", H, 2, 1)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[ChannelEnergy], list[JobWindow]]:
    hosts = ["h1", "h2"][: draw(st.integers(1, 2))]
    channels: list[ChannelEnergy] = []
    jobs: list[JobWindow] = []
    for host in hosts:
        n_gpus = draw(st.integers(0, 3))
        names = [("cpu_package", "package-0"), ("dram", "package-0")] + [("gpu", str(g)) for g in range(n_gpus)]
        for component, device in names:
            t = draw(st.integers(0, 5))
            intervals = []
            for _ in range(draw(st.integers(0, 8))):
                t += draw(st.integers(0, 3))  # a gap
                length = draw(st.integers(0, 7))
                energy = draw(st.floats(0, 500, allow_nan=False, allow_infinity=False))
                intervals.append(Interval(t, t + length, energy))
                t += length
            channels.append(ChannelEnergy(host, component, device, Quality.COUNTER, intervals))
        for k in range(draw(st.integers(0, 4))):
            start = draw(st.integers(0, 40))
            end = start + draw(st.integers(0, 30))
            devices = draw(st.sets(st.sampled_from([f"gpu:{g}" for g in range(4)]), max_size=3))
            jobs.append(JobWindow(f"{host}-j{k}", host, start, end, frozenset(devices)))
    return channels, jobs


@settings(max_examples=300, deadline=None)
@given(
    scenarios(),
    st.sampled_from(["equal", "device-share", "exclusive"]),
    st.floats(0, 1),
    st.sampled_from(["none", "subtract"]),
    st.floats(0, 1e11),
)
def test_conservation_property(
    scenario: tuple[list[ChannelEnergy], list[JobWindow]], kind: str, deviceless: float, mode: str, idle_w: float
) -> None:
    channels, jobs = scenario
    rule = ShareRule(kind, deviceless_fraction=deviceless)  # type: ignore[arg-type]
    idle = IdlePolicy(mode, {(c.host, c.component, c.device): idle_w for c in channels})  # type: ignore[arg-type]
    attr = split_shared(channels, jobs, rule, idle=idle)
    for host in {c.host for c in channels}:
        node = math.fsum(iv.energy_j for c in channels if c.host == host for iv in c.intervals)
        assert attr.node_total_j(host) == pytest.approx(node, rel=1e-9, abs=1e-6)
        conserved(attr, host)
        dynamic = math.fsum(s.dynamic_j for s in attr.shares if s.host == host)
        assert dynamic + attr.node_idle_j(host) == pytest.approx(node, rel=1e-9, abs=1e-6)
    for c in channels:
        # Per channel: the parts add up to its energy, none negative, so no joule goes twice.
        parts = [s for s in attr.shares if (s.host, s.component, s.device) == (c.host, c.component, c.device)]
        assert all(s.energy_j >= -1e-9 and s.dynamic_j >= -1e-9 for s in parts)
        assert math.fsum(s.energy_j for s in parts) == pytest.approx(
            math.fsum(iv.energy_j for iv in c.intervals), rel=1e-9, abs=1e-6
        )
        assert len({s.job_id for s in parts}) == len(parts)
        for s in parts:
            if s.job_id is None:
                continue
            (j,) = [j for j in jobs if j.job_id == s.job_id]
            # A job gets at most what the channel drew inside its window...
            assert s.energy_j <= window_energy(c.intervals, j.start_ns, j.end_ns) + 1e-6
            # ...and only devices it claims.
            if c.component == "gpu":
                assert f"gpu:{c.device}" in j.devices


# ------------------------------------------------------------------ coverage


def test_coverage_shares_sum_to_one() -> None:
    cov = coverage({Quality.COUNTER: 700.0, Quality.INTEGRATED: 200.0, Quality.MODEL: 100.0}, ["nic on host-2"])
    assert cov.fractions == {
        Quality.COUNTER: pytest.approx(0.7),
        Quality.INTEGRATED: pytest.approx(0.2),
        Quality.MODEL: pytest.approx(0.1),
    }
    assert math.fsum(cov.fractions.values()) == 1.0
    assert cov.total_j == 1000.0
    assert cov.measured_fraction == pytest.approx(0.9)
    assert cov.missing == ("nic on host-2",)


def test_coverage_edge_cases() -> None:
    assert coverage({}).fractions == {}
    assert coverage({Quality.MODEL: 0.0}).measured_fraction == 0.0
    assert coverage({Quality.COUNTER: 5.0, Quality.MODEL: 0.0}).fractions == {Quality.COUNTER: 1.0}
    with pytest.raises(ValueError):
        coverage({Quality.COUNTER: -1.0})
