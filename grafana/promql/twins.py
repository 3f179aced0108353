"""What a dashboard's PromQL twins are: panel targets (:class:`Target`), a job event
annotation, and :class:`Twins`, everything of one dashboard the generator swaps in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from promql.pieces import STEP, events_at, mean, sel

PROMETHEUS = {"type": "prometheus", "uid": "wattline-prometheus"}


@dataclass(frozen=True)
class Target:
    ref: str
    expr: str
    range: bool = False  #: a range query (time series over the range); else instant at its end
    table: bool = False
    legend: str = ""

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "refId": self.ref,
            "datasource": dict(PROMETHEUS),
            "editorMode": "code",
            "expr": self.expr,
            "range": self.range,
            "instant": not self.range,
            "format": "table" if self.table else "time_series",
        }
        if self.legend:
            out["legendFormat"] = self.legend
        return out


def instant(expr: str, legend: str = "") -> list[Target]:
    return [Target("A", expr, legend=legend)]


def series(expr: str, legend: str = "") -> list[Target]:
    return [Target("A", expr, range=True, legend=legend)]


def table(*exprs: str) -> list[Target]:
    return [Target(chr(ord("A") + i), expr, table=True) for i, expr in enumerate(exprs)]


def value_names(names: list[str]) -> dict[str, str]:
    """Grafana names a table query's value column ``Value #<refId>``: the rename to ``names``."""
    return {f"Value #{chr(ord('A') + i)}": name for i, name in enumerate(names)}


def wh(expr: str) -> str:
    return f"{expr} / 3600"


def power_by(matchers: tuple[str, ...], channel: tuple[str, ...], label: str) -> list[Target]:
    return series(mean("energy_power_w", matchers, STEP, channel, (label,)), f"{{{{{label}}}}}")


def event_annotation(matchers: tuple[str, ...], text: str, joined: str = "") -> dict[str, Any]:
    return {
        "expr": events_at(sel("job_events_sub_ns", *matchers), joined),
        "titleFormat": "{{job_id}}",
        "textFormat": f"{{{{{text}}}}}",
        "tagKeys": "host",
    }


@dataclass(frozen=True)
class Twins:
    """One dashboard's PromQL twins, by the InfluxQL flavour's names."""

    #: Panel title -> its targets.
    panels: dict[str, list[Target]]
    #: Variable name -> its query; None: the InfluxQL flavour's own helper, not needed here.
    variables: dict[str, str | None]
    #: Annotation name -> its target and labels (``expr``, ``titleFormat``...).
    annotations: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Panel title -> what else differs: ``transformations`` (``"<influx:ID>"`` keeps the
    #: InfluxQL panel's step of that id, ``"<influx:last>"`` its last), ``hidden`` fields,
    #: ``links`` (old text -> new), ``description_note``.
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
