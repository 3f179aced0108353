"""Write the Prometheus (PromQL) flavour of wattline's dashboards from the InfluxQL ones.

    python grafana/generate.py            # writes grafana/dashboards-prometheus/*.json
    python grafana/generate.py --check    # exit 1 if those files differ from what it would write

grafana/dashboards/*.json (InfluxQL) stay the source of layout, titles, descriptions, units
and links; this script copies each and swaps the data source, every panel target, variable
query and annotation for its twin in PROMQL/VARIABLES/ANNOTATIONS below, so the two flavours
cannot drift apart: a panel without a twin here, or a twin without its panel, stops it.

The queries read what the collector writes to VictoriaMetrics and, by Prometheus remote
write, to Prometheus, Mimir and Thanos (wattline/stores/series/points.py, one
layout): a line-protocol field is the metric ``<measurement>_<field>``, so a sample's energy is
``energy_energy_j`` and every point has ``<measurement>_sub_ns``.

One flavour for every engine: standard PromQL as Prometheus 2.33 and later evaluate it (the
``@`` modifier and negative offsets are stable there), no MetricsQL function:

- a raw sample's time is ``timestamp()`` of its selector, taken at the steps of a subquery
  (:func:`stamp`); exact for a job event's open, phase and close (a series of one sample each),
  and for ranking an agent's streams by their newest sample;
- a channel's last failure is the end of the step (``$__interval``) that holds it, not the
  failing sample's own time (PromQL has no ``tmin_over_time``);
- "Units completed" is each step's units over the range's length before it, not a running
  sum from the range's first step (PromQL has no ``running_sum``): in a range that starts
  before the job, as its table links open it, that is the job's running total;
- a job summary is one series per job whose newest sample is its newest rewrite (#45), read
  through :func:`summary`, which also takes the newest of the several series a job may hold
  from before #45 (its status was a label then); and a summary is taken from the job's start,
  as the summary's ``start_ns`` field says, not from its sample's time stamp (every engine
  stamps a summary when it is written, after the job's start).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE_DIR = HERE / "dashboards"
OUT_DIR = HERE / "dashboards-prometheus"
INFLUX = {"type": "influxdb", "uid": "wattline-influxdb"}
PROMETHEUS = {"type": "prometheus", "uid": "wattline-prometheus"}
TAG = "wattline-prometheus"

# -- query pieces ------------------------------------------------------------------------------

#: The dashboard's time range, exactly: Grafana runs an instant query at its end, and a range
#: selector holds the samples in (from, to] (a sample ending at ``from`` measured time before it).
RANGE = "[${__range_ms}ms]"
STEP = "[$__interval]"
#: How far back job-scoped panels look for a job's summary and the filters for its open,
#: as reports look for a job's events (README "Storage schema").
FAR = "[31d]"
#: A subquery's step for :func:`stamp`: shorter than Prometheus' lookback (5 minutes), so every
#: sample is the newest one at some step.
STAMP_STEP = "1m"
NOT_SUBZONES = 'component!~"cpu_core|cpu_uncore|psys"'
CHANNEL = ("host", "source", "component", "device")
QUALITY_CHANNEL = (*CHANNEL, "quality")
FLEET = ('host=~"$host"', 'component=~"$component"', NOT_SUBZONES)
HOST = ('host="$host"', 'component=~"$component"')
JOB_HOSTS = FLEET
JOB = 'job_id="$job"'
#: A job passes the Jobs dashboard's filters when an open of the 31 days before the range's end
#: carries the user and partition selected, and an open or close the account (Slurm's epilog
#: closes with the account its prolog could not learn). ``=~".*"`` (All) also matches no label.
#: ``@ end()``: a range query's every step asks about the whole range (a close that comes later
#: than the step still tells the account).
JOB_FILTER = (
    " and on (job_id) group by (job_id) (last_over_time(job_events_sub_ns"
    '{event="open", label_user=~"$user", label_partition=~"$partition"}' + FAR + " @ end()))"
    " and on (job_id) group by (job_id) (last_over_time(job_events_sub_ns"
    '{event=~"open|close", label_account=~"$account"}' + FAR + " @ end()))"
)


def sel(metric: str, *matchers: str) -> str:
    return f"{metric}{{{', '.join(matchers)}}}" if matchers else metric


def by(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


def energy(matchers: tuple[str, ...], group: tuple[str, ...] = (), per: str = "") -> str:
    """Energy of the samples in the range, and of the samples the store lacks between two of
    them in one agent stream (a series each here): its running total's last value minus its
    value before the first sample (``cumulative_start_j``, the smallest in the range: a
    running total only grows within a stream). The InfluxQL twin adds, sample by sample, what
    the running total gained beyond each sample's energy since the previous one."""
    clause = f" by ({by(group)})" if group else ""
    total, before = sel("energy_cumulative_j", *matchers), sel("energy_cumulative_start_j", *matchers)
    per_stream = f"last_over_time({total}{RANGE}) - min_over_time({before}{RANGE})"
    return f"sum{clause} ({per_stream}){per}"


