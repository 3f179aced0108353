"""Report and comparison arithmetic: throughput, energy, cost and CO2 per unit and per run.

Inputs are a stretch of a job (:class:`Window`: the saturated window, from saturation to end, or the whole run) and
prices. Every figure that cannot be computed (no units, zero seconds, no price) is
None, never an exception. Definitions (units/h and USD per instance-hour):

* per-instance throughput ``T = units / seconds / instances x 3600`` (units/h);
  per-instance power ``P = energy_j / seconds / instances`` (W);
* cost of a run ``= instances x seconds / 3600 x price``; CO2 of a run
  ``= energy_kWh x pue x carbon_intensity`` (gCO2; ``pue`` scales the IT energy
  measured to facility energy, for CO2 only: cloud prices already include it).

At an SLA of ``S`` units/h a fleet of ``N = ceil(S / T)`` instances runs all the
time; each hour it costs ``N x price`` and draws ``N x P x 3600`` J for ``S`` units, so
``cost per million = N x price / S x 1e6`` and ``energy per million =
N x P x 3600 / S x 1e6`` J. The last instance is paid and powered in full even when
it is partly idle, and ``P`` is the power at saturation (an over-provisioned
fleet running below saturation draws somewhat less: an upper bound).

Processing ``W`` units on ``K`` instances takes ``W / (K x T)`` hours, costs
``K x price`` per hour and draws ``K x P`` watts for that time.

A comparison reports ``b`` relative to ``a`` (``a`` the baseline): ratio ``b / a``,
change ``b / a - 1``; the study's "6 vs 33 instances, -82 %" is
``format_change(b, a, "instances")``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

__all__ = [
    "Change",
    "Comparison",
    "Figures",
    "SlaFigures",
    "Window",
    "WorkFigures",
    "co2_per_million_units_g",
    "co2_per_run_g",
    "compare",
    "cost_per_million_units",
    "cost_per_run",
    "figures",
    "format_change",
    "format_percent",
    "format_ratio",
    "instances_for_sla",
    "j_per_unit",
    "kwh_per_million_units",
    "mean_power_w",
    "power_per_instance_w",
    "throughput_per_hour",
    "throughput_per_instance_hour",
    "throughput_per_s",
]

J_PER_KWH = 3.6e6
MILLION = 1e6


@dataclass(frozen=True, slots=True)
class Window:
    """A stretch of a job (its saturated window or whole run): work units, duration, energy of all hosts, host count."""

    units: float
    seconds: float
    energy_j: float
    instances: int = 1

    def __post_init__(self) -> None:
        if self.units < 0 or self.seconds < 0 or self.energy_j < 0 or self.instances < 0:
            raise ValueError(f"window figures must be >= 0: {self}")


def _div(x: float | None, y: float | None) -> float | None:
    if x is None or y is None or y == 0:
        return None
    return x / y


def _mul(*xs: float | None) -> float | None:
    out = 1.0
    for x in xs:
        if x is None:
            return None
        out *= x
    return out


def throughput_per_s(m: Window) -> float | None:
    """Units per second (all instances)."""
    return _div(m.units, m.seconds)


def throughput_per_hour(m: Window) -> float | None:
    """Units per hour (all instances)."""
    return _mul(throughput_per_s(m), 3600.0)


def throughput_per_instance_hour(m: Window) -> float | None:
    """Units per hour per instance."""
    return _div(throughput_per_hour(m), m.instances)


def j_per_unit(m: Window) -> float | None:
    """Joules per unit; None with no units."""
    return _div(m.energy_j, m.units)


def kwh_per_million_units(m: Window) -> float | None:
    """kWh per million units."""
    return _div(_mul(j_per_unit(m), MILLION), J_PER_KWH)


def mean_power_w(m: Window) -> float | None:
    """Mean power of all instances, watts."""
    return _div(m.energy_j, m.seconds)


def power_per_instance_w(m: Window) -> float | None:
    """Mean power of one instance, watts."""
    return _div(mean_power_w(m), m.instances)


def cost_per_run(m: Window, price_per_instance_hour: float | None) -> float | None:
    """Cost of the window: instances x hours x price."""
    return _mul(float(m.instances), m.seconds / 3600.0, price_per_instance_hour)


def cost_per_million_units(m: Window, price_per_instance_hour: float | None) -> float | None:
    """Cost per million units at the window's throughput."""
    return _div(_mul(cost_per_run(m, price_per_instance_hour), MILLION), m.units)


def _co2_g(energy_j: float | None, carbon_intensity: float | None, pue: float) -> float | None:
    return _mul(_div(energy_j, J_PER_KWH), pue, carbon_intensity)


def co2_per_run_g(m: Window, carbon_intensity: float | None, pue: float = 1.0) -> float | None:
    """gCO2 of the window: kWh x PUE x intensity (gCO2/kWh)."""
    return _co2_g(m.energy_j, carbon_intensity, pue)


