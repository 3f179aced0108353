"""The split of a job's energy between the label values of its unit series (the models of one
server), by a named rule (``wattline report --model-split``; docs/services.md says which to use).

A server serving several models is measured as one: nothing measured says how its energy divides
between them. A rule says it, so every figure here is a model (method ``model``), never a
measurement, and its bound covers what was measured (the job's energy, the units at a window's
edges), not the rule's assumption. The rules:

- ``none``: no split; each series' J per unit stays the whole job's energy over its units
  (:mod:`.unit_kinds`).
- ``units:KIND``: each label set's fraction of KIND's units over the span (``units:output_tokens``:
  every generated token is assumed to cost the same, whichever model made it).
- ``auto`` (the default): ``units:output_tokens`` where the job has output tokens by labels (the
  vLLM preset's generation tokens: decoding, token by token, is most of an LLM server's work),
  else ``none``.

The models' energies sum to the job's: the last one gets the rest, not its own product.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from wattline.config import ConfigError
from wattline.reports.spans import spans
from wattline.reports.unit_kinds import ENERGY_OF, UnitKind, unit_kinds
from wattline.text import clip

if TYPE_CHECKING:
    from wattline.reports.model import Report

NONE, AUTO, UNITS = "none", "auto", "units:"
#: The kind ``auto`` splits by, where the job has it by labels.
AUTO_KIND = "output_tokens"
MODEL_SPLIT_HELP = (
    "Split of the job's energy between the models (label values) of its unit kinds: auto "
    f"(units:{AUTO_KIND} where the job counts them by labels, else none), none, or units:KIND "
    "(each model's fraction of KIND's units). A model, not a measurement."
)
#: The report note under a rule; its bound is the measurement's only.
SPLIT_NOTE = (
    "energy split between {labels} values by {rule} (each one's fraction of {kind}): an estimate by "
    "that rule, not a measurement; its bound covers the measured energy and units only, not the "
    "rule's assumption that every unit of {kind} costs the same"
)
NO_SPLIT_NOTE = (
    "unit kinds by {labels}: each one's J per unit is the whole job's energy over its units; "
    "the energy is not split between them (--model-split none)"
)
_KIND = re.compile(r"[a-z][a-z0-9_]*")

Labels = tuple[tuple[str, str], ...]


def check_model_split(value: str, option: str) -> str:
    """``value`` as a rule's name; ConfigError naming ``option`` when it is no rule."""
    if value in (NONE, AUTO) or (value.startswith(UNITS) and _KIND.fullmatch(value.removeprefix(UNITS))):
        return value
    raise ConfigError(f"option {option}: {clip(value)} is not auto, none or units:KIND")


@dataclass(frozen=True)
class PerUnit:
    """A model's J per unit of one kind, by the rule."""

    name: str
    units: float
    units_bound: float
    j_per_unit: float | None
    j_per_unit_bound: float | None


@dataclass(frozen=True)
class ModelShare:
    """One label set's part of the job's energy by the rule."""

    labels: dict[str, str]
    rule_units: float  #: its units of the rule's kind
    fraction: float  #: of the rule's units, and so of the energy
    fraction_bound: float  #: half-width, from the units' bounds (window edges) at worst
    energy_j: float
    energy_bound_j: float | None  #: the job's energy bound carried, and the fraction's
    per_unit: list[PerUnit]


@dataclass(frozen=True)
class ModelSplit:
    """The split of a report's energy (over its whole run or window) by a rule."""

    asked: str
    rule: str  #: what ``asked`` resolved to: none or units:KIND
    by: list[str]  #: the label names the series are by
    energy_j: float
    energy_bound_j: float | None
    models: list[ModelShare]  #: empty under ``none``

    @property
    def kind(self) -> str | None:
        return self.rule.removeprefix(UNITS) if self.rule != NONE else None

    def of(self, labels: dict[str, str]) -> ModelShare | None:
        return next((m for m in self.models if m.labels == labels), None)


def _labelled(kinds: list[UnitKind], kind: str) -> list[UnitKind]:
    return [k for k in kinds if k.name == kind and k.labels]


def resolve(asked: str, kinds: list[UnitKind]) -> str:
    """The rule ``asked`` names for these series: ``auto`` made none or units:KIND."""
    if asked != AUTO:
        return asked
    return UNITS + AUTO_KIND if _labelled(kinds, AUTO_KIND) else NONE


def check_applies(r: Report) -> None:
    """ConfigError (one line) when ``r``'s rule names a kind its job has no series by labels of."""
    asked = r.settings.model_split
    if not asked.startswith(UNITS):
        return
    kinds = unit_kinds(r)
    if not _labelled(kinds, asked.removeprefix(UNITS)):
        have = sorted({k.name for k in kinds if k.labels})
        it = f"its unit kinds by labels are {', '.join(have)}" if have else "it has no unit kind by labels"
        raise ConfigError(f"option --model-split: job {clip(r.job.job_id)} has no {asked} by labels ({it})")


