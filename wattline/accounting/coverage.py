"""How a figure's energy was obtained: its fraction by quality and what was not measured."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from wattline.quality import Quality


@dataclass(frozen=True, slots=True)
class Coverage:
    """Fraction of energy per quality (summing to 1 when any energy) and the missing sources."""

    fractions: dict[Quality, float]
    total_j: float
    missing: tuple[str, ...] = ()

    @property
    def measured_fraction(self) -> float:
        """Fraction from measurements (counter + integrated), 0 when no energy; not the
        "measured share" of a device split between jobs by use (device_shares)."""
        return math.fsum(v for q, v in self.fractions.items() if q.measured)


def coverage(energy_by_quality: Mapping[Quality, float], missing: Iterable[str] = ()) -> Coverage:
    """Fractions of energy by quality; ``missing`` (e.g. "nic on host-3: no counters") passes through."""
    if any(v < 0 for v in energy_by_quality.values()):
        raise ValueError("energy must be >= 0")
    total = math.fsum(energy_by_quality.values())
    fractions: dict[Quality, float] = {}
    if total > 0:
        nonzero = [(q, v) for q, v in energy_by_quality.items() if v > 0]
        for q, v in nonzero[:-1]:
            fractions[q] = v / total
        fractions[nonzero[-1][0]] = 1.0 - math.fsum(fractions.values())
    return Coverage(fractions, total, tuple(missing))
