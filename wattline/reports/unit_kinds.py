"""Figures of a job's extra unit kinds (a server's input and output tokens beside its requests;
with a ``by`` spec, each model's apart): per unit series, its units over the span the report
gives figures for (the whole run, or the window asked) and J per unit of it.

The energy is the job's, whole, over each series' units: "J per output token" divides the energy
that served everything by the output tokens alone. A server serving several models is measured
as one, so a model's J per unit here is the *server's* energy over that model's units, as
nothing measured says how a shared server's energy divides between them; a split by a named
rule, a model, is :mod:`.model_split`'s.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wattline.reports import economics
from wattline.reports.spans import spans

if TYPE_CHECKING:
    from wattline.reports.model import Report

#: What each series' J per unit divides: the job's energy, never a share of it (see above).
ENERGY_OF = "job"


@dataclass(frozen=True)
class UnitKind:
    """One series of an extra unit kind over the report's span."""

    name: str
    labels: dict[str, str]
    units: float
    #: How far ``units`` may be off (a window asked: units done where at its edges is not known).
    units_bound: float
    j_per_unit: float | None
    #: Half-width of ``j_per_unit``: the energy's bound and the units' at worst together.
    j_per_unit_bound: float | None

    @property
    def j_per_unit_rel(self) -> float | None:
        """``j_per_unit_bound`` relative to ``j_per_unit`` (None when either is unknown or 0)."""
        return (
            self.j_per_unit_bound / self.j_per_unit if self.j_per_unit and self.j_per_unit_bound is not None else None
        )


def unit_kinds(r: Report) -> list[UnitKind]:
    """Every extra unit series of ``r``'s job, by kind and labels, over the whole run's span."""
    whole = spans(r)[1]
    out = []
    for series, intervals in sorted(r.job.kind_intervals.items()):
        units = math.fsum(u for *_, u in intervals)
        bound = r.kind_bounds.get(series, 0.0)
        span = dataclasses.replace(whole, units=units, units_bound=bound)
        per_unit = economics.figures(dataclasses.replace(whole.figures.window, units=units)).j_per_unit
        rel = span.per_unit_rel
        j_bound = None if per_unit is None or rel is None else per_unit * rel
        out.append(UnitKind(series[0], dict(series[1]), units, bound, per_unit, j_bound))
    return out
