"""merge_streams on synthetic timelines: overlapping streams count once, restarts add up."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wattline.accounting.streams import StreamSample, merge_streams
from wattline.accounting.window_energy import Interval, window_energy

POWER = 2.0  # joules per ns-unit of time in these timelines: the truth is POWER x covered time


def ticks(
    name: str, start: int, end: int, step: int, skip: tuple[int, ...] = (), power: float = POWER
) -> list[StreamSample]:
    """A stream sampling a constant ``power`` from ``start`` to ``end`` every ``step``; ``skip``: lost samples."""
    edges = [*range(start, end, step), end]
    return [
        StreamSample(a, b, power * (b - a), name) for n, (a, b) in enumerate(itertools.pairwise(edges)) if n not in skip
    ]


def total(intervals: tuple[Interval, ...]) -> float:
    return math.fsum(iv.energy_j for iv in intervals)


def assert_disjoint(intervals: tuple[Interval, ...]) -> None:
    for a, b in itertools.pairwise(intervals):
        assert a.end_ns <= b.start_ns or a.start_ns == a.end_ns or b.start_ns == b.end_ns, (a, b)


def test_one_stream_passes_through() -> None:
    merged = merge_streams(ticks("A", 0, 100, 10))
    assert merged.intervals == tuple(Interval(a, a + 10, 20.0) for a in range(0, 100, 10))
    assert (merged.streams, merged.overlapping, merged.restarts) == (1, 0, 0)
    assert merge_streams([]).intervals == ()


def test_two_overlapping_streams_count_the_overlap_once() -> None:
    # A: [0, 100], B: [50, 150] at other tick times (7): the node drew POWER x 150
    merged = merge_streams(ticks("B", 53, 150, 7) + ticks("A", 0, 100, 10))
    assert total(merged.intervals) == pytest.approx(POWER * 150)
    assert_disjoint(merged.intervals)
    # A, the earlier stream, counts where both cover; B's sample straddling 100 is clipped
    assert window_energy(merged.intervals, 0, 100) == pytest.approx(POWER * 100)
    assert window_energy(merged.intervals, 60, 130) == pytest.approx(POWER * 70)
    assert (merged.streams, merged.overlapping, merged.restarts) == (2, 2, 0)


def test_restart_back_to_back_adds_up() -> None:
    merged = merge_streams(ticks("A", 0, 100, 10) + ticks("B", 100, 180, 10))
    assert total(merged.intervals) == POWER * 180
    assert (merged.streams, merged.overlapping, merged.restarts) == (2, 0, 1)


def test_restart_with_a_pause_adds_up_and_loses_only_the_pause() -> None:
    merged = merge_streams(ticks("A", 0, 100, 10) + ticks("B", 130, 180, 10))
    assert total(merged.intervals) == POWER * 150
    assert merged.restarts == 1 and merged.overlapping == 0


def test_interleaved_ticks_of_two_agents() -> None:
    # two agents at the same rate, half a period apart, for the same span
    merged = merge_streams(ticks("X", 0, 1000, 10) + ticks("Y", 5, 1005, 10))
    assert total(merged.intervals) == pytest.approx(POWER * 1005)
    assert window_energy(merged.intervals, 333, 777) == pytest.approx(POWER * 444)
    assert_disjoint(merged.intervals)
    assert (merged.overlapping, merged.restarts) == (2, 0)


def test_identical_streams_count_once() -> None:
    merged = merge_streams(ticks("X", 0, 100, 10) + ticks("Y", 0, 100, 10))
    assert total(merged.intervals) == POWER * 100
    assert all(iv.energy_j == 20.0 for iv in merged.intervals)  # only X's samples, whole


def test_the_earliest_started_stream_counts_where_streams_overlap() -> None:
    """Two streams that disagree (two agents under one host id reading different counters): A
    [0, 100] at 2 per unit, B [53, 150] at 3. Each instant counts once, from the stream that
    started first: A up to 100, B after it. With equal powers (the other tests) any rule that
    counts each instant once would pass; here the latest-started rule gives 397, not 350."""
    merged = merge_streams(ticks("B", 53, 150, 7, power=3.0) + ticks("A", 0, 100, 10))
    assert total(merged.intervals) == pytest.approx(2.0 * 100 + 3.0 * 50)
    assert window_energy(merged.intervals, 60, 100) == pytest.approx(2.0 * 40)  # A's, not B's 120
    assert window_energy(merged.intervals, 100, 150) == pytest.approx(3.0 * 50)
    # A's gap (30, 50] is B's time there, at B's power
    gapped = merge_streams(ticks("A", 0, 100, 10, skip=(3, 4)) + ticks("B", 12, 100, 8, power=3.0))
    assert window_energy(gapped.intervals, 30, 50) == pytest.approx(3.0 * 20)
    assert total(gapped.intervals) == pytest.approx(2.0 * 80 + 3.0 * 20)


def test_gap_inside_one_stream_is_filled_by_the_other() -> None:
    # A lost the samples (30, 40] and (40, 50]; B covered that time
    a = ticks("A", 0, 100, 10, skip=(3, 4))
    merged = merge_streams(a + ticks("B", 12, 100, 8))
    assert total(merged.intervals) == pytest.approx(POWER * 100)
    assert window_energy(merged.intervals, 30, 50) == pytest.approx(POWER * 20)
    # without B, the gap is a gap (nothing invented)
    assert total(merge_streams(a).intervals) == POWER * 80


def test_three_streams() -> None:
    # A [0, 60], B [40, 120] and C [100, 200] overlap pairwise; D [250, 300] follows them all
    samples = ticks("C", 100, 200, 9) + ticks("A", 0, 60, 10) + ticks("D", 250, 300, 10) + ticks("B", 40, 120, 11)
    merged = merge_streams(samples)
    assert total(merged.intervals) == pytest.approx(POWER * (200 + 50))
    assert_disjoint(merged.intervals)
    assert (merged.streams, merged.overlapping, merged.restarts) == (4, 3, 1)


def test_zero_length_samples_count_once() -> None:
    merged = merge_streams([*ticks("A", 0, 100, 10), StreamSample(50, 50, 3.0, "B"), StreamSample(120, 120, 4.0, "B")])
    assert total(merged.intervals) == POWER * 100 + 4.0  # B's point at 50 lies inside A


def test_bad_sample_is_refused() -> None:
    with pytest.raises(ValueError):
        merge_streams([StreamSample(5, 4, 1.0, "A")])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 500), st.integers(1, 500), st.integers(1, 50), st.sets(st.integers(0, 60), max_size=5)
        ),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 1000),
    st.integers(0, 1000),
)
def test_property_energy_is_power_times_covered_time(
    streams: list[tuple[int, int, int, set[int]]], t0: int, t1: int
) -> None:
    """At constant power, any window's energy is POWER x the time some stream covers in it."""
    samples: list[StreamSample] = []
    covered: set[int] = set()  # unit time steps (u, u + 1] covered by some sample
    for n, (start, length, step, skip) in enumerate(streams):
        mine = ticks(f"s{n}", start, start + length, step, skip=tuple(skip))
        samples += mine
        covered |= {u for s in mine for u in range(s.start_ns, s.end_ns)}
    merged = merge_streams(samples)
    assert_disjoint(merged.intervals)
    lo, hi = min(t0, t1), max(t0, t1)
    truth = POWER * sum(1 for u in covered if lo <= u < hi)
    assert window_energy(merged.intervals, lo, hi) == pytest.approx(truth, abs=1e-9)