def model_split(r: Report) -> ModelSplit | None:
    """``r``'s energy split by its rule; None when the job has no series by labels, or the rule's
    kind has none (:func:`check_applies` says so on the command line)."""
    kinds = unit_kinds(r)
    by = sorted({name for k in kinds for name in k.labels})
    if not by:
        return None
    whole = spans(r)[1]
    energy = whole.figures.window.energy_j
    rel = whole.bound_rel
    bound = None if rel is None else energy * rel
    rule = resolve(r.settings.model_split, kinds)
    if rule == NONE:
        return ModelSplit(r.settings.model_split, rule, by, energy, bound, [])
    kind = rule.removeprefix(UNITS)
    split = _labelled(kinds, kind)
    if not split:
        return None
    total = math.fsum(k.units for k in split)
    total_bound = math.fsum(k.units_bound for k in split)
    if total <= 0:  # none of the kind in the span: nothing to share by
        return ModelSplit(r.settings.model_split, rule, by, energy, bound, [])
    models = []
    given = 0.0
    for n, k in enumerate(split):
        fraction = k.units / total
        part = energy - given if n == len(split) - 1 else energy * fraction
        given = math.fsum([given, part])
        ds = _fraction_bound(k.units, k.units_bound, total, total_bound)
        part_bound = None if bound is None else energy * ds + bound * fraction + bound * ds
        per_unit = [
            _per_unit(o, part, part_bound, total, total_bound, energy, bound, kind)
            for o in kinds
            if o.labels == k.labels
        ]
        models.append(ModelShare(k.labels, k.units, fraction, ds, part, part_bound, per_unit))
    return ModelSplit(r.settings.model_split, rule, by, energy, bound, models)


def _fraction_bound(units: float, bound: float, total: float, total_bound: float) -> float:
    """How far a fraction units/total may be off when each series' units may be off by its bound:
    its own high and the others' low, or the reverse."""
    if total <= 0 or not total_bound:
        return 0.0
    fraction = units / total
    others, others_bound = total - units, total_bound - bound
    high_total = units + bound + max(others - others_bound, 0.0)
    high = (units + bound) / high_total if high_total > 0 else 1.0
    low_units = max(units - bound, 0.0)
    low = low_units / (low_units + others + others_bound) if low_units > 0 else 0.0
    return max(high - fraction, fraction - low)


def _per_unit(
    k: UnitKind,
    energy: float,
    bound: float | None,
    total: float,
    total_bound: float,
    job_energy: float,
    job_bound: float | None,
    rule_kind: str,
) -> PerUnit:
    """A model's J per unit of kind ``k``: its energy by the rule over its units. Of the rule's
    own kind that is the job's energy over all the kind's units, bounded as such (the fraction's
    bound and the units' cancel there)."""
    if k.name == rule_kind:
        energy, bound, units, units_bound = job_energy, job_bound, total, total_bound
    else:
        units, units_bound = k.units, k.units_bound
    if units <= 0:
        return PerUnit(k.name, k.units, k.units_bound, None, None)
    per = energy / units
    if bound is None or units_bound >= units:
        return PerUnit(k.name, k.units, k.units_bound, per, None)
    rel = bound / energy if energy > 0 else 0.0
    return PerUnit(k.name, k.units, k.units_bound, per, per * ((1 + rel) / (1 - units_bound / units) - 1))


def split_note(r: Report) -> str | None:
    """The report's note on the split (rule, or none); None without series by labels."""
    split = model_split(r)
    if split is None:
        return None
    labels = ", ".join(split.by)
    if split.kind is None:
        return NO_SPLIT_NOTE.format(labels=labels)
    if not split.models:
        return f"no {split.kind} in the span: the energy is not split between {labels} values ({split.rule})"
    return SPLIT_NOTE.format(labels=labels, rule=split.rule, kind=split.kind)


def split_json(r: Report) -> dict[str, Any] | None:
    """The report JSON's ``model_split``: the rule and each model's energy and J per unit by it."""
    split = model_split(r)
    if split is None:
        return None
    return {
        "asked": split.asked,
        "rule": split.rule,
        "method": "model",
        "by": split.by,
        "energy_j": split.energy_j,
        "energy_bound_j": split.energy_bound_j,
        "energy_estimate_fraction": spans(r)[1].estimate,
        "energy_estimate_share": spans(r)[1].estimate,  # deprecated name of energy_estimate_fraction
        "bound_covers": "measurement: the job's energy and the units at the window's edges, not the rule",
        "models": [
            {
                "labels": m.labels,
                "rule_units": m.rule_units,
                "fraction": m.fraction,
                "fraction_bound": m.fraction_bound,
                "share": m.fraction,  # deprecated name of fraction
                "share_bound": m.fraction_bound,  # deprecated name of fraction_bound
                "energy_j": m.energy_j,
                "energy_bound_j": m.energy_bound_j,
                "per_unit": [asdict(p) for p in m.per_unit],
            }
            for m in split.models
        ],
    }


def unit_kinds_json(r: Report) -> list[dict[str, Any]]:
    """The report JSON's ``unit_kinds``: each series' unsplit figures (``energy_of``: the job's
    energy) and its model's J per unit by the rule (null under none, or without a fraction)."""
    split = model_split(r)
    out = []
    for k in unit_kinds(r):
        model = None if split is None else split.of(k.labels)
        per = None if model is None else next((p for p in model.per_unit if p.name == k.name), None)
        out.append(
            asdict(k)
            | {
                "energy_of": ENERGY_OF,
                "split_rule": NONE if split is None else split.rule,
                "split_j_per_unit": None if per is None else per.j_per_unit,
                "split_j_per_unit_bound": None if per is None else per.j_per_unit_bound,
            }
        )
    return out
