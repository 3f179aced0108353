"""A service's stored interval summaries read back into a report (``wattline report SVC --since
7d`` without ``--raw``): the whole intervals inside the window that are final, complete and
computed under the report's policy give their energy, and only the rest of the window (its
partial edges, an interval missing, not final or under another policy) is computed from raw
samples.

What an interval stores for that (:func:`stored_fields`, written by the collector's interval
writer): the policy its energy depends on (idle policy, share rule and the knobs of both, as
codes and numbers every store holds), whether it is final (never computed again), and its
saturated window's energy whole (total, above idle, by quality, its bound by term), so the
stretch it covers enters the report as one component, ``stored_intervals``, added to the raw
stretches' components: energy and bounds add as they do across components (linearly, worst
case). A stored interval has no split by component or host: those of the report are the raw
stretches' only, and the report says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

from wattline.accounting.uncertainty import Bound
from wattline.quality import Quality
from wattline.reports.model import ReportSettings
from wattline.reports.window_view import Window
from wattline.reports.windows import ComponentEnergy, WindowEnergy
from wattline.stores.base import IntervalSummary, SummaryValue
from wattline.stores.series.points import SUMMARY_CODES

#: The component a report's stored stretch is shown as.
STORED = "stored_intervals"


@runtime_checkable
class IntervalReader(Protocol):
    """A store whose ``service_interval`` points a report can read back."""

    def service_intervals(self, job_id: str, start_ns: int, end_ns: int) -> list[IntervalSummary]:
        """The job's interval points (not its latency points) starting in [start_ns, end_ns), newest form."""
        ...


#: Policy fields an earlier version stored under another name: such an interval reads as if
#: written now (an InfluxDB rewrite merges fields, so a point may hold both names).
POLICY_RENAMED = {"policy_deviceless_share": "policy_deviceless_fraction"}


def policy_fields(settings: ReportSettings) -> dict[str, float]:
    """The policy an interval's energy is computed under, as stored numbers (string choices as
    their :data:`SUMMARY_CODES` code, as job summaries are stored on VictoriaMetrics)."""
    out = {
        "policy_idle": float(SUMMARY_CODES["policy_idle"].index(settings.idle) + 1),
        "policy_share_rule": float(SUMMARY_CODES["policy_share_rule"].index(settings.share_rule) + 1),
        "policy_deviceless_fraction": float(settings.deviceless_fraction),
        "policy_cores_per_neuron_device": float(settings.cores_per_neuron_device),
    }
    if settings.idle == "subtract":  # the baseline's look-back changes the energy only then
        out["policy_idle_lookback_s"] = float(settings.idle_lookback_s)
    return out


def stored_fields(window: WindowEnergy) -> dict[str, float]:
    """The energy of an interval's report whole, as stored (read back by :func:`stored_energy`)."""
    out = {"energy_total_j": window.energy_j, "energy_dynamic_j": window.dynamic_j}
    by_quality = window.by_quality()
    out |= {f"energy_{q.value}_j": by_quality.get(q, 0.0) for q in Quality}
    out |= {f"bound_{name}_j": value for name, value in window.bound.terms().items()}
    return out


@dataclass(frozen=True)
class StoredInterval:
    """One usable stored interval: its stretch and its energy whole (the values of :data:`_ENERGY_KEYS`)."""

    window: Window
    values: tuple[float, ...]


#: The fields of an interval's energy whole (:func:`stored_fields`), in the order :func:`usable` reads them.
_ENERGY_KEYS = (
    "energy_total_j",
    "energy_dynamic_j",
    *(f"energy_{q.value}_j" for q in Quality),
    *(f"bound_{b.name}" for b in fields(Bound)),
)


def usable(point: IntervalSummary, policy: dict[str, float]) -> StoredInterval | None:
    """``point`` as a stored interval, or None when it may not stand for the raw computation:
    not final, not complete, under another policy, or written before intervals stored their
    energy whole."""
    if _why_not(point, policy):
        return None
    values = [_number(point.fields.get(k)) for k in _ENERGY_KEYS]
    seconds = _number(point.fields.get("seconds"))
    if seconds is None or seconds <= 0 or None in values:
        return None
    window = Window(point.start_ns, point.start_ns + round(seconds * 1e9))
    return StoredInterval(window, tuple(v or 0.0 for v in values))