def co2_per_million_units_g(m: Window, carbon_intensity: float | None, pue: float = 1.0) -> float | None:
    """gCO2 per million units."""
    return _co2_g(_mul(j_per_unit(m), MILLION), carbon_intensity, pue)


def instances_for_sla(sla_units_per_hour: float, per_instance_per_hour: float | None) -> int | None:
    """Instances needed to sustain an SLA: ``ceil(SLA / per-instance throughput)``."""
    if per_instance_per_hour is None or per_instance_per_hour <= 0:
        return None
    return math.ceil(round(sla_units_per_hour / per_instance_per_hour, 9))


@dataclass(frozen=True, slots=True)
class Figures:
    """Every report figure of one window of a job (None where undefined)."""

    window: Window
    throughput_per_s: float | None
    throughput_per_hour: float | None
    throughput_per_instance_hour: float | None
    j_per_unit: float | None
    kwh_per_million_units: float | None
    mean_power_w: float | None
    power_per_instance_w: float | None
    cost_per_run: float | None
    cost_per_million_units: float | None
    co2_per_run_g: float | None
    co2_per_million_units_g: float | None


def figures(
    m: Window,
    price_per_instance_hour: float | None = None,
    carbon_intensity: float | None = None,
    pue: float = 1.0,
) -> Figures:
    """All figures of one job; cost needs a price, CO2 a carbon intensity (gCO2/kWh)."""
    if pue < 1.0:
        raise ValueError("pue must be >= 1")
    return Figures(
        window=m,
        throughput_per_s=throughput_per_s(m),
        throughput_per_hour=throughput_per_hour(m),
        throughput_per_instance_hour=throughput_per_instance_hour(m),
        j_per_unit=j_per_unit(m),
        kwh_per_million_units=kwh_per_million_units(m),
        mean_power_w=mean_power_w(m),
        power_per_instance_w=power_per_instance_w(m),
        cost_per_run=cost_per_run(m, price_per_instance_hour),
        cost_per_million_units=cost_per_million_units(m, price_per_instance_hour),
        co2_per_run_g=co2_per_run_g(m, carbon_intensity, pue),
        co2_per_million_units_g=co2_per_million_units_g(m, carbon_intensity, pue),
    )


def _round_half_away(x: float, digits: int) -> Decimal:
    """Round like the study (-42.5 -> -43), after dropping float noise below 1e-9."""
    return Decimal(f"{x:.9f}").quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)


def format_percent(pct: float | None, digits: int = 0) -> str:
    """``-81.8`` -> ``"-82 %"``; None -> ``"n/a"``."""
    if pct is None:
        return "n/a"
    r = _round_half_away(pct, digits)
    if r == 0:
        return f"{abs(r)} %"
    return f"{r:+} %"


def format_ratio(ratio: float | None, digits: int = 1) -> str:
    """``6.3`` -> ``"6.3x"``."""
    return "n/a" if ratio is None else f"{_round_half_away(ratio, digits)}x"


def _format_value(x: float | None, digits: int, prefix: str) -> str:
    if x is None:
        return "n/a"
    text = f"{_round_half_away(x, digits):,f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return prefix + text


def format_change(new: float | None, base: float | None, unit: str = "", *, digits: int = 1, prefix: str = "") -> str:
    """The study's notation: ``format_change(6, 33, "instances")`` -> ``"6 vs 33 instances, -82 %"``.

    Values keep up to ``digits`` decimals (trailing zeros dropped) and get thousands
    separators; ``prefix`` goes before each value ("USD ").
    """
    suffix = f" {unit}" if unit else ""
    values = f"{_format_value(new, digits, prefix)} vs {_format_value(base, digits, prefix)}{suffix}"
    return f"{values}, {format_percent(Change(base, new).pct)}"


@dataclass(frozen=True, slots=True)
class Change:
    """One figure of a comparison: ``a`` the baseline, ``b`` the candidate."""

    a: float | None
    b: float | None

    @property
    def ratio(self) -> float | None:
        """``b / a``; None when undefined."""
        return _div(self.b, self.a)

    @property
    def pct(self) -> float | None:
        """Percent change of b relative to a: ``(b / a - 1) x 100``."""
        r = self.ratio
        return None if r is None else (r - 1.0) * 100.0

    def format(self, unit: str = "", *, digits: int = 1, prefix: str = "") -> str:
        """``"b vs a unit, +-N %"`` (see :func:`format_change`)."""
        return format_change(self.b, self.a, unit, digits=digits, prefix=prefix)


@dataclass(frozen=True, slots=True)
class SlaFigures:
    """Fleets sized to sustain ``sla_units_per_hour`` (see the module doc)."""

    sla_units_per_hour: float
    instances: Change
    fleet_power_w: Change
    cost_per_hour: Change
    energy_kwh_per_million: Change
    cost_per_million: Change
    co2_g_per_million: Change