def mean(metric: str, matchers: tuple[str, ...], window: str, channel: tuple[str, ...], group: tuple[str, ...]) -> str:
    """Each channel's mean over ``window`` (its agent streams' samples together, as InfluxQL's
    mean over a channel's points), summed by ``group``."""
    selector = sel(metric, *matchers)
    per_channel = (
        f"sum by ({by(channel)}) (sum_over_time({selector}{window}))"
        f" / sum by ({by(channel)}) (count_over_time({selector}{window}))"
    )
    return per_channel if group == channel else f"sum by ({by(group)}) ({per_channel})"


def stamp(selector: str, window: str = RANGE, ahead: bool = False, step: str = STAMP_STEP) -> str:
    """The time stamp (s) of each series' newest sample in ``window`` before the evaluation
    time (``ahead``: in the ``$__interval`` after it): ``timestamp()`` of the selector at every
    ``step`` of the window, at every second of its last minute and at its end (an instant
    sees a sample within the engine's lookback: Prometheus' 5 minutes, VictoriaMetrics' step);
    the samples that lookback reaches before the window are filtered out. Exact for a series
    of one sample (a job's open, phase or close); for a series of many, the newest sample seen
    at those instants, which ranks an agent's streams by their newest sample."""
    span, offset = window[1:-1], " offset -$__interval" if ahead else ""
    seen = " or ".join(
        (
            f"max_over_time(timestamp({selector})[{span}:{step}]{offset})",
            f"max_over_time(timestamp({selector})[{STAMP_STEP}:1s]{offset})",
            f"timestamp({selector}{offset})",
        )
    )
    seconds = "${__range_ms} / 1000" if window == RANGE else "$__interval_ms / 1000"
    return f"(({seen}) > time())" if ahead else f"(({seen}) > time() - {seconds})"


def newest(metric: str, matchers: tuple[str, ...], channel: tuple[str, ...]) -> str:
    """Each channel's last sample in the range, from its newest stream only (an agent restart
    starts a new series of the same channel; InfluxQL's last() sees one). Streams are ranked
    at the dashboard's steps, not every minute: a fleet has many channels, and a stream of
    samples a second apart is seen at every step it lives through."""
    selector, on = sel(metric, *matchers), by(channel)
    stamps = stamp(selector, step="$__interval")
    return (
        f"last_over_time({selector}{RANGE}) and on ({on}, stream)"
        f" ({stamps} == on ({on}) group_left max by ({on}) ({stamps}))"
    )


def last_failure(matchers: tuple[str, ...], group: tuple[str, ...]) -> str:
    """The end (s) of the last step (``$__interval``) of the range that holds an unhealthy
    sample, by ``group``; the range's end when its last, partial step holds one."""
    failed = f"(0 * (min_over_time({sel('energy_healthy', *matchers)}{STEP}) == 0) + time())"
    steps = f"max_over_time({failed}{RANGE[:-1]}:$__interval])"
    return f"max by ({by(group)}) ({failed}) or max by ({by(group)}) ({steps})"


def unhealthy(matchers: tuple[str, ...], group: tuple[str, ...] = ()) -> str:
    """Unhealthy samples in the range (``healthy`` is 1 or 0)."""
    selector, clause = sel("energy_healthy", *matchers), f" by ({by(group)})" if group else ""
    return f"sum{clause} (count_over_time({selector}{RANGE})) - sum{clause} (sum_over_time({selector}{RANGE}))"


def event_time(*matchers: str) -> str:
    """The time stamp (s) of each job event ``matchers`` select in the range (open, phase and
    close: a series each)."""
    return stamp(sel("job_events_sub_ns", *matchers))


