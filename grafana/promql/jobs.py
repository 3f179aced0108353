"""The Jobs dashboard's PromQL twins: the job table, a job's figures, its warm-up, and the
jobs' summaries (:func:`summary`)."""

from __future__ import annotations

from promql.pieces import (
    ADDING_COMPONENTS,
    CHANNEL,
    FLEET,
    NOT_SUBZONES,
    RANGE,
    STEP,
    energy,
    event_time,
    mean,
    sel,
    stamp,
)
from promql.twins import Target, Twins, event_annotation, instant, series, table, value_names, wh

JOB_HOSTS = FLEET
JOB = 'job_id="$job"'
#: How far back job-scoped panels look for a job's summary and the filters for its open,
#: as reports look for a job's events (README "Storage schema").
FAR = "[31d]"
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
            ("measured_fraction", "measured_fraction"),
        )
    ),
]
SUMMARY_SATURATED_MS = summary("saturated_at_ms")
PANELS = {
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

#: The job table's links open the job's window (start to end) or its saturated window
#: (saturation to end) from 1 ms before its first edge: a range selector leaves out its
#: window's first instant, where the job's open and summary (or its saturation) lie.
LINK_FROM = {"start": "window_from", "saturated_at": "measured_from"}
TABLES = {
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

TWINS = Twins(
    PANELS,
    {
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
    {
        "Job open / close": event_annotation(('event=~"open|close"',), "event", JOB_FILTER),
        "Saturation point": event_annotation(SATURATED, "phase", JOB_FILTER),
        "Warm-up (start to saturation)": WARMUP_REGION,
    },
    TABLES,
)
