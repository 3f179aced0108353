"""Report and comparison arithmetic, checked against the study's two tables."""

from __future__ import annotations

import pytest

from wattline.reports.economics import (
    Change,
    Window,
    co2_per_million_units_g,
    co2_per_run_g,
    compare,
    cost_per_million_units,
    cost_per_run,
    figures,
    format_change,
    format_percent,
    format_ratio,
    instances_for_sla,
    j_per_unit,
    kwh_per_million_units,
    mean_power_w,
    power_per_instance_w,
    throughput_per_hour,
    throughput_per_instance_hour,
    throughput_per_s,
)

HOUR = 3600.0


def test_single_job_figures() -> None:
    # 3600 units in one hour on 2 instances drawing 1 kWh together.
    m = Window(units=3600, seconds=HOUR, energy_j=3.6e6, instances=2)
    assert throughput_per_s(m) == 1.0
    assert throughput_per_hour(m) == 3600.0
    assert throughput_per_instance_hour(m) == 1800.0
    assert j_per_unit(m) == 1000.0
    assert kwh_per_million_units(m) == pytest.approx(1000 / 3.6)
    assert mean_power_w(m) == 1000.0
    assert power_per_instance_w(m) == 500.0
    assert cost_per_run(m, 2.0) == 4.0  # 2 instances x 1 h x USD 2
    assert cost_per_million_units(m, 2.0) == pytest.approx(4.0 / 3600 * 1e6)
    assert co2_per_run_g(m, 400.0, pue=1.5) == pytest.approx(600.0)  # 1 kWh x 1.5 x 400 g/kWh
    assert co2_per_million_units_g(m, 400.0) == pytest.approx(1000 / 3.6 * 400)
    f = figures(m, 2.0, 400.0, 1.5)
    assert (f.cost_per_run, f.j_per_unit) == (4.0, 1000.0)
    assert f.co2_per_run_g == pytest.approx(600.0)
    assert figures(m).cost_per_run is None and figures(m).co2_per_run_g is None


def test_zero_units_and_zero_seconds_give_none_not_errors() -> None:
    idle = Window(units=0, seconds=60, energy_j=6000.0)
    assert j_per_unit(idle) is None
    assert kwh_per_million_units(idle) is None
    assert cost_per_million_units(idle, 1.0) is None
    assert co2_per_million_units_g(idle, 400.0) is None
    assert throughput_per_s(idle) == 0.0
    assert instances_for_sla(1e6, throughput_per_instance_hour(idle)) is None
    instant = Window(units=10, seconds=0, energy_j=0.0)
    assert throughput_per_s(instant) is None
    assert mean_power_w(instant) is None
    assert cost_per_run(instant, 1.0) == 0.0
    assert j_per_unit(instant) == 0.0
    no_hosts = Window(units=10, seconds=10, energy_j=10.0, instances=0)
    assert throughput_per_instance_hour(no_hosts) is None and power_per_instance_w(no_hosts) is None
    c = compare(idle, instant, sla_units_per_hour=1e6, work_units=100, price_a=1.0, price_b=1.0)
    assert c.throughput_ratio is None
    assert c.sla is not None and c.sla.instances == Change(None, None)
    assert c.work is not None and c.work.hours.a is None and c.work.hours.b is None
    assert c.work.hours.format("h") == "n/a vs n/a h, n/a"


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError):
        Window(units=-1, seconds=1, energy_j=1)
    with pytest.raises(ValueError):
        figures(Window(1, 1, 1), pue=0.9)
    m = Window(1, 1, 1)
    with pytest.raises(ValueError):
        compare(m, m, sla_units_per_hour=0)
    with pytest.raises(ValueError):
        compare(m, m, instances=0)


def test_instances_for_sla_is_exact_at_integers() -> None:
    assert instances_for_sla(1e6, 1e6 / 6) == 6
    assert instances_for_sla(1e6, 1e6 / 6 - 1) == 7
    assert instances_for_sla(1e6, 1e7) == 1


# Inference table: LayoutLM, SLA 1,000,000 inferences/h. Per-instance throughputs chosen so
# that the ratio is 6.3x and ceil(1e6 / T) gives 6 and 33: T_gpu in [30,303, 31,250).
GPU_INF = Window(units=30_500, seconds=HOUR, energy_j=1000.0 * HOUR)  # 30,500/h at 1000 W
INF1 = Window(units=6.3 * 30_500, seconds=HOUR, energy_j=440.0 * HOUR)  # 192,150/h at 440 W
# Prices that give the study's USD 2 vs USD 25 per million: 6 x 0.362 and 33 x 0.752.
PRICE_INF1, PRICE_GPU_INF = 0.362, 0.752


