"""A report's latency as text (:mod:`wattline.reports.latency`): each quantile as
histogram_quantile interpolates it, beside the bucket interval the true quantile lies in."""

from __future__ import annotations

from wattline.reports.latency import Latency, Quantile
from wattline.reports.output import quantities as q


def quantile_text(x: Quantile) -> str:
    """``412.5 ms in (250 ms, 500 ms]``; in the +Inf bucket ``> 10 s`` (no upper bound)."""
    if x.high is None:
        return f"> {q.si(x.low, 's')}" + (f" (at least {q.si(x.value, 's')})" if x.value > x.low else "")
    return f"{q.si(x.value, 's')} in ({q.si(x.low, 's')}, {q.si(x.high, 's')}]"


def series_name(x: Latency) -> str:
    """``e2e model_name=m`` (the labels sorted; none: the name alone)."""
    return " ".join([x.name, *(f"{k}={v}" for k, v in sorted(x.labels.items()))])


def latency_table(series: list[Latency], span: str) -> tuple[str, list[str], list[list[str]]] | None:
    """(title, head, rows) of the latency series over the report's ``span``; None without any."""
    if not series:
        return None
    head = ["histogram", "observations", *(f"p{x.q * 100:g}" for x in series[0].quantiles), "mean"]
    rows = [
        [
            series_name(x),
            q.count(x.observations) + (f" ± {q.count(x.observations_bound)}" if x.observations_bound else ""),
            *(quantile_text(p) for p in x.quantiles),
            q.si(x.mean_s, "s"),
        ]
        for x in series
    ]
    return f"Latency ({span}; the true quantile lies in the bucket shown)", head, rows


def interval_latency(series: list[Latency]) -> str:
    """One interval's quantiles, compact, a line per series: ``e2e llama: 412.5 ms / > 10 s``
    (the label values only; ``>`` the last finite bound where the quantile is beyond it)."""
    return "\n".join(
        f"{' '.join([x.name, *(v for _, v in sorted(x.labels.items()))])}: "
        + " / ".join(q.si(p.value, "s") if p.high is not None else f"> {q.si(p.low, 's')}" for p in x.quantiles)
        for x in series
    )