def events_at(selector: str, joined: str = "") -> str:
    """Annotation: each event's own time (ms) as the value, seen from the step before and the
    step after it (Grafana aligns the range's end down to a step)."""
    seen = f"{stamp(selector, STEP)} or {stamp(selector, STEP, ahead=True)}"
    return f"1000 * (({seen}){joined})"


# -- panel targets -----------------------------------------------------------------------------


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


FLEET_PANELS = {
    "Power now": instant(f"sum({newest('energy_power_w', FLEET, CHANNEL)})"),
    "Energy over the range": instant(wh(energy(FLEET))),
    "Hosts reporting": instant(f'count(count by (host) (count_over_time(energy_power_w{{host=~"$host"}}{RANGE})))'),
    "Unhealthy channel-intervals": instant(unhealthy(('host=~"$host"',))),
    "Power by host": power_by(FLEET, QUALITY_CHANNEL, "host"),
    "Power by component": power_by(FLEET, QUALITY_CHANNEL, "component"),
    "Energy by host": instant(wh(energy(FLEET, ("host",))), "{{host}}"),
    "Energy by component": instant(wh(energy(FLEET, ("component",))), "{{component}}"),
    "Measured vs estimated energy": instant(wh(energy(FLEET, ("quality",))), "{{quality}}"),
    "Power by quality (measured vs estimated)": power_by(FLEET, QUALITY_CHANNEL, "quality"),
}

HOST_ADDING = (*HOST, NOT_SUBZONES)
HOST_CHANNEL = ("source", "component", "device")
TABLE_CHANNEL = ("component", "device", "source", "quality")
HOST_PANELS = {
    "Host power now": instant(f"sum({newest('energy_power_w', HOST_ADDING, HOST_CHANNEL)})"),
    "Host energy over the range": instant(wh(energy(HOST_ADDING))),
    "Estimated (model) energy": instant(wh(energy((*HOST_ADDING, 'quality="model"')))),
    "Unhealthy intervals": instant(unhealthy(HOST)),
    "Power by component and device": series(
        mean("energy_power_w", HOST, STEP, ("component", "device", "source"), ("component", "device", "source")),
        "{{component}} {{device}} ({{source}})",
    ),
    "Utilization": series(
        mean("energy_utilization", HOST, STEP, ("component", "device"), ("component", "device")),
        "{{component}} {{device}}",
    ),
    "Device memory used": series(
        mean("energy_memory_used_bytes", HOST, STEP, ("component", "device"), ("component", "device")),
        "{{component}} {{device}}",
    ),
    "Energy by component and device": table(
        energy(HOST, TABLE_CHANNEL),
        mean("energy_power_w", HOST, RANGE, TABLE_CHANNEL, TABLE_CHANNEL),
        f"max by ({by(TABLE_CHANNEL)}) (max_over_time({sel('energy_power_w', *HOST)}{RANGE}))",
    ),
    "Source health": series(
        f"max by ({by(HOST_CHANNEL)}) (1 - min_over_time({sel('energy_healthy', *HOST)}{STEP}))",
        "{{source}} {{component}} {{device}}",
    ),
    "Failures: count and last status": table(
        f"1000 * ({last_failure(HOST, HOST_CHANNEL)})",
        f"{unhealthy(HOST, HOST_CHANNEL)} > 0",
    ),
}


def of_jobs(expr: str) -> str:
    return f"{expr}{JOB_FILTER}"


def per_job(fn: str, metric: str, *matchers: str, window: str = RANGE) -> str:
    return f"{fn}({sel(metric, *matchers)}{window})"


IS_OPEN, IS_CLOSE, JOB_HOST = 'event="open"', 'event="close"', 'host=~"$host"'
SATURATED = ('event="phase"', 'phase="saturated"')
OPEN = ("job_events_sub_ns", IS_OPEN)
CLOSE = sel("job_events_sub_ns", IS_CLOSE)
LAST_CLOSE = f"{stamp(CLOSE)} == on (job_id) group_left max by (job_id) ({stamp(CLOSE)})"
IS_UNITS = 'event="units"'
JOB_UNITS = ("job_events_units", JOB, JOB_HOST, IS_UNITS)
WARMUP_OPEN = f"max by (host) ({event_time(IS_OPEN, JOB, JOB_HOST)})"
#: An open, a close, or a phase event of the saturation point (the others have no phase label: "").
WARMUP_EDGES = ('event=~"open|phase|close"', JOB, JOB_HOST, 'phase=~"saturated|"')
WARMUP_LAST = f"max by (host) ({event_time(*WARMUP_EDGES)})"
#: Where a summary is looked for: the 31 days on each side of the evaluation time (a summary
#: is written after its job's start, and stamped then), whatever the step.
SUMMARY_SPAN = "[62d] @ end() offset -31d"


