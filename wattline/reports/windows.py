"""The energy of a job in one window (warm-up or saturated), by component and host, and the
fraction of it that is a model estimate."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from wattline.accounting.uncertainty import Bound
from wattline.quality import Quality


@dataclass
class ComponentEnergy:
    """Energy of one component (summed over hosts and devices) in one window."""

    component: str
    energy_j: float = 0.0
    dynamic_j: float = 0.0
    by_quality: dict[str, float] = field(default_factory=dict)
    #: Of energy_j, the part the job got as its share by use of a shared device (derived, not measured).
    split_by_use_j: float = 0.0
    #: Of energy_j, the part estimated where the job's CPU time was not read (host-wide components).
    estimated_j: float = 0.0
    #: How far energy_j may be off (:mod:`wattline.accounting.uncertainty`).
    bound: Bound = field(default_factory=Bound)


@dataclass
class WindowEnergy:
    """Energy of the job in one window, by component and by host."""

    seconds: float
    components: dict[str, ComponentEnergy] = field(default_factory=dict)
    hosts: dict[str, float] = field(default_factory=dict)

    @property
    def energy_j(self) -> float:
        return math.fsum(c.energy_j for c in self.components.values())

    @property
    def dynamic_j(self) -> float:
        return math.fsum(c.dynamic_j for c in self.components.values())

    @property
    def bound(self) -> Bound:
        """How far energy_j may be off: the components' bounds added (worst case)."""
        return sum((c.bound for c in self.components.values()), Bound())

    def by_quality(self) -> dict[Quality, float]:
        out: dict[Quality, float] = defaultdict(float)
        for comp in self.components.values():
            for q, j in comp.by_quality.items():
                out[Quality(q)] += j
        return dict(out)


def estimate_fraction(*windows: WindowEnergy) -> float:
    """Fraction of the windows' energy that is a model estimate (0 without energy)."""
    total = sum(w.energy_j for w in windows)
    model = sum(w.by_quality().get(Quality.MODEL, 0.0) for w in windows)
    return model / total if total > 0 else 0.0