def test_study_inference_table() -> None:
    c = compare(GPU_INF, INF1, sla_units_per_hour=1e6, price_a=PRICE_GPU_INF, price_b=PRICE_INF1)
    assert c.throughput_ratio == pytest.approx(6.3)
    assert format_ratio(c.throughput_ratio) == "6.3x"
    sla = c.sla
    assert sla is not None
    assert (sla.instances.b, sla.instances.a) == (6, 33)
    assert sla.instances.pct == pytest.approx((6 / 33 - 1) * 100)  # -81.8 %
    assert sla.instances.format("instances") == "6 vs 33 instances, -82 %"
    # Cost per million at the SLA: N x price / SLA x 1e6.
    assert sla.cost_per_million.b == pytest.approx(6 * 0.362)
    assert sla.cost_per_million.a == pytest.approx(33 * 0.752)
    assert sla.cost_per_million.format(prefix="USD ", digits=0) == "USD 2 vs USD 25, -91 %"
    assert sla.cost_per_hour.b == pytest.approx(6 * 0.362)
    # Energy at the SLA: N x P x 1 h / SLA; 6 x 440 W against 33 x 1000 W is -92 %.
    assert sla.fleet_power_w.b == pytest.approx(2640.0) and sla.fleet_power_w.a == pytest.approx(33_000.0)
    assert sla.energy_kwh_per_million.b == pytest.approx(2640.0 * HOUR / 1e6 * 1e6 / 3.6e6)
    assert format_percent(sla.energy_kwh_per_million.pct) == "-92 %"
    assert sla.co2_g_per_million.a is None  # no carbon intensity given


def test_study_inference_co2_with_pue() -> None:
    c = compare(GPU_INF, INF1, sla_units_per_hour=1e6, carbon_intensity=400.0, pue=1.2)
    assert c.sla is not None
    kwh_a = 33 * 1000.0 / 1000  # 33 kW for one hour per million units
    assert c.sla.co2_g_per_million.a == pytest.approx(kwh_a * 1.2 * 400.0)
    assert c.co2_per_million_units_g.a == pytest.approx(1000.0 * HOUR / 30_500 * 1e6 / 3.6e6 * 1.2 * 400)


# Training table: BERT-Large, 450 M sequences on 16 instances each way, 4 h vs 2.3 h.
WORK = 450e6
GPU_TRAIN = Window(units=WORK / 4, seconds=HOUR, energy_j=16 * 4000.0 * HOUR, instances=16)
TRN1 = Window(units=WORK / 2.3, seconds=HOUR, energy_j=16 * 4939.0 * HOUR, instances=16)
# Price per instance-hour: USD 2,091 / (16 x 4 h) and USD 787 / (16 x 2.3 h).
PRICE_GPU_TRAIN = 2091 / (16 * 4)
PRICE_TRN1 = 787 / (16 * 2.3)


def test_study_training_table() -> None:
    assert PRICE_GPU_TRAIN == 32.671875
    assert round(PRICE_TRN1, 4) == 21.3859
    c = compare(GPU_TRAIN, TRN1, work_units=WORK, instances=16, price_a=PRICE_GPU_TRAIN, price_b=PRICE_TRN1)
    assert format_ratio(c.throughput_ratio) == "1.7x"
    w = c.work
    assert w is not None
    assert (w.instances.a, w.instances.b) == (16, 16)
    assert w.hours.a == pytest.approx(4.0) and w.hours.b == pytest.approx(2.3)
    assert w.hours.format("h") == "2.3 vs 4 h, -43 %"  # -42.5 rounds away from zero, as in the study
    assert w.cost.a == pytest.approx(2091.0) and w.cost.b == pytest.approx(787.0)
    assert w.cost.format(prefix="USD ", digits=0) == "USD 787 vs USD 2,091, -62 %"
    # Energy: K x P x time; 4939 W x 2.3 h against 4000 W x 4 h is about -29 %.
    assert w.energy_j.a == pytest.approx(16 * 4000.0 * 4 * HOUR)
    assert format_percent(w.energy_j.pct) == "-29 %"
    # The per-unit energy agrees with it: J/unit x work units.
    assert w.energy_j.b == pytest.approx(c.b.j_per_unit * WORK)  # type: ignore[operator]


def test_work_defaults_to_each_jobs_own_instance_count() -> None:
    small = Window(units=WORK / 8, seconds=HOUR, energy_j=HOUR * 8 * 4000.0, instances=8)
    c = compare(GPU_TRAIN, small, work_units=WORK)
    assert c.work is not None
    assert (c.work.instances.a, c.work.instances.b) == (16, 8)
    assert c.work.hours.a == pytest.approx(4.0) and c.work.hours.b == pytest.approx(8.0)  # half the hosts
    assert c.work.cost.a is None  # no price


def test_change_and_formatting() -> None:
    assert Change(33, 6).ratio == pytest.approx(6 / 33)
    assert Change(0, 6).pct is None and Change(None, 6).pct is None
    assert format_percent(None) == "n/a"
    assert format_percent(0.2) == "0 %"
    assert format_percent(-0.4) == "0 %"
    assert format_percent(12.5) == "+13 %"
    assert format_percent(-62.36, digits=1) == "-62.4 %"
    assert format_ratio(None) == "n/a"
    assert format_change(1234.5, 1000, "kWh") == "1,234.5 vs 1,000 kWh, +23 %"
    assert format_change(None, 1000) == "n/a vs 1,000, n/a"