@dataclass(frozen=True, slots=True)
class WorkFigures:
    """Processing ``work_units`` on a fixed number of instances each way."""

    work_units: float
    instances: Change
    hours: Change
    energy_j: Change
    cost: Change
    co2_g: Change


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two jobs side by side; every :class:`Change` is ``b`` relative to ``a``."""

    a: Figures
    b: Figures
    throughput_ratio: float | None  #: per-instance throughput, b / a (the study's "6.3x")
    throughput_per_instance_hour: Change
    j_per_unit: Change
    kwh_per_million_units: Change
    cost_per_million_units: Change
    co2_per_million_units_g: Change
    sla: SlaFigures | None
    work: WorkFigures | None


def _sla(
    fa: Figures,
    fb: Figures,
    sla: float,
    price_a: float | None,
    price_b: float | None,
    cis: tuple[float | None, float | None],
    pue: float,
) -> SlaFigures:
    def one(f: Figures, price: float | None, ci: float | None) -> tuple[float | None, ...]:
        n = instances_for_sla(sla, f.throughput_per_instance_hour)
        nf = None if n is None else float(n)
        fleet_w = _mul(nf, f.power_per_instance_w)
        j_per_million = _div(_mul(fleet_w, 3600.0, MILLION), sla)
        return (
            nf,
            fleet_w,
            _mul(nf, price),
            _div(j_per_million, J_PER_KWH),
            _div(_mul(nf, price, MILLION), sla),
            _co2_g(j_per_million, ci, pue),
        )

    va, vb = one(fa, price_a, cis[0]), one(fb, price_b, cis[1])
    c = [Change(x, y) for x, y in zip(va, vb, strict=True)]
    return SlaFigures(sla, *c)


def _work(
    fa: Figures,
    fb: Figures,
    work: float,
    instances: int | None,
    price_a: float | None,
    price_b: float | None,
    cis: tuple[float | None, float | None],
    pue: float,
) -> WorkFigures:
    def one(f: Figures, price: float | None, ci: float | None) -> tuple[float | None, ...]:
        k = float(instances if instances is not None else f.window.instances)
        hours = _div(work, _mul(k, f.throughput_per_instance_hour))
        energy = _mul(k, f.power_per_instance_w, hours, 3600.0)
        return k, hours, energy, _mul(k, price, hours), _co2_g(energy, ci, pue)

    va, vb = one(fa, price_a, cis[0]), one(fb, price_b, cis[1])
    c = [Change(x, y) for x, y in zip(va, vb, strict=True)]
    return WorkFigures(work, *c)


def compare(
    a: Window,
    b: Window,
    *,
    sla_units_per_hour: float | None = None,
    work_units: float | None = None,
    instances: int | None = None,
    price_a: float | None = None,
    price_b: float | None = None,
    carbon_intensity: float | None = None,
    pue: float = 1.0,
    carbon_intensity_b: float | None = None,
) -> Comparison:
    """Compare job ``b`` against baseline ``a`` (prices in USD per instance-hour;
    ``carbon_intensity_b``: B's grid, when not A's ``carbon_intensity``).

    With ``sla_units_per_hour``: fleets sized for the SLA. With ``work_units``: time,
    energy, cost and CO2 to process them on ``instances`` instances each way
    (default: each job's own instance count).
    """
    if sla_units_per_hour is not None and sla_units_per_hour <= 0:
        raise ValueError("sla_units_per_hour must be > 0")
    if work_units is not None and work_units < 0:
        raise ValueError("work_units must be >= 0")
    if instances is not None and instances < 1:
        raise ValueError("instances must be >= 1")
    cis = (carbon_intensity, carbon_intensity if carbon_intensity_b is None else carbon_intensity_b)
    fa = figures(a, price_a, cis[0], pue)
    fb = figures(b, price_b, cis[1], pue)
    tput = Change(fa.throughput_per_instance_hour, fb.throughput_per_instance_hour)
    return Comparison(
        a=fa,
        b=fb,
        throughput_ratio=tput.ratio,
        throughput_per_instance_hour=tput,
        j_per_unit=Change(fa.j_per_unit, fb.j_per_unit),
        kwh_per_million_units=Change(fa.kwh_per_million_units, fb.kwh_per_million_units),
        cost_per_million_units=Change(fa.cost_per_million_units, fb.cost_per_million_units),
        co2_per_million_units_g=Change(fa.co2_per_million_units_g, fb.co2_per_million_units_g),
        sla=None if sla_units_per_hour is None else _sla(fa, fb, sla_units_per_hour, price_a, price_b, cis, pue),
        work=None if work_units is None else _work(fa, fb, work_units, instances, price_a, price_b, cis, pue),
    )
