"""A job's figures interval by interval (``wattline report SVC --every 5m``): a service's energy
per unit against its load, and its energy per unit at saturation (the study's figure).

Each interval is a window of the job (:mod:`.window_view`), its figures and bounds those of a
report over it (:mod:`.interval_reports`). Its load is its throughput against the highest
throughput of the intervals asked: the most the service was seen to sustain for a whole
interval, not a capacity it was told. The intervals at or above :data:`SATURATED_LOAD` together
give the energy per unit at saturation: their energy over their units, bounded at worst (energy
high, units low) as a figure per unit is.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from wattline.reports.latency import Latency
from wattline.reports.window_view import Window

#: Most intervals one report computes (each is a report of its own).
MAX_INTERVALS = 500
#: Load from which an interval counts as saturated: within 10 % of the highest throughput seen.
SATURATED_LOAD = 0.9


@dataclass(frozen=True)
class Interval:
    """One interval's figures, from the energy the report's idle policy charges."""

    window: Window
    seconds: float
    units: float
    units_bound: float
    energy_j: float
    energy_bound_j: float
    j_per_unit: float | None
    j_per_unit_bound: float | None
    throughput_per_s: float
    #: Fraction of its energy that is a model estimate (its energy and J per unit are then ESTIMATEs).
    estimate_fraction: float = 0.0
    load: float | None = None  #: of the highest throughput among the intervals (None: none did any)
    latency: list[Latency] = field(default_factory=list)  #: the server's latency histograms over it


@dataclass(frozen=True)
class AtSaturation:
    """The energy per unit of the intervals at or above :data:`SATURATED_LOAD`, together."""

    intervals: int
    units: float
    energy_j: float
    j_per_unit: float
    j_per_unit_bound: float | None
    estimate_fraction: float  #: of its energy, the fraction that is a model estimate


@dataclass(frozen=True)
class Intervals:
    """A report's intervals (``--every``) and the energy per unit at saturation they give."""

    every_s: float
    rows: list[Interval]

    @property
    def at_saturation(self) -> AtSaturation | None:
        """The saturated intervals' energy per unit together; None when none counted units."""
        chosen = [i for i in self.rows if i.load is not None and i.load >= SATURATED_LOAD and i.units > 0]
        if not chosen:
            return None
        units = math.fsum(i.units for i in chosen)
        energy = math.fsum(i.energy_j for i in chosen)
        units_low = units - math.fsum(i.units_bound for i in chosen)
        high = energy + math.fsum(i.energy_bound_j for i in chosen)
        bound = high / units_low - energy / units if units_low > 0 else None
        model = math.fsum(i.energy_j * i.estimate_fraction for i in chosen)
        return AtSaturation(len(chosen), units, energy, energy / units, bound, model / energy if energy > 0 else 0.0)


def split(window: Window, every_ns: int) -> list[Window]:
    """``window`` cut into intervals of ``every_ns`` from its start (the last one may be shorter);
    ValueError when that makes more than :data:`MAX_INTERVALS`."""
    count = math.ceil((window.to_ns - window.from_ns) / every_ns)
    if count > MAX_INTERVALS:
        raise ValueError(f"{count} intervals: at most {MAX_INTERVALS} (ask a longer interval or a shorter window)")
    edges = [window.from_ns + every_ns * i for i in range(count)] + [window.to_ns]
    return [Window(a, b) for a, b in itertools.pairwise(edges) if b > a]