def summary(field: str, *matchers: str) -> str:
    """A summary figure of each job (labels ``job_id`` and ``name``): its series' newest
    sample, of the series with the largest ``computed_ns`` (in ms in its ``__hi`` field) where
    a job has several, written before #45 (a rewrite whose status changed was a series of its own)."""
    computed = f"last_over_time({sel('job_summary_computed_ns__hi', *matchers)}{SUMMARY_SPAN})"
    newest_rewrite = f"{computed} == on (job_id) group_left max by (job_id) ({computed})"
    figure = f"last_over_time({sel(f'job_summary_{field}', *matchers)}{SUMMARY_SPAN})"
    return f"max by (job_id, name) ({figure} and ({newest_rewrite}))"


SUMMARY_START_MS = summary("start_ns__hi")


def started_in(window_ms: str) -> str:
    """The jobs whose summary says they started in the ``window_ms`` before the evaluation time
    (as a range selector holds samples: the window's first instant left out)."""
    return f" and on (job_id) ({SUMMARY_START_MS} > time() * 1000 - {window_ms} <= time() * 1000)"


IN_RANGE = started_in("${__range_ms}")
#: The job table: one query per column (Grafana's table format names a value "Value #<refId>").
JOB_TABLE_COLUMNS = [
    ("start", f"min by (job_id, name) ({of_jobs(event_time(IS_OPEN))}) * 1000"),
    ("hosts", f"count by (job_id, job_kind, unit_name) ({of_jobs(per_job('last_over_time', *OPEN))})"),
    ("end", f"max by (job_id) ({of_jobs(event_time(IS_CLOSE))}) * 1000"),
    (
        "exit_code",
        f"max by (job_id) ({of_jobs(per_job('last_over_time', 'job_events_exit_code', IS_CLOSE))}"
        f" and on (job_id, host, event_seq) ({LAST_CLOSE}))",
    ),
    (
        "saturated_at",
        f"min by (job_id, phase) ({of_jobs(event_time(*SATURATED))}) * 1000",
    ),
    ("units", f"sum by (job_id) ({of_jobs(per_job('sum_over_time', 'job_events_units', IS_UNITS))})"),
    (
        "duration_s",
        f"max by (job_id) (max by (job_id, host) ({of_jobs(event_time(IS_CLOSE))})"
        f" - max by (job_id, host) ({of_jobs(event_time(IS_OPEN))}))",
    ),
    *(
        (column, f"max by (job_id) ({of_jobs(summary(field) + IN_RANGE)})")
        for column, field in (
            ("energy_j", "energy_total_j"),
            ("j_per_unit", "j_per_unit"),
            ("kwh_per_million", "kwh_per_million_units"),
            ("measured_share", "measured_share"),
        )
    ),
]
SUMMARY_SATURATED_MS = summary("saturated_at_ms")
JOBS_PANELS = {
    "Jobs in the time range": table(*(expr for _, expr in JOB_TABLE_COLUMNS)),
    "Energy: $job_name": instant(summary("energy_j", JOB)),
    "Units: $job_name": instant(f"sum({per_job('sum_over_time', *JOB_UNITS)})"),
    "Energy per unit: $job_name": instant(summary("j_per_unit", JOB)),
    "Throughput: $job_name": instant(f"sum({per_job('sum_over_time', *JOB_UNITS)}) / $__range_s"),
    "Mean power: $job_name": instant(energy(JOB_HOSTS, per=" / $__range_s")),
    "Power of $job_name's hosts, warm-up shaded": [
        Target("A", mean("energy_power_w", JOB_HOSTS, STEP, CHANNEL, ("host",)), range=True, legend="{{host}}"),
        # 1 while a host's latest of open, saturation point and close is an open, else 0.
        Target("B", f"{WARMUP_OPEN} == bool {WARMUP_LAST}", range=True, legend="warm-up {{host}}"),
    ],
    "Units completed: $job_name": series(f"sum({per_job('sum_over_time', *JOB_UNITS)}) or vector(0)", "units"),
    "Energy by component: $job_name's hosts": instant(wh(energy(JOB_HOSTS, ("component",))), "{{component}}"),
    "Measured vs estimated: $job_name's hosts": instant(wh(energy(JOB_HOSTS, ("quality",))), "{{quality}}"),
    "J per unit over time, by job name": series(
        f"avg by (name) ({of_jobs(summary('j_per_unit') + started_in('$__interval_ms'))})", "{{name}}"
    ),
    "Energy by job over the range": instant(
        wh(f"sum by (job_id, name) ({of_jobs(summary('energy_total_j') + IN_RANGE)})")
    ),
    "Energy no job claims, by host": table(
        energy((NOT_SUBZONES,), ("host",)),
        f"sum by (host) (last_over_time(job_summary_host_energy_j{SUMMARY_SPAN}){IN_RANGE})",
    ),
}


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
SERVICES_PANELS = {
    "Power by service": series(per_step("energy_j", "seconds"), SERVICE_LEGEND),
    "Energy per unit by service": series(per_step("energy_j", "units"), SERVICE_LEGEND),
    "Throughput by service": series(per_step("units", "seconds"), SERVICE_LEGEND),
    "Load by service": series(service_field("max_over_time", "load"), SERVICE_LEGEND),
    "Latency by service (p50, p99)": [
        Target(ref, service_field("max_over_time", f"{q}_s"), range=True, legend=f"{LATENCY_LEGEND} {q}")
        for ref, q in (("A", "p50"), ("B", "p99"))
    ],
}
PROMQL = {"fleet": FLEET_PANELS, "host": HOST_PANELS, "jobs": JOBS_PANELS, "services": SERVICES_PANELS}

