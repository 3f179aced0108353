"""How far an energy figure may be off: a bound per documented term, and how terms combine.

Pure arithmetic (no I/O, no clock). A channel's energy in a window ``[t0, t1]`` is the
difference of its cumulative counter at the edges, the samples straddling an edge
apportioned by overlap (:mod:`.attribution`). Its error has these terms, each a half-width
in joules (docs/method.md "Uncertainty" gives each one's source):

* ``resolution``: a counter read at an edge lags the truth by up to the counter's update
  period and is quantized to its resolution, at both edges: ``2 x (p_max x update_s +
  resolution_j)`` (:data:`SOURCES`);
* ``edges``: the part of a straddling sample (or of a stretch between two samples whose
  energy the store lacks) apportioned by overlap; the part holds at least
  ``E - p x outside`` and at most ``min(E, p x inside)``, the bound is the farther of the
  two from the apportioned ``E x inside / length`` (``p``: the highest power the samples
  around that edge allow, :func:`~wattline.accounting.window_bounds.edge_power_w`); none
  where a sample boundary falls on the edge (a job's open and close, stamped by a tick);
* ``integration``: power readings integrated over time (quality ``integrated``) average
  the power over ``averaging_s`` before each reading, so each edge may be off by
  ``p_max x averaging_s``;
* ``model``: a model estimate is off by up to its model's stated range
  (:data:`MODEL_RANGE`), or by the ``energy_error_j`` its source gave with each sample;
* ``gaps``: time in the window with no sample at all (and no running total of one stream
  on both sides of it to bridge it), or with an unhealthy (0 J) one, could have held up to
  ``p_max x that time``; a job's part of it is handed out where that time lies, as a sample
  there would be (:attr:`~wattline.accounting.attribution.Share.gaps_bound_j`);
* ``split``: a device split among jobs by their recorded use: where the processes on it
  changed inside a period (an unsteady one), a job's part there lay between its parts
  before and after (:meth:`~wattline.accounting.use_split.UseSplit.bounds`); likewise
  a host's energy split by CPU time where a job's processes appeared or went inside one of
  its periods (:func:`~wattline.accounting.use_split.mark_edges`): its part there lay
  between none and its share of all of it; not a term of the channel, added to the job's
  share of it;
* ``unread``: a host's energy split by CPU time where a job's CPU time was not read there
  (its holder could not read it: a pod's cgroup gone, an agent restarted, an older
  wrapper): its part is estimated, and lay anywhere between none and all that the jobs read
  there left (:meth:`~wattline.accounting.use_split.UseSplit.by_ratio`); added to the
  job's share like ``split``;
* ``coarse``: a long job alone on its host, its host-wide energy split by CPU time at one
  fraction for several of its periods at a time (its report reads the counters at the edges of
  those stretches, not every sample: :func:`~wattline.accounting.use_split.coarsen`): in
  each, the energy there x how far its periods' fractions are from the one taken.

``p_max`` is the channel's plausible maximum power: the highest mean power among the
samples the report read for it around the window, and the window's own mean power
(an assumption: a burst shorter than one sample above the power around it is not bounded).

Combining: within one figure all terms add linearly (worst case): a model's range is
systematic, the same on every host, and a burst at an edge raises every component at once,
so root-sum-square would understate them. Between the two jobs of a comparison, the
measurement terms are independent (other runs, other edges) and combine in root-sum-square;
the model terms stay systematic and add (:func:`change_bound`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from wattline.quality import Quality
from wattline.units import NS_PER_S

__all__ = [
    "MODEL_RANGE",
    "SOURCES",
    "Bound",
    "Side",
    "SourceFacts",
    "change_bound",
    "edge_term",
    "facts",
    "quality_terms",
]


@dataclass(frozen=True, slots=True)
class SourceFacts:
    """What bounds a source's energy: counter update period and resolution, power averaging."""

    update_s: float = 0.0  #: a counter read lags the truth by up to this long
    resolution_j: float = 0.0  #: the counter's quantum
    averaging_s: float = 0.0  #: integrated power: each reading averages this long before it


#: Per source (docs/method.md "Uncertainty" names each fact's source).
SOURCES: dict[str, SourceFacts] = {
    "rapl": SourceFacts(update_s=0.001, resolution_j=1e-6),  # energy_uj, updated about every 1 ms
    # mJ, about every 100 ms (the agent's plausibility rule allows twice that: nvml.py counter_step_s); 1 s power avg
    "nvml": SourceFacts(update_s=0.1, resolution_j=1e-3, averaging_s=1.0),
}

#: Relative half-width of a model estimate without a per-sample bound, per source.
MODEL_RANGE: dict[str, float] = {
    # 4.0 W per logical CPU assumed against the 3.1-6.6 W of the examples it comes from
    # (wattline/agent/sources/cpu_model.py): the truth may be up to 65 % above.
    "cpu_model": 0.65,
    # idle W and J/byte are order-of-magnitude assumptions (wattline/agent/sources/nic.py): a factor of 2.
    "nic": 1.0,
    # utilization x an assumed device power (wattline/agent/sources/neuron.py's table): a factor of 2.
    "neuron": 1.0,
}
#: Any other model source.
DEFAULT_MODEL_RANGE = 1.0


