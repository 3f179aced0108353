"""The Services dashboard's PromQL twins: each service's figures per step, from its stored
intervals."""

from __future__ import annotations

from promql.pieces import STEP
from promql.twins import Target, Twins, series

#: The intervals a step holds: those that start in [t - step, t), an interval being stamped at its
#: start, as InfluxQL's ``GROUP BY time`` holds [t, t + step) (drawn at its start, here at its
#: end). ``offset 1ms`` leaves out the step's end on both engines: Prometheus 2 closes a range
#: selector at both ends, VictoriaMetrics (and Prometheus 3) leave out its start.
INTERVALS_OF_STEP = f"{STEP} offset 1ms"


def service_field(fn: str, field: str) -> str:
    return f'{fn}(service_interval_{field}{{name=~"$service"}}{INTERVALS_OF_STEP})'


def per_step(numerator: str, denominator: str) -> str:
    """A ratio of two ``service_interval`` fields summed over each step's intervals (the InfluxQL
    flavour's ``sum(a) / sum(b)`` per ``GROUP BY time``): exact for the step, not a mean of ratios;
    none where the denominator is 0."""
    top, bottom = (service_field("sum_over_time", f) for f in (numerator, denominator))
    return f"{top} / ({bottom} > 0)"  # a step that served nothing has no J per unit (not +Inf)


SERVICE_LEGEND = "{{name}} {{job_id}}"
LATENCY_LEGEND = SERVICE_LEGEND + " {{latency}}"
PANELS = {
    "Power by service": series(per_step("energy_j", "seconds"), SERVICE_LEGEND),
    "Energy per unit by service": series(per_step("energy_j", "units"), SERVICE_LEGEND),
    "Throughput by service": series(per_step("units", "seconds"), SERVICE_LEGEND),
    "Load by service": series(service_field("max_over_time", "load"), SERVICE_LEGEND),
    "Latency by service (p50, p99)": [
        Target(ref, service_field("max_over_time", f"{q}_s"), range=True, legend=f"{LATENCY_LEGEND} {q}")
        for ref, q in (("A", "p50"), ("B", "p99"))
    ],
}

TWINS = Twins(PANELS, {"service": "label_values(service_interval_seconds, name)"})