# -- what else differs per panel ---------------------------------------------------------------

#: The job table's links open the job's window (start to end) or its saturated window
#: (saturation to end) from 1 ms before its first edge: a range selector leaves out its
#: window's first instant, where the job's open and summary (or its saturation) lie.
LINK_FROM = {"start": "window_from", "saturated_at": "measured_from"}
TABLE_OVERRIDES: dict[str, dict[str, dict[str, Any]]] = {
    "host": {
        "Energy by component and device": {
            "transformations": [
                {"id": "merge", "options": {}},
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True},
                        "renameByName": value_names(["Energy", "Mean power", "Peak power"]),
                        "indexByName": {
                            **{name: i for i, name in enumerate(TABLE_CHANNEL)},
                            **{f"Value #{ref}": 4 + i for i, ref in enumerate("ABC")},
                        },
                    },
                },
            ]
        },
        "Failures: count and last status": {
            "description_note": " The Prometheus data model keeps no status text (a string field): the table shows "
            "when each channel last failed (the end of the step that holds it) and how often, not why.",
            "transformations": [
                {"id": "merge", "options": {}},
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True},
                        "renameByName": value_names(["Last failure", "Failed intervals"]),
                        "indexByName": {"source": 0, "component": 1, "device": 2, "Value #B": 3, "Value #A": 4},
                    },
                },
            ],
        },
    },
    "jobs": {
        "Jobs in the time range": {
            "transformations": [
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True},
                        "renameByName": {
                            **value_names([column for column, _ in JOB_TABLE_COLUMNS]),
                            "job_kind": "kind",
                            "unit_name": "unit",
                            "phase": "saturated",
                        },
                        "indexByName": {},
                    },
                },
                "<influx:joinByField>",
                "<influx:calculateField>",
                *(
                    {
                        "id": "calculateField",
                        "options": {
                            "mode": "binary",
                            "alias": alias,
                            "replaceFields": False,
                            "binary": {"left": edge, "operator": "-", "right": "1"},
                        },
                    }
                    for edge, alias in LINK_FROM.items()
                ),
                "<influx:last>",
            ],
            "hidden": list(LINK_FROM.values()),
            "links": {
                f"${{__data.fields.{edge}.numeric}}&to": f"${{__data.fields.{alias}.numeric}}&to"
                for edge, alias in LINK_FROM.items()
            },
        },
        "Energy no job claims, by host": {
            "transformations": [
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True},
                        "renameByName": value_names(["node_j", "jobs_j"]),
                        "indexByName": {},
                    },
                },
                "<influx:joinByField>",
                "<influx:calculateField>",
            ]
        },
    },
}

