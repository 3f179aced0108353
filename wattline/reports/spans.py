"""The stretches of a job a report gives figures for: the saturated window and the whole run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from wattline.accounting.uncertainty import Bound
from wattline.reports import economics
from wattline.reports.windows import WindowEnergy, estimate_fraction

if TYPE_CHECKING:
    from wattline.reports.model import Report


@dataclass(frozen=True)
class Span:
    """A stretch of the job a report gives figures for: the saturated window or the whole run."""

    title: str
    seconds: float
    units: float
    windows: tuple[WindowEnergy, ...]
    figures: economics.Figures  #: from the energy the idle policy charges
    #: How far ``units`` may be off (a window asked: units done where at its edges is not known).
    units_bound: float = 0.0

    @property
    def energy_j(self) -> float:
        return sum(w.energy_j for w in self.windows)

    @property
    def dynamic_j(self) -> float:
        return sum(w.dynamic_j for w in self.windows)

    @property
    def estimate(self) -> float:
        return estimate_fraction(*self.windows)

    @property
    def bound(self) -> Bound:
        """How far the energy may be off: the windows' bounds added (worst case)."""
        return sum((w.bound for w in self.windows), Bound())

    @property
    def bound_rel(self) -> float | None:
        """The bound relative to the energy the figures use (total, or above idle)."""
        return self.bound.relative(self.figures.window.energy_j)

    @property
    def per_unit_rel(self) -> float | None:
        """The relative bound of a figure per unit: at worst energy high and units low (None
        when unknown, or when the units may be 0)."""
        rel = self.bound_rel
        if rel is None or not self.units_bound:
            return rel
        # Units that may all lie outside the span (their bound is all of them, give or take the
        # float rounding of the two sums) leave the figure per unit without an upper bound.
        low = 1 - self.units_bound / self.units if self.units > 0 else 0.0
        return (1 + rel) / low - 1 if low > 1e-9 else None


def spans(r: Report) -> tuple[Span, Span]:
    """(saturated window, whole run) of a report; the whole run's figures use the same
    definitions (:mod:`.economics`) on warm-up + saturated window."""
    s = r.settings
    saturated = Span(
        "saturated window", r.saturated_window.seconds, r.units_saturated, (r.saturated_window,), r.figures,
        r.units_bound,
    )  # fmt: skip
    seconds = (r.end_ns - r.job.start_ns) / 1e9
    windows = (r.warmup, r.saturated_window)
    energy = sum(w.dynamic_j if s.idle == "subtract" else w.energy_j for w in windows)
    whole = economics.Window(r.job.units_total, max(seconds, 0.0), max(energy, 0.0), r.figures.window.instances)
    figures = economics.figures(whole, s.price_per_instance_hour, s.carbon_intensity, s.pue)
    title = "whole run" if s.window is None else "window"
    return saturated, Span(title, seconds, r.job.units_total, windows, figures, r.units_bound)