def facts(source: str) -> SourceFacts:
    """The source's facts; an unknown source has none (its counter terms are 0)."""
    return SOURCES.get(source, SourceFacts())


@dataclass(frozen=True, slots=True)
class Bound:
    """Half-widths (J) of an energy figure's error, by term; ``total_j`` adds them (worst case)."""

    resolution_j: float = 0.0
    edges_j: float = 0.0
    integration_j: float = 0.0
    model_j: float = 0.0
    gaps_j: float = 0.0
    split_j: float = 0.0
    unread_j: float = 0.0
    coarse_j: float = 0.0

    @property
    def total_j(self) -> float:
        """All terms added: the figure is within ``energy ± total_j``."""
        return self.measurement_j + self.model_j

    @property
    def measurement_j(self) -> float:
        """The terms of the measurement itself (all but the model's range)."""
        split = self.split_j + self.unread_j + self.coarse_j
        return self.resolution_j + self.edges_j + self.integration_j + self.gaps_j + split

    def __add__(self, other: Bound) -> Bound:
        return Bound(
            self.resolution_j + other.resolution_j,
            self.edges_j + other.edges_j,
            self.integration_j + other.integration_j,
            self.model_j + other.model_j,
            self.gaps_j + other.gaps_j,
            self.split_j + other.split_j,
            self.unread_j + other.unread_j,
            self.coarse_j + other.coarse_j,
        )

    def scaled(self, factor: float) -> Bound:
        """This bound times ``factor`` (a job's fraction of a channel)."""
        return Bound(
            self.resolution_j * factor,
            self.edges_j * factor,
            self.integration_j * factor,
            self.model_j * factor,
            self.gaps_j * factor,
            self.split_j * factor,
            self.unread_j * factor,
            self.coarse_j * factor,
        )

    def terms(self) -> dict[str, float]:
        """Term name -> half-width (J), for JSON."""
        return {f.name.removesuffix("_j"): getattr(self, f.name) for f in fields(self)}

    def relative(self, energy_j: float) -> float | None:
        """``total_j / energy_j``; 0 for no error, None when it cannot be relative (no energy)."""
        if self.total_j == 0:
            return 0.0
        return self.total_j / energy_j if energy_j > 0 else None


def edge_term(start_ns: int, end_ns: int, energy_j: float, inside_ns: int, p_max_w: float) -> float:
    """Error of apportioning ``inside_ns`` of a piece ``(start_ns, end_ns]`` holding ``energy_j``."""
    length = end_ns - start_ns
    if length <= 0 or inside_ns <= 0 or inside_ns >= length:
        return 0.0
    guess = energy_j * inside_ns / length
    low = max(0.0, energy_j - p_max_w * (length - inside_ns) / NS_PER_S)
    high = min(energy_j, p_max_w * inside_ns / NS_PER_S)
    high, low = max(high, guess), min(low, guess)  # a power below the piece's own mean: no tighter than 0
    return max(guess - low, high - guess)


def counter_term(source: str, p_max_w: float) -> Bound:
    """Counter update and resolution term of one window (both edges) of a channel of ``source``."""
    f = facts(source)
    return Bound(resolution_j=2 * (p_max_w * f.update_s + f.resolution_j))


def integration_term(source: str, p_max_w: float) -> Bound:
    """Averaging of integrated power readings at both edges of one window."""
    averaging = facts(source).averaging_s or 1.0
    return Bound(integration_j=2 * p_max_w * averaging)


def model_term(source: str, energy_j: float, error_j: float | None) -> Bound:
    """A model estimate's range: the source's own per-sample bound when it gave one."""
    if error_j is not None:
        return Bound(model_j=error_j)
    return Bound(model_j=energy_j * MODEL_RANGE.get(source, DEFAULT_MODEL_RANGE))


def quality_terms(source: str, quality: str, energy_j: float, p_max_w: float, error_j: float | None) -> Bound:
    """The terms a channel's quality brings: counter, integrated power, or model."""
    if quality == Quality.COUNTER:
        return counter_term(source, p_max_w)
    if quality == Quality.INTEGRATED:
        return integration_term(source, p_max_w)
    return model_term(source, energy_j, error_j)


@dataclass(frozen=True, slots=True)
class Side:
    """One job's figure in a comparison: its relative measurement and model half-widths."""

    measurement: float
    model: float

    @classmethod
    def of(cls, bound: Bound, energy_j: float) -> Side | None:
        """Relative halves of ``bound``; None when they cannot be relative (no energy)."""
        if energy_j <= 0:
            return None if bound.total_j > 0 else cls(0.0, 0.0)
        return cls(bound.measurement_j / energy_j, bound.model_j / energy_j)


def change_bound(ratio: float | None, a: Side | None, b: Side | None) -> float | None:
    """Half-width, in percentage points, of B's percent change relative to A.

    Relative half-width of ``b / a``: model terms add (systematic), measurement terms
    combine in root-sum-square (independent runs), over ``1 - A's relative bound`` (A in the
    denominator: its low end moves the ratio most). None when unbounded (A's bound reaches
    100 %) or undefined.
    """
    if ratio is None or a is None or b is None:
        return None
    a_total = a.measurement + a.model
    if a_total >= 1:
        return None
    rel = (a.model + b.model + math.hypot(a.measurement, b.measurement)) / (1 - a_total)
    return 100.0 * abs(ratio) * rel