# -- variables and annotations -----------------------------------------------------------------

ADDING_COMPONENTS = f'label_values(energy_power_w{{host=~"$host", {NOT_SUBZONES}}}, component)'
#: Each InfluxQL variable's twin; None: the InfluxQL flavour's own helper, not needed here.
VARIABLES: dict[str, dict[str, str | None]] = {
    "fleet": {"host": "label_values(energy_power_w, host)", "component": ADDING_COMPONENTS},
    "host": {
        "host": "label_values(energy_power_w, host)",
        "component": 'label_values(energy_power_w{host="$host"}, component)',
    },
    "jobs": {
        "user": 'label_values(job_events_sub_ns{event="open"}, label_user)',
        "account": 'label_values(job_events_sub_ns{event=~"open|close"}, label_account)',
        "partition": 'label_values(job_events_sub_ns{event="open"}, label_partition)',
        "jobs_up": None,
        "jobs_account": None,
        "job": 'label_values(job_events_sub_ns{event="open"}, job_id)',
        "job_name": f'label_values(job_events_sub_ns{{event="open", {JOB}}}, name)',
        "host": f"label_values(job_events_sub_ns{{{JOB}}}, host)",
        "component": ADDING_COMPONENTS,
    },
    "services": {"service": "label_values(service_interval_seconds, name)"},
}


def event_annotation(matchers: tuple[str, ...], text: str, joined: str = "") -> dict[str, Any]:
    return {
        "expr": events_at(sel("job_events_sub_ns", *matchers), joined),
        "titleFormat": "{{job_id}}",
        "textFormat": f"{{{{{text}}}}}",
        "tagKeys": "host",
    }


WARMUP_REGION = {
    # From the job's start to its saturation point: the value is the step's time held to
    # [start, saturation], on the steps from the one before the start to the one after the
    # saturation point, so Grafana joins them into one region with exact ends.
    "expr": (
        f"((clamp_min({SUMMARY_START_MS}, time() * 1000) <= {SUMMARY_SATURATED_MS}) or {SUMMARY_SATURATED_MS})"
        f" and ({SUMMARY_START_MS} < time() * 1000 + $__interval_ms)"
        f" and ({SUMMARY_SATURATED_MS} > time() * 1000 - $__interval_ms){JOB_FILTER}"
    ),
    "titleFormat": "{{job_id}}",
    "textFormat": "{{name}}",
    "tagKeys": "job_id",
}
ANNOTATIONS: dict[str, dict[str, dict[str, Any]]] = {
    "fleet": {"Job open / close": event_annotation(('event=~"open|close"', 'host=~"$host"'), "event")},
    "host": {"Job open / close": event_annotation(('event=~"open|close"', 'host="$host"'), "event")},
    "jobs": {
        "Job open / close": event_annotation(('event=~"open|close"',), "event", JOB_FILTER),
        "Saturation point": event_annotation(SATURATED, "phase", JOB_FILTER),
        "Warm-up (start to saturation)": WARMUP_REGION,
    },
    "services": {},
}

# -- the generator -----------------------------------------------------------------------------


class Mismatch(ValueError):
    """The InfluxQL dashboards and the twins here disagree."""


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard.get("panels", []):
        out += [panel, *panel.get("panels", [])]
    return out


def swap_datasources(node: Any) -> Any:
    if isinstance(node, dict):
        if node == INFLUX:
            return dict(PROMETHEUS)
        return {k: swap_datasources(v) for k, v in node.items()}
    if isinstance(node, list):
        return [swap_datasources(v) for v in node]
    return node


def influx_step(kept: list[dict[str, Any]], marker: str) -> dict[str, Any]:
    """The InfluxQL panel's transformation ``<influx:ID>`` (the only one of that id) or ``<influx:last>``."""
    wanted = marker.removeprefix("<influx:").removesuffix(">")
    if wanted == "last":
        return kept[-1]
    (step,) = [s for s in kept if s["id"] == wanted]
    return step


