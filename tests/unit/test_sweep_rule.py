"""The sweep's significance rule (``wattline/sweep/analysis.py``) on runs whose
truth is set here: identical settings with run-to-run noise are never called different; an
advantage inside the measurement bound, or inside the spread of the runs, is "within
uncertainty"; one beyond both is real."""

from __future__ import annotations

import random

from wattline.accounting.uncertainty import Side
from wattline.sweep.analysis import RunFigures, analyse

A: tuple[tuple[str, str], ...] = (("x", "a"),)
B: tuple[tuple[str, str], ...] = (("x", "b"),)


def runs(point: tuple[tuple[str, str], ...], values: list[float], bound: float) -> list[RunFigures]:
    return [
        RunFigures(point, k, f"{point[0][1]}{k}", 0, j_per_unit=v, throughput_per_s=10.0, side=Side(bound, 0.0))
        for k, v in enumerate(values)
    ]


def test_identical_settings_are_never_called_different() -> None:
    rng = random.Random(32)
    for _ in range(3000):
        # the same truth, a few tenths of a percent of run-to-run noise, a tight meter
        a = [1.0 + rng.gauss(0, 0.003) for _ in range(3)]
        b = [1.0 + rng.gauss(0, 0.003) for _ in range(3)]
        answer = analyse(runs(A, a, 1e-5) + runs(B, b, 1e-5), [A, B], None, None)
        lead = answer.ranked[0].advantage
        assert lead is not None and not lead.real, (a, b, lead)


def test_inside_the_bound_is_within_uncertainty() -> None:
    answer = analyse(runs(A, [1.0, 1.0, 1.0], 0.02) + runs(B, [1.02] * 3, 0.02), [A, B], None, None)
    lead = answer.ranked[0].advantage
    assert lead is not None and not lead.real and "bound" in lead.why


def test_inside_the_spread_is_within_uncertainty() -> None:
    # 5 % apart, but each setting's runs span 2 %: twice the two ranges is 8 %
    answer = analyse(runs(A, [0.99, 1.0, 1.01], 1e-5) + runs(B, [1.04, 1.05, 1.06], 1e-5), [A, B], None, None)
    lead = answer.ranked[0].advantage
    assert lead is not None and not lead.real and "spread" in lead.why, lead


def test_beyond_both_is_real_and_fewer_than_three_runs_never_is() -> None:
    answer = analyse(runs(A, [0.99, 1.0, 1.01], 0.001) + runs(B, [1.2, 1.21, 1.22], 0.001), [A, B], None, None)
    assert [p.point for p in answer.ranked] == [A, B]
    lead = answer.ranked[0].advantage
    assert lead is not None and lead.real
    two = analyse(runs(A, [1.0, 1.0], 0.001) + runs(B, [2.0, 2.0], 0.001), [A, B], None, None)
    assert two.ranked[0].advantage is not None and not two.ranked[0].advantage.real


def test_latency_keeps_a_faster_answering_setting_on_the_pareto_front() -> None:
    """C spends more energy per unit at less throughput than D: off the front, unless every
    setting reports latency and C answers sooner."""
    c, d = (("x", "c"),), (("x", "d"),)

    def point(p: tuple[tuple[str, str], ...], j: float, tput: float, latency: float | None) -> list[RunFigures]:
        return [
            RunFigures(p, k, f"{p[0][1]}{k}", 0, j_per_unit=j, throughput_per_s=tput, side=Side(1e-3, 0.0),
                       latency_s=latency)
            for k in range(3)
        ]  # fmt: skip

    with_latency = analyse(point(c, 2.0, 5.0, 0.010) + point(d, 1.0, 10.0, 0.080), [c, d], None, None)
    assert {p.point: p.pareto for p in with_latency.ranked} == {c: True, d: True}
    assert with_latency.ranked[1].latency_s is not None and with_latency.ranked[1].latency_s.mean == 0.010
    without = analyse(point(c, 2.0, 5.0, None) + point(d, 1.0, 10.0, 0.080), [c, d], None, None)
    assert {p.point: p.pareto for p in without.ranked} == {c: False, d: True}  # latency of some only: not weighed