def _number(value: SummaryValue | None) -> float | None:
    if value is None or isinstance(value, str):
        return None
    out = float(value)
    return out if math.isfinite(out) else None


@dataclass(frozen=True)
class Plan:
    """How a window's figures are obtained: the stored intervals used, and the stretches left
    to compute from raw samples (in order)."""

    window: Window
    stored: list[StoredInterval]
    raw: list[Window]
    why_raw: str = ""  #: when nothing is stored: why (no interval, another policy, a store that cannot read them)

    @property
    def stored_s(self) -> float:
        return math.fsum((s.window.to_ns - s.window.from_ns) / 1e9 for s in self.stored)

    def energy(self) -> ComponentEnergy:
        """The stored intervals' energy together, as one component (bounds added, as across components)."""
        total, dynamic, *rest = (math.fsum(column) for column in zip(*(s.values for s in self.stored), strict=True))
        by_quality = {q.value: j for q, j in zip(Quality, rest, strict=False) if j}
        return ComponentEnergy(STORED, total, dynamic, by_quality, bound=Bound(*rest[len(Quality) :]))

    def note(self) -> str:
        """What the report's figures came from."""
        seconds = (self.window.to_ns - self.window.from_ns) / 1e9
        head = f"{len(self.stored)} stored intervals ({_minutes(self.stored_s)} of {_minutes(seconds)} min)"
        if not self.stored:
            return f"energy from raw samples: no stored interval used ({self.why_raw or 'none stored in the window'})"
        return (
            f"energy from {head}, the rest from raw samples; by component and by host are of the raw "
            f"stretches only, the stored part shown as {STORED} (--raw: all from raw samples)"
        )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.4g}"


def plan(points: Iterable[IntervalSummary], window: Window, policy: dict[str, float], why: str = "") -> Plan:
    """The stored intervals (of ``points``) wholly inside ``window`` that may be used, and the
    stretches of ``window`` they leave (a point rewritten is read in its newest form: one per start)."""
    newest: dict[int, IntervalSummary] = {p.start_ns: p for p in points}
    chosen: list[StoredInterval] = []
    kinds = set()
    for start in sorted(newest):
        got = usable(newest[start], policy)
        if got is None:
            kinds.add(_why_not(newest[start], policy) or "written without their energy whole")
            continue
        inside = window.from_ns <= got.window.from_ns and got.window.to_ns <= window.to_ns
        if inside and (not chosen or chosen[-1].window.to_ns <= got.window.from_ns):
            chosen.append(got)
    return Plan(window, chosen, gaps(window, [s.window for s in chosen]), why or ", ".join(sorted(kinds)))


def _why_not(point: IntervalSummary, policy: dict[str, float]) -> str:
    """Why ``point`` may not be used ("": it may, if it holds its energy whole)."""
    old = {POLICY_RENAMED[k]: v for k, v in point.fields.items() if k in POLICY_RENAMED}
    f = old | {k: v for k, v in point.fields.items() if k not in POLICY_RENAMED}
    if "final" not in f:
        return "written before intervals said whether they are final"
    if f.get("final") != 1.0 or f.get("complete") != 1.0:
        return "not final"
    if sum(1 for k in f if k.startswith("policy_")) != len(policy) or any(f.get(k) != v for k, v in policy.items()):
        return "another policy"
    return ""


def gaps(window: Window, covered: Sequence[Window]) -> list[Window]:
    """The stretches of ``window`` that ``covered`` (in order, not overlapping) leave."""
    out, at = [], window.from_ns
    for w in covered:
        if w.from_ns > at:
            out.append(Window(at, w.from_ns))
        at = max(at, w.to_ns)
    if window.to_ns > at:
        out.append(Window(at, window.to_ns))
    return out


def read_plan(reader: object, job_id: str, window: Window, settings: ReportSettings) -> Plan:
    """The plan of ``window`` from what ``reader`` stores of ``job_id``."""
    policy = policy_fields(settings)
    if not isinstance(reader, IntervalReader):
        return Plan(window, [], [window], "this store's intervals are not read back")
    return plan(reader.service_intervals(job_id, window.from_ns, window.to_ns), window, policy)