def panel_twin(name: str, panel: dict[str, Any]) -> None:
    targets = PROMQL[name].get(panel["title"])
    if targets is None:
        raise Mismatch(f"{name}: panel {panel['title']!r} has no PromQL twin")
    panel["targets"] = [t.json() for t in targets]
    extra = TABLE_OVERRIDES.get(name, {}).get(panel["title"], {})
    if "transformations" in extra:
        kept = panel.get("transformations", [])
        panel["transformations"] = [influx_step(kept, s) if isinstance(s, str) else s for s in extra["transformations"]]
    for field in extra.get("hidden", []):
        hide = {"matcher": {"id": "byName", "options": field}, "properties": [{"id": "custom.hidden", "value": True}]}
        panel["fieldConfig"]["overrides"].append(hide)
    if "links" in extra:
        text = json.dumps(panel["fieldConfig"])
        for old, new in extra["links"].items():
            if old not in text:
                raise Mismatch(f"{name}: panel {panel['title']!r} has no link with {old!r}")
            text = text.replace(old, new)
        panel["fieldConfig"] = json.loads(text)
    if "description_note" in extra:
        panel["description"] += extra["description_note"]


def variable_twin(name: str, variables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    twins = VARIABLES[name]
    if [v["name"] for v in variables] != list(twins):
        raise Mismatch(f"{name}: variables {[v['name'] for v in variables]} but twins for {list(twins)}")
    out = []
    for variable in variables:
        query = twins[variable["name"]]
        if query is not None:
            refid = "PrometheusVariableQueryEditor-VariableQuery"
            out.append({**variable, "query": {"qryType": 5, "query": query, "refId": refid}})
    return out


def annotation_twin(name: str, annotation: dict[str, Any]) -> dict[str, Any]:
    if annotation["datasource"] != PROMETHEUS:
        return annotation
    twin = ANNOTATIONS[name].get(annotation["name"])
    if twin is None:
        raise Mismatch(f"{name}: annotation {annotation['name']!r} has no PromQL twin")
    # limit, matchAny, tags, type: Grafana's annotation target (its schema requires them).
    kept = {k: annotation["target"][k] for k in ("limit", "matchAny", "tags", "type")}
    target = {**kept, "refId": "Anno", "expr": twin["expr"], "interval": "1m"}
    shown = {k: v for k, v in twin.items() if k != "expr"}
    return {**annotation, "target": target, **shown, "useValueForTime": True}


def prometheus_flavour(name: str, source: dict[str, Any]) -> dict[str, Any]:
    """The PromQL twin of the InfluxQL dashboard ``source`` (named ``name``)."""
    # Links and uids: /d/wattline-jobs/wattline-jobs -> /d/wattline-prom-jobs/wattline-prom-jobs.
    text = re.sub(r"/d/wattline-(\w+)/wattline-(\w+)", r"/d/wattline-prom-\1/wattline-prom-\2", json.dumps(source))
    dashboard = swap_datasources(json.loads(text))
    dashboard["uid"] = f"wattline-prom-{name}"
    dashboard["title"] += " (Prometheus)"
    dashboard["description"] += " PromQL flavour, for Prometheus, Mimir, Thanos and VictoriaMetrics."
    dashboard["tags"] = [TAG]
    for link in dashboard.get("links", []):
        if link["type"] == "dashboards":
            link["tags"] = [TAG]
    titles = [p["title"] for p in all_panels(dashboard)]
    for panel in all_panels(dashboard):
        panel_twin(name, panel)
    unused = set(PROMQL[name]) - set(titles)
    if unused:
        raise Mismatch(f"{name}: PromQL twins of no panel: {sorted(unused)}")
    dashboard["templating"]["list"] = variable_twin(name, dashboard["templating"]["list"])
    dashboard["annotations"]["list"] = [annotation_twin(name, a) for a in dashboard["annotations"]["list"]]
    return dashboard


def render(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2) + "\n"


def generated() -> dict[Path, str]:
    out = {}
    for name in PROMQL:
        source = json.loads((SOURCE_DIR / f"{name}.json").read_text())
        out[OUT_DIR / f"{name}.json"] = render(prometheus_flavour(name, copy.deepcopy(source)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the files on disk are not what would be written"
    )
    args = parser.parse_args(argv)
    try:
        files = generated()
    except (OSError, ValueError) as exc:  # Mismatch too
        print(f"grafana/generate.py: {exc}", file=sys.stderr)
        return 1
    stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(HERE.parent)} is out of date: run python grafana/generate.py", file=sys.stderr)
        return 1 if stale else 0
    OUT_DIR.mkdir(exist_ok=True)
    for path in stale:
        path.write_text(files[path])
        print(f"wrote {path.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
