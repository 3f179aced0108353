"""The Prometheus (PromQL) flavour of the Grafana dashboards (grafana/dashboards-prometheus/,
written by grafana/generate.py from the InfluxQL ones) and its provisioning files.

1. The files are what the generator writes, match Grafana's Dashboard schema, and read the
   Prometheus data source everywhere; each panel keeps its InfluxQL twin's title, type and unit;
   no query calls a function Prometheus' PromQL lacks (Mimir and Thanos get this flavour).
2. Every panel query, variable query and annotation query runs on each engine the flavour
   is for that installs here: a real ``victoria-metrics`` of its own, filled through
   ``VictoriaStore``, and a real ``prometheus`` of its own (remote-write receiver, an
   out-of-order window), filled through ``PrometheusStore``; each with the batches of
   tests/helpers/grafana_data.py (HOST_B's agent restarts halfway: two streams of each of its
   channels) and the job summaries wattline computes from that store, each job's written
   twice (a partial rewrite first, whose status differs: a series of its own on
   Prometheus; the dashboards must show the final one only), after substituting
   variables as Grafana's Prometheus data source does (``$__range_ms``, ``$__interval``...;
   a multi-value or All selection as an escaped ``(a|b)``, a custom all value as is, a single
   value unescaped), as instant queries at the range's end or range queries over the range
   aligned to the step. Every figure is checked against the fixture's construction (known
   power x time, units and shares: tests/helpers/grafana_data.py's ``job_truths``), never against
   wattline's own report; a range selector holds the samples in (from, to], so the truths
   count a sample from just after ``from``.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from grafana_data import (
    CHANNELS,
    DURATION_S,
    FILTER_CASES,
    FILTER_OPTIONS,
    HOLED,
    HOST_A,
    HOST_B,
    INTERVAL_S,
    JOBS,
    LLAMA,
    SUBZONES,
    UNHEALTHY,
    Channel,
    Fixture,
    JobPlan,
    JobTruth,
    S,
    all_panels,
    build_batches,
    choose,
    claimed_by_host,
    close,
    counted,
    expected_energy,
    find_panel,
    in_totals,
    job_truths,
    load_dashboard,
    query_text,
    schema_errors,
    stored_power,
)
from servers import http, run_victoria, start_prometheus
from victoria_peer import victoria_argv

from wattline.reports.summaries.summary import record_summary
from wattline.stores.base import JobSummary, Store, WriteResult
from wattline.stores.prometheus.store import PrometheusStore
from wattline.stores.victoria.store import VictoriaStore

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "grafana" / "dashboards-prometheus"
INFLUX_DIR = ROOT / "grafana" / "dashboards"
PROVISIONING = ROOT / "grafana" / "provisioning"
NAMES = ("fleet", "host", "jobs", "services")
DATASOURCE = {"type": "prometheus", "uid": "wattline-prometheus"}
RESTARTS = {HOST_B: 305}  # mid-step: a step's window holds samples of both streams


def load(name: str) -> dict[str, Any]:
    return load_dashboard(PROM_DIR / f"{name}.json")


# -- 1. the files ---------------------------------------------------------------------------


def test_generated_files_are_current() -> None:
    """grafana/dashboards-prometheus/ is what `python grafana/generate.py` writes now."""
    proc = subprocess.run(
        [sys.executable, "grafana/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.stem for p in PROM_DIR.glob("*.json")) == list(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_dashboard_matches_grafana_schema(dashboard_schema: dict[str, Any], name: str) -> None:
    errors = schema_errors(dashboard_schema, load(name))
    assert not errors, f"{name}.json does not match Grafana's Dashboard schema:\n" + "\n".join(errors)


def exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target, annotation and variable."""
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for annotation in dashboard["annotations"]["list"]:
        if annotation["datasource"] == DATASOURCE:
            yield f"annotation {annotation['name']!r}", annotation["target"]["expr"]
    for variable in dashboard["templating"]["list"]:
        yield f"variable ${variable['name']}", query_text(variable)


def convention_problems(dashboard: dict[str, Any]) -> list[str]:
    problems = []
    for panel in all_panels(dashboard):
        sources = [panel["datasource"], *(t["datasource"] for t in panel["targets"])]
        if any(s != DATASOURCE for s in sources) or not panel.get("description"):
            problems.append(f"panel {panel['title']!r}: not all on {DATASOURCE['uid']}, or no description")
    for variable in dashboard["templating"]["list"]:
        if variable["datasource"] != DATASOURCE:
            problems.append(f"variable ${variable['name']}: data source is not {DATASOURCE['uid']}")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for where, expr in exprs(dashboard):
        # A multi-value variable is formatted as a regex: it needs =~; a single value is not.
        for match in re.finditer(r'(=~|=|!~)"\$(\w+)"', expr):
            variable = variables.get(match.group(2))
            many = variable is not None and (variable.get("multi") or variable.get("includeAll"))
            if match.group(1) != ("=~" if many else "="):
                problems.append(f"{where}: ${match.group(2)} used with {match.group(1)}")
        if "$__range]" in expr or "$__range_s]" in expr:
            problems.append(f"{where}: [$__range] is rounded to seconds; use [${{__range_ms}}ms]")
    return problems


@pytest.mark.parametrize("name", NAMES)
def test_dashboard_conventions(name: str) -> None:
    dashboard, twin = load(name), load_dashboard(INFLUX_DIR / f"{name}.json")
    assert dashboard["uid"] == f"wattline-prom-{name}" and dashboard["uid"] != twin["uid"]
    assert convention_problems(dashboard) == []
    shape = [(p["id"], p["title"], p["type"], p["fieldConfig"]["defaults"].get("unit")) for p in all_panels(dashboard)]
    assert shape == [
        (p["id"], p["title"], p["type"], p["fieldConfig"]["defaults"].get("unit")) for p in all_panels(twin)
    ]
    assert "/d/wattline-jobs/" not in json.dumps(dashboard)  # links stay within the flavour


def test_conventions_catch_mistakes() -> None:
    dashboard = load("jobs")
    panel = find_panel(dashboard, "Units: $job_name")
    panel["targets"][0]["expr"] = 'sum(sum_over_time(job_events_units{job_id=~"$job", host="$host"}[$__range]))'
    problems = convention_problems(dashboard)
    assert any("$job used with =~" in p for p in problems), problems
    assert any("$host used with =" in p for p in problems), problems
    assert any("rounded to seconds" in p for p in problems), problems


#: Prometheus 2.33's PromQL (https://prometheus.io/docs/prometheus/latest/querying/functions/ and
#: operators/): its functions, aggregation operators, and the keywords written before "(".
#: Mimir and Thanos evaluate PromQL with Prometheus' engine; anything else (MetricsQL's
#: ``tlast_over_time``, ``running_sum``, ``WITH``...) runs on VictoriaMetrics only.
# fmt: off
PROMQL = frozenset((
    # functions
    "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "avg_over_time", "ceil",
    "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time", "day_of_month", "day_of_week",
    "day_of_year", "days_in_month", "deg", "delta", "deriv", "exp", "floor", "histogram_quantile", "holt_winters",
    "hour", "idelta", "increase", "irate", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2",
    "max_over_time", "min_over_time", "minute", "month", "pi", "predict_linear", "present_over_time",
    "quantile_over_time", "rad", "rate", "resets", "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_desc",
    "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp", "vector",
    "year",
    # aggregation operators
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
    # keywords before "(": grouping, vector matching, set operators, the @ modifier's start() and end()
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "start", "end",
))
# fmt: on


def non_promql(expr: str) -> set[str]:
    """What ``expr`` calls that is not Prometheus' PromQL (Grafana's ``label_values`` of a
    variable aside); quoted strings (label values, regexes) left out."""
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return set(re.findall(r"([A-Za-z_]\w*)\s*\(", code)) - PROMQL - {"label_values"}


@pytest.mark.parametrize("name", NAMES)
def test_only_standard_promql(name: str) -> None:
    """The flavour is Prometheus', Mimir's and Thanos' as well as VictoriaMetrics': no query calls
    a function PromQL lacks (those engines are not installable here: this is what says so)."""
    assert {where: sorted(non_promql(expr)) for where, expr in exprs(load(name)) if non_promql(expr)} == {}


def test_standard_promql_check_catches_metricsql() -> None:
    assert non_promql('tlast_over_time(job_events_sub_ns{event="open"}[1h])') == {"tlast_over_time"}
    assert non_promql("running_sum(sum(x)) or rollup_candlestick(y[5m])") == {"running_sum", "rollup_candlestick"}
    assert non_promql('sum by (host) (last_over_time(x{a=~"f(o)o"}[5m] @ end())) or vector(0)') == set()


def test_provisioning_files() -> None:
    datasource = (PROVISIONING / "datasources" / "wattline-prometheus.yaml").read_text()
    assert re.search(rf"^\s+uid: {DATASOURCE['uid']}$", datasource, re.M)
    assert re.search(r"^\s+type: prometheus$", datasource, re.M)
    assert "url: ${WATTLINE_PROMETHEUS_URL}" in datasource
    provider = (PROVISIONING / "dashboards" / "wattline-prometheus.yaml").read_text()
    assert re.search(r"^\s+path: /var/lib/grafana/dashboards/wattline-prometheus$", provider, re.M)
    assert re.search(r"^\s+folderUid: wattline-prometheus$", provider, re.M)
    assert "\t" not in datasource + provider


# -- 2. the queries on the engines ----------------------------------------------------------

ENGINES = ("victoriametrics", "prometheus")


@dataclass
class Filled:
    """An engine filled before it is made: nothing is written to it after, so a query's
    answer is kept (``answers``) and a panel run twice is asked once."""

    url: str
    fx: Fixture
    engine: str = "victoriametrics"
    answers: dict[str, bytes] = field(default_factory=dict, repr=False)


def post(filled: Filled, path: str, params: dict[str, str]) -> Any:
    body = urllib.parse.urlencode(params).encode()
    key = path + "?" + body.decode()
    if key not in filled.answers:
        request = urllib.request.Request(filled.url + path, data=body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                filled.answers[key] = resp.read()
        except urllib.error.HTTPError as exc:
            pytest.fail(f"{filled.engine} refused {params.get('query')!r}: {exc.read().decode()[:500]}", pytrace=False)
    doc = json.loads(filled.answers[key])
    assert doc["status"] == "success", doc
    return doc["data"]


def after_a_partial_rewrite(
    store: Store, searchable: Callable[[str, int], object]
) -> Callable[[JobSummary], WriteResult]:
    """A summary sink that writes, before each summary, one its final one rewrites: status
    "running" (before #45 a label: another series), figures and host energies doubled (more
    than the final ones: a maximum would show them), computed a second earlier (searchable
    before the final one is written)."""

    def sink(summary: JobSummary) -> WriteResult:
        assert summary.fields["status"] != "running"
        fields = {k: v * 2 if isinstance(v, float) else v for k, v in summary.fields.items()}
        fields.update(status="running", closed=False, computed_ns=int(summary.fields["computed_ns"]) - S)
        partial = store.write_summary(
            replace(summary, fields=fields, hosts={h: e * 2 for h, e in summary.hosts.items()})
        )
        assert partial.rejected == 0, partial.reasons
        searchable(f'job_summary_energy_j{{job_id="{summary.job_id}"}}', 1)
        return store.write_summary(summary)

    return sink


def fill(store: Store, fx: Fixture, searchable: Callable[[str, int], object]) -> None:
    """Write the fixture's batches and each job's summaries (a partial one, then the final one,
    as a collector writes them: the same report code).
    ``searchable(selector, series)`` waits until the engine shows that many series."""
    for batch in build_batches(fx, RESTARTS):
        result = store.write(batch)
        assert result.rejected == 0, result.reasons
    streams = len(CHANNELS) + sum(1 for c in CHANNELS if c.host in RESTARTS)
    searchable(f'energy_energy_j{{host=~"{HOST_A}|{HOST_B}"}}', streams)
    searchable('{__name__="job_events_sub_ns", event="close"}', sum(len(j.hosts) for j in JOBS))
    sink = after_a_partial_rewrite(store, searchable)
    for job in JOBS:
        record_summary(store, sink, job.job_id)
    searchable("job_summary_energy_j", len(JOBS))


@pytest.fixture(scope="module", params=ENGINES)
def filled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Filled]:
    # The data on a whole hour 2 to 3 hours ago: inside Prometheus' out-of-order window, before
    # the summaries every engine stamps when they are written (#45).
    base_ns = (time.time_ns() // S // 3600 - 2) * 3600 * S
    fx = Fixture(start_ns=base_ns, end_ns=base_ns + DURATION_S * S)
    if request.param == "victoriametrics":
        # One of its own: its label APIs answer by day, and other tests write today.
        with contextmanager(run_victoria)(tmp_path_factory, victoria_argv) as victoria_metrics:
            with VictoriaStore(victoria_metrics.url) as store:
                fill(store, fx, lambda match, n: victoria_metrics.export(match, expect=n))
            yield Filled(victoria_metrics.url, fx, request.param)
        return
    # A Prometheus of its own (its label APIs answer from the whole head block, not by day).
    daemon = start_prometheus(tmp_path_factory.mktemp("prometheus-grafana"))
    try:
        with PrometheusStore(daemon.url) as store:
            fill(store, fx, lambda match, n: None)  # searchable once acknowledged
        yield Filled(daemon.url, fx, request.param)
    finally:
        daemon.stop()


def special_regex_escape(value: str) -> str:
    """Grafana's prometheusSpecialRegexEscape: a regex escape, doubled for a PromQL string."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]+?.()|]", lambda m: "\\\\" + m.group(0), value)


def regular_escape(value: str) -> str:
    """Grafana's prometheusRegularEscape (a single-value variable)."""
    return value.replace("\\", "\\\\").replace("'", "\\\\'")


def format_interval(seconds: int) -> str:
    """Grafana's gtime.FormatInterval, for whole seconds."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass
class Scope:
    """A dashboard state: time range, interval (the step of range queries) and the variables."""

    from_ms: int
    to_ms: int
    interval_s: int = INTERVAL_S
    values: dict[str, list[str]] = field(default_factory=dict)
    raw: dict[str, str] = field(default_factory=dict)
    variables: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def range_s(self) -> int:
        return round((self.to_ms - self.from_ms) / 1000)

    def interpolate(self, expr: str, interval_s: int | None = None) -> str:
        step = self.interval_s if interval_s is None else interval_s
        builtins = {
            "__range_ms": str(self.to_ms - self.from_ms),
            "__range_s": str(self.range_s),
            "__range": f"{self.range_s}s",
            "__interval_ms": str(step * 1000),
            "__interval": format_interval(step),
        }

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2)
            if name in builtins:
                return builtins[name]
            if name in self.raw:
                return self.raw[name]
            assert name in self.values, f"${name} is not defined (yet) when running {expr!r}"
            variable, values = self.variables[name], self.values[name]
            if not (variable.get("multi") or variable.get("includeAll")):
                return regular_escape(values[0])
            escaped = [special_regex_escape(v) for v in values]
            return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

        return re.sub(r"\$(?:\{(\w+)\}|(\w+))", substitute, expr)


def seconds(ms: int) -> str:
    return f"{ms / 1000:.3f}"


def instant(filled: Filled, scope: Scope, expr: str) -> list[dict[str, Any]]:
    """An instant query at the range's end (Grafana's): rows of labels and "value"."""
    params = {"query": scope.interpolate(expr), "time": seconds(scope.to_ms)}
    data = post(filled, "/api/v1/query", params)
    return [{**r["metric"], "value": float(r["value"][1])} for r in data["result"]]


def aligned(scope: Scope, step_s: int) -> tuple[int, int]:
    """Grafana aligns a range query's start and end down to the step (UTC)."""
    step_ms = step_s * 1000
    return scope.from_ms // step_ms * step_ms, scope.to_ms // step_ms * step_ms


def over_range(filled: Filled, scope: Scope, expr: str, step_s: int | None = None) -> list[dict[str, Any]]:
    """A range query over the range: per series its labels and "points" {ms: value}."""
    step = scope.interval_s if step_s is None else step_s
    start, end = aligned(scope, step)
    params = {"query": scope.interpolate(expr, step), "start": seconds(start), "end": seconds(end), "step": str(step)}
    data = post(filled, "/api/v1/query_range", params)
    return [{**r["metric"], "points": {round(t * 1000): float(v) for t, v in r["values"]}} for r in data["result"]]


LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?(\w+)\)$")


def resolve_variables(
    filled: Filled, dashboard: dict[str, Any], scope: Scope, select: dict[str, str | list[str]]
) -> dict[str, list[str]]:
    """Run the variables in order, as Grafana does on load (label_values: the label API with
    the series selector over the range); returns each one's options, selected by ``choose``."""
    options: dict[str, list[str]] = {}
    for variable in dashboard["templating"]["list"]:
        name = variable["name"]
        scope.variables[name] = variable
        match = LABEL_VALUES.match(scope.interpolate(query_text(variable)))
        assert match, f"${name}: {query_text(variable)!r} is not label_values(...)"
        selector, label = match.groups()
        params = [("start", seconds(scope.from_ms)), ("end", seconds(scope.to_ms))]
        params += [("match[]", selector)] if selector else []
        status, body = http("GET", f"{filled.url}/api/v1/label/{label}/values?{urllib.parse.urlencode(params)}")
        assert status == 200, body
        found = sorted(json.loads(body)["data"]) if variable.get("sort") else json.loads(body)["data"]
        options[name] = found
        choose(variable, found, select, scope.values, scope.raw)
    return options


def run_panel(filled: Filled, scope: Scope, panel: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for target in panel["targets"]:
        run = over_range if target["range"] else instant
        out[target["refId"]] = run(filled, scope, target["expr"])
    return out


def legend(template: str, labels: dict[str, Any]) -> str:
    """Grafana's renderLegendFormat: {{label}} replaced by the label's value."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: str(labels.get(m.group(1), "")), template)


def annotation_events(filled: Filled, scope: Scope, annotation: dict[str, Any]) -> list[dict[str, Any]]:
    """Grafana's Prometheus annotations: a range query (step: the target's interval, at least
    range / 1500 rounded), each series' values taken as times (useValueForTime), values no
    more than a step apart joined into one region."""
    assert annotation["useValueForTime"] is True
    minimum = int(annotation["target"]["interval"].removesuffix("m")) * 60
    step = max(minimum, math.ceil((scope.to_ms - scope.from_ms) / 1000 / 1500))
    events = []
    for s in over_range(filled, scope, annotation["target"]["expr"], step):
        event: dict[str, Any] | None = None
        for when in (math.floor(v) for _, v in sorted(s["points"].items())):
            if event is not None and event["end"] + step * 1000 >= when:
                event["end"] = when
                continue
            if event is not None:
                events.append(event)
            title, text = (legend(annotation[key], s) for key in ("titleFormat", "textFormat"))
            tags = [s[k] for k in annotation["tagKeys"].split(",") if k in s]
            event = {"time": when, "end": when, "title": title, "text": text, "tags": tags}
        if event is not None:
            events.append(event)
    return events


def run_dashboard(filled: Filled, dashboard: dict[str, Any], scope: Scope) -> list[str]:
    """Run every panel and annotation query; those that came back empty."""
    empty = []
    for panel in all_panels(dashboard):
        for ref, result in run_panel(filled, scope, panel).items():
            if not result:
                empty.append(f"panel {panel['title']!r} {ref}")
    for annotation in dashboard["annotations"]["list"]:
        if annotation["datasource"] == DATASOURCE and not annotation_events(filled, scope, annotation):
            empty.append(f"annotation {annotation['name']!r}")
    return empty


def table(filled: Filled, scope: Scope, panel: dict[str, Any], key: tuple[str, ...]) -> dict[tuple[str, ...], Any]:
    """A table panel as Grafana builds it: each query's series a row of its labels and its value
    ("Value #<refId>"), renamed by the panel's first organize step, rows joined on ``key``, then
    its binary calculateField steps."""
    renames = next(t for t in panel["transformations"] if t["id"] == "organize")["options"]["renameByName"]
    rows: dict[tuple[str, ...], dict[str, Any]] = defaultdict(dict)
    for ref, result in run_panel(filled, scope, panel).items():
        for r in result:
            row = {renames.get(k, k): v for k, v in r.items() if k != "value"}
            row[renames[f"Value #{ref}"]] = r["value"]
            rows[tuple(row[k] for k in key)].update(row)
    operators = {"-": lambda a, b: a - b, "/": lambda a, b: a / b}
    for step in panel["transformations"]:
        if step["id"] == "calculateField":
            binary = step["options"]["binary"]
            for row in rows.values():
                left = row.get(binary["left"])
                right = row.get(binary["right"], float(binary["right"]) if binary["right"][0].isdigit() else None)
                if left is not None and right is not None:
                    row[step["options"]["alias"]] = operators[binary["operator"]](left, right)
    return dict(rows)


# -- expected figures -------------------------------------------------------------------------


def last_power(fx: Fixture, hosts: set[str]) -> float:
    last = {p["ch"]: p["power_w"] for p in fx.points}
    return sum(v for ch, v in last.items() if in_totals(ch) and ch.host in hosts)


def expected_power(
    fx: Fixture,
    key: str | tuple[str, ...],
    start_ms: int,
    end_ms: int,
    step_s: int,
    closed: bool = False,
    where: Callable[[Channel], bool] = in_totals,
) -> dict[tuple[Any, int], float]:
    """{(tag value(s), step ms): sum over the channels ``where`` selects of the mean of the
    channel's stored samples in (step - interval, step]}; ``closed``: in [step - interval, step]
    (Prometheus 2's range selectors: a sample on a step's edge is in two steps)."""
    step_ms = step_s * 1000
    per_channel: dict[tuple[Any, int], list[float]] = defaultdict(list)
    for p in fx.points:
        if where(p["ch"]) and p["stored"]:
            first = -(-p["time_ms"] // step_ms) * step_ms  # the first step whose window holds it
            steps = (first, first + step_ms) if closed and p["time_ms"] == first else (first,)
            for t in steps:
                if start_ms <= t <= end_ms:
                    per_channel[p["ch"], t].append(p["power_w"])
    out: dict[tuple[Any, int], float] = defaultdict(float)
    for (ch, t), values in per_channel.items():
        label = getattr(ch, key) if isinstance(key, str) else tuple(getattr(ch, k) for k in key)
        out[label, t] += sum(values) / len(values)
    return out


def power_series(filled: Filled, scope: Scope, panel: dict[str, Any], key: str | tuple[str, ...]) -> dict[Any, float]:
    """A time-series panel's points as {(label value(s), step ms): value}."""
    return {
        (s[key] if isinstance(key, str) else tuple(s[k] for k in key), t): v
        for s in run_panel(filled, scope, panel)["A"]
        for t, v in s["points"].items()
    }


def check_power(got: dict[Any, float], want: dict[Any, float], title: str) -> None:
    assert got.keys() == want.keys(), title
    assert all(close(got[k], want[k]) for k in want), title


def units_of(fx: Fixture, job_id: str, from_ms: int, to_ms: int) -> float:
    return sum(e.get("units", 0.0) for e in fx.events if e["job_id"] == job_id and from_ms < e["time_ms"] <= to_ms)


def event_ms(fx: Fixture, job_id: str, kind: str) -> list[int]:
    return [e["time_ms"] for e in fx.events if e["job_id"] == job_id and e["event"] == kind]


# -- the tests ----------------------------------------------------------------------------------


@pytest.mark.servers
def test_fleet_queries(filled: Filled) -> None:
    fx = filled.fx
    dashboard = load("fleet")
    scope = Scope(fx.start_ms, fx.end_ms)
    options = resolve_variables(filled, dashboard, scope, {})
    assert options["host"] == [HOST_A, HOST_B]
    assert options["component"] == sorted({c.component for c in CHANNELS} - SUBZONES)
    assert run_dashboard(filled, dashboard, scope) == []
    everything = {HOST_A, HOST_B}

    # Energy from each sample's joules, exact (rel 1e-9), by host, component and quality.
    for title, key in (
        ("Energy by host", "host"),
        ("Energy by component", "component"),
        ("Measured vs estimated energy", "quality"),
    ):
        got = {r[key]: r["value"] for r in run_panel(filled, scope, find_panel(dashboard, title))["A"]}
        want = expected_energy(fx, key, fx.start_ms, fx.end_ms, everything, left_open=True)
        assert got.keys() == want.keys(), title
        assert all(close(got[k], want[k] / 3600) for k in want), (title, got, want)
    (total,) = run_panel(filled, scope, find_panel(dashboard, "Energy over the range"))["A"]
    want_j = sum(expected_energy(fx, "host", fx.start_ms, fx.end_ms, everything, left_open=True).values())
    assert close(total["value"], want_j / 3600)
    assert close(total["value"] * 3600, sum(p["energy_j"] for p in fx.points if in_totals(p["ch"])))

    # HOST_B's agent restarted: each of its channels has two series; each is counted once.
    (now,) = run_panel(filled, scope, find_panel(dashboard, "Power now"))["A"]
    assert close(now["value"], last_power(fx, everything))
    start, end = aligned(scope, INTERVAL_S)
    for title, key in (
        ("Power by host", "host"),
        ("Power by component", "component"),
        ("Power by quality (measured vs estimated)", "quality"),
    ):
        got = power_series(filled, scope, find_panel(dashboard, title), key)
        check_power(got, expected_power(fx, key, start, end, INTERVAL_S, closed=filled.engine == "prometheus"), title)
        assert len(got) >= 2 * DURATION_S // INTERVAL_S, title
    (hosts,) = run_panel(filled, scope, find_panel(dashboard, "Hosts reporting"))["A"]
    assert hosts["value"] == 2
    (unhealthy,) = run_panel(filled, scope, find_panel(dashboard, "Unhealthy channel-intervals"))["A"]
    assert unhealthy["value"] == len(UNHEALTHY[1])

    (annotation,) = [a for a in dashboard["annotations"]["list"] if a["datasource"] == DATASOURCE]
    got = {
        (e["time"], e["end"], e["title"], e["text"], tuple(e["tags"]))
        for e in annotation_events(filled, scope, annotation)
    }
    want = {
        (e["time_ms"], e["time_ms"], e["job_id"], e["event"], (e["host"],))
        for e in fx.events
        if e["event"] in ("open", "close")
    }
    assert got == want


@pytest.mark.servers
def test_fleet_host_selection_narrows_the_totals(filled: Filled) -> None:
    fx = filled.fx
    dashboard = load("fleet")
    scope = Scope(fx.start_ms, fx.end_ms)
    resolve_variables(filled, dashboard, scope, {"host": [HOST_B], "component": ["accelerator", "nic"]})
    got = {
        r["component"]: r["value"] for r in run_panel(filled, scope, find_panel(dashboard, "Energy by component"))["A"]
    }
    want = expected_energy(fx, "component", fx.start_ms, fx.end_ms, {HOST_B}, left_open=True)
    assert got == pytest.approx({k: want[k] / 3600 for k in ("accelerator", "nic")}, rel=1e-9)


@pytest.mark.servers
def test_host_queries(filled: Filled) -> None:
    fx = filled.fx
    dashboard = load("host")
    scope = Scope(fx.start_ms, fx.end_ms)
    options = resolve_variables(filled, dashboard, scope, {"host": HOST_A})
    assert options["host"] == [HOST_A, HOST_B]
    assert options["component"] == sorted({c.component for c in CHANNELS if c.host == HOST_A})
    assert run_dashboard(filled, dashboard, scope) == []
    mine = [p for p in fx.points if p["ch"].host == HOST_A and p["time_ms"] > fx.start_ms]
    mine_channels = [c for c in CHANNELS if c.host == HOST_A]

    per_channel = table(
        filled, scope, find_panel(dashboard, "Energy by component and device"), ("component", "device", "source")
    )
    assert len(per_channel) == sum(1 for c in CHANNELS if c.host == HOST_A)
    for (component, device, source), row in per_channel.items():
        samples = [
            p for p in mine if (p["ch"].component, p["ch"].device, p["ch"].source) == (component, device, source)
        ]
        assert row["quality"] == samples[0]["ch"].quality
        assert close(row["Energy"], sum(p["energy_j"] for p in samples))
        assert close(row["Mean power"], sum(p["power_w"] for p in samples) / len(samples))
        assert row["Peak power"] == max(p["power_w"] for p in samples)

    failures = table(
        filled, scope, find_panel(dashboard, "Failures: count and last status"), ("source", "component", "device")
    )
    ((channel, row),) = failures.items()
    assert channel[2] == UNHEALTHY[0]
    # The end of the step that holds the last unhealthy sample (the range's end for its last, partial step).
    step_ms, failed_ms = INTERVAL_S * 1000, fx.at(UNHEALTHY[1][-1]) // 1_000_000
    assert failed_ms <= scope.to_ms - step_ms
    assert row["Last failure"] == -(-failed_ms // step_ms) * step_ms
    assert row["Failed intervals"] == len(UNHEALTHY[1])

    (health_panel,) = run_panel(filled, scope, find_panel(dashboard, "Source health")).values()
    assert {s["device"] for s in health_panel} == {c.device for c in CHANNELS if c.host == HOST_A}
    step_ms = INTERVAL_S * 1000
    failing = {(s["device"], t) for s in health_panel for t, v in s["points"].items() if v == 1}
    assert failing == {(UNHEALTHY[0], -(-(fx.at(t) // 1_000_000) // step_ms) * step_ms) for t in UNHEALTHY[1]}

    (model,) = run_panel(filled, scope, find_panel(dashboard, "Estimated (model) energy"))["A"]
    assert close(model["value"], sum(p["energy_j"] for p in mine if p["ch"].quality == "model") / 3600)
    memory = run_panel(filled, scope, find_panel(dashboard, "Device memory used"))["A"]
    assert {s["device"] for s in memory} == {c.device for c in mine_channels if "memory_used_bytes" in c.gauges}
    assert {v for s in memory for v in s["points"].values()} == {4.0e10}

    # Power: the last sample of each channel; by channel, the mean of each step's samples.
    (now,) = run_panel(filled, scope, find_panel(dashboard, "Host power now"))["A"]
    assert close(now["value"], last_power(fx, {HOST_A}))
    (unhealthy,) = run_panel(filled, scope, find_panel(dashboard, "Unhealthy intervals"))["A"]
    assert unhealthy["value"] == len(UNHEALTHY[1])
    start, end = aligned(scope, INTERVAL_S)
    key = ("component", "device", "source")
    want = expected_power(
        fx, key, start, end, INTERVAL_S, closed=filled.engine == "prometheus", where=lambda c: c.host == HOST_A
    )
    check_power(power_series(filled, scope, find_panel(dashboard, "Power by component and device"), key), want, "")
    # Utilization: each channel's constant one, in every step its power has (an unhealthy sample has none).
    utilization = power_series(filled, scope, find_panel(dashboard, "Utilization"), ("component", "device"))
    by_device = {(c.component, c.device): c.utilization for c in mine_channels if c.utilization is not None}
    assert utilization.keys() == {((c, d), t) for (c, d, _), t in want if (c, d) in by_device}
    assert all(close(v, by_device[channel]) for (channel, _), v in utilization.items())

    annotation = next(a for a in dashboard["annotations"]["list"] if a["datasource"] == DATASOURCE)
    got = {(e["time"], e["title"], e["text"]) for e in annotation_events(filled, scope, annotation)}
    assert got == {
        (e["time_ms"], e["job_id"], e["event"])
        for e in fx.events
        if e["host"] == HOST_A and e["event"] in ("open", "close")
    }


def check_job_row(fx: Fixture, row: dict[str, Any], job: JobPlan, truth: JobTruth) -> None:
    """A row of the job table against the fixture's construction: its events, units and energies."""
    opens, closes = event_ms(fx, job.job_id, "open"), event_ms(fx, job.job_id, "close")
    assert (row["name"], row["kind"], row["unit"], row["hosts"]) == (job.name, job.kind, job.unit_name, len(job.hosts))
    assert (row["start"], row["end"], row["exit_code"]) == (min(opens), max(closes), 0)
    assert row["units"] == units_of(fx, job.job_id, fx.start_ms, fx.end_ms)
    assert row["duration_s"] == max(c - o for o, _, c in job.hosts.values())
    assert close(row["throughput"], row["units"] / row["duration_s"])
    saturations = event_ms(fx, job.job_id, "phase")
    assert row.get("saturated") == ("saturated" if saturations else None)
    assert row.get("saturated_at") == (min(saturations) if saturations else None)
    assert close(row["energy_j"], truth.whole_j), job.job_id
    assert close(row["j_per_unit"], truth.j_per_unit), job.job_id
    assert close(row["kwh_per_million"], truth.kwh_per_million), job.job_id
    assert close(row["measured_fraction"], truth.measured_fraction), job.job_id


def job_table(filled: Filled, dashboard: dict[str, Any], scope: Scope) -> dict[str, dict[str, Any]]:
    rows = table(filled, scope, find_panel(dashboard, "Jobs in the time range"), ("job_id",))
    return {job_id: row for (job_id,), row in rows.items()}


def link_scope(dashboard: dict[str, Any], row: dict[str, Any], title: str) -> Scope:
    """The time range the job table's link ``title`` opens for ``row`` (its from/to fields)."""
    overrides = find_panel(dashboard, "Jobs in the time range")["fieldConfig"]["overrides"]
    links = [link for o in overrides for p in o["properties"] if p["id"] == "links" for link in p["value"]]
    (url,) = [link["url"] for link in links if link["title"] == title]
    edges = dict(re.findall(r"[?&](from|to)=\$\{__data\.fields\.(\w+)\.numeric\}", url))
    assert url.startswith("/d/wattline-prom-jobs/") and edges.keys() == {"from", "to"}, url
    return Scope(round(row[edges["from"]]), round(row[edges["to"]]))


@pytest.mark.servers
def test_jobs_queries(filled: Filled) -> None:
    fx = filled.fx
    dashboard = load("jobs")

    overview = Scope(fx.start_ms, fx.end_ms)
    options = resolve_variables(filled, dashboard, overview, {"job": LLAMA})
    assert options["job"] == sorted(job.job_id for job in JOBS)
    assert options["job_name"] == ["llama-bench"] and options["host"] == [HOST_A, HOST_B]
    assert {name: options[name] for name in FILTER_OPTIONS} == FILTER_OPTIONS
    assert run_dashboard(filled, dashboard, overview) == []
    table_rows = job_table(filled, dashboard, overview)
    assert sorted(table_rows) == sorted(job.job_id for job in JOBS)
    truths = job_truths(fx)
    for job in JOBS:
        check_job_row(fx, table_rows[job.job_id], job, truths[job.job_id])

    # The job window, as the table's link opens it.
    scope = link_scope(dashboard, table_rows[LLAMA], "Job window: open to close")
    resolve_variables(filled, dashboard, scope, {"job": LLAMA})
    assert scope.values["job"] == [LLAMA] and scope.values["host"] == [HOST_A, HOST_B]
    assert run_dashboard(filled, dashboard, scope) == []
    # The window holds the job's open and summary (at its start): its row, its energy claimed.
    assert scope.from_ms < truths[LLAMA].start_ms
    plan = next(j for j in JOBS if j.job_id == LLAMA)
    check_job_row(fx, job_table(filled, dashboard, scope)[LLAMA], plan, truths[LLAMA])
    (got,) = run_panel(filled, scope, find_panel(dashboard, "Energy: $job_name"))["A"]
    assert close(got["value"], truths[LLAMA].measured_j)
    (got,) = run_panel(filled, scope, find_panel(dashboard, "Energy per unit: $job_name"))["A"]
    assert close(got["value"], truths[LLAMA].j_per_unit)
    units = units_of(fx, LLAMA, scope.from_ms, scope.to_ms)
    assert units == units_of(fx, LLAMA, fx.start_ms, fx.end_ms)  # the window holds them all
    (got,) = run_panel(filled, scope, find_panel(dashboard, "Units: $job_name"))["A"]
    assert got["value"] == units
    (got,) = run_panel(filled, scope, find_panel(dashboard, "Throughput: $job_name"))["A"]
    assert close(got["value"], units / scope.range_s)
    (got,) = run_panel(filled, scope, find_panel(dashboard, "Mean power: $job_name"))["A"]
    energy = sum(expected_energy(fx, "host", scope.from_ms, scope.to_ms, {HOST_A, HOST_B}, left_open=True).values())
    assert close(got["value"], energy / scope.range_s)
    unclaimed = table(filled, scope, find_panel(dashboard, "Energy no job claims, by host"), ("host",))
    claimed = claimed_by_host(truths, scope.from_ms, scope.to_ms)
    assert {h: row["jobs_j"] for (h,), row in unclaimed.items()} == pytest.approx(claimed, rel=1e-9)

    # Warm-up band: 1 from each host's open to its saturation point, 0 after.
    power = run_panel(filled, scope, find_panel(dashboard, "Power of $job_name's hosts, warm-up shaded"))
    start, end = aligned(scope, INTERVAL_S)
    want = expected_power(fx, "host", start, end, INTERVAL_S, closed=filled.engine == "prometheus")
    check_power({(s["host"], t): v for s in power["A"] for t, v in s["points"].items()}, want, "power of the hosts")
    for band in power["B"]:
        open_s, sat_s, _ = plan.hosts[band["host"]]
        assert sat_s is not None
        assert {v for t, v in band["points"].items() if fx.at(open_s) // 10**6 <= t < fx.at(sat_s) // 10**6} == {1}
        assert {v for t, v in band["points"].items() if t >= fx.at(sat_s) // 10**6} == {0}
        assert min(band["points"]) >= fx.at(open_s) // 10**6

    # Units completed: at each step, the units of the range's length before it; the window
    # starts before the job, so that is the job's running total (Grafana ends a range query
    # at the last whole step: a units event after it waits for the next).
    (done,) = run_panel(filled, scope, find_panel(dashboard, "Units completed: $job_name"))["A"]
    start, end = aligned(scope, INTERVAL_S)
    assert min(done["points"]) == start and max(done["points"]) == end
    range_ms = scope.to_ms - scope.from_ms
    for t, v in done["points"].items():
        assert v == units_of(fx, LLAMA, t - range_ms, t), t
    assert done["points"][end] == units_of(fx, LLAMA, fx.start_ms, end) > 0


@pytest.mark.servers
def test_jobs_summary_panels_and_annotations(filled: Filled) -> None:
    fx = filled.fx
    dashboard = load("jobs")
    scope = Scope(fx.start_ms, fx.end_ms)
    resolve_variables(filled, dashboard, scope, {"job": LLAMA})
    truths = job_truths(fx)

    drift = run_panel(filled, scope, find_panel(dashboard, "J per unit over time, by job name"))["A"]
    step_ms = INTERVAL_S * 1000
    assert {(s["name"], t) for s in drift for t in s["points"]} == {
        (job.name, -(-truths[job.job_id].start_ms // step_ms) * step_ms) for job in JOBS
    }
    for s in drift:
        (job,) = [j for j in JOBS if j.name == s["name"]]
        assert all(close(v, truths[job.job_id].j_per_unit) for v in s["points"].values())

    # Each job's partial rewrite is an older sample of the job's one series (#45): Prometheus
    # keeps it, VictoriaMetrics deleted it; the panels show the final one only.
    rewrites = instant(filled, scope, "count by (job_id) (last_over_time(job_summary_energy_j[62d] offset -31d))")
    assert {r["job_id"]: r["value"] for r in rewrites} == dict.fromkeys(truths, 1)
    samples = instant(filled, scope, "count_over_time(job_summary_energy_j[62d] offset -31d)")
    kept = 2 if filled.engine == "prometheus" else 1
    assert {r["job_id"]: r["value"] for r in samples} == dict.fromkeys(truths, kept)
    by_job = run_panel(filled, scope, find_panel(dashboard, "Energy by job over the range"))["A"]
    assert {r["job_id"]: r["value"] for r in by_job} == pytest.approx(
        {job_id: truth.whole_j / 3600 for job_id, truth in truths.items()}, rel=1e-9
    )
    unclaimed = table(filled, scope, find_panel(dashboard, "Energy no job claims, by host"), ("host",))
    node = expected_energy(fx, "host", fx.start_ms, fx.end_ms, {HOST_A, HOST_B}, left_open=True)
    assert {h: row["node_j"] for (h,), row in unclaimed.items()} == pytest.approx(node, rel=1e-9)
    claimed = claimed_by_host(truths, fx.start_ms, fx.end_ms)
    assert claimed.keys() == {HOST_A, HOST_B}
    assert {h: row["jobs_j"] for (h,), row in unclaimed.items()} == pytest.approx(claimed, rel=1e-9)

    annotations = {a["name"]: a for a in dashboard["annotations"]["list"] if a["datasource"] == DATASOURCE}
    got = {
        (e["time"], e["title"], e["text"], tuple(e["tags"]))
        for e in annotation_events(filled, scope, annotations["Saturation point"])
    }
    assert got == {(e["time_ms"], e["job_id"], "saturated", (e["host"],)) for e in fx.events if e["event"] == "phase"}
    got = {
        (e["time"], e["title"], e["text"], tuple(e["tags"]))
        for e in annotation_events(filled, scope, annotations["Job open / close"])
    }
    assert got == {
        (e["time_ms"], e["job_id"], e["event"], (e["host"],)) for e in fx.events if e["event"] in ("open", "close")
    }
    regions = annotation_events(filled, scope, annotations["Warm-up (start to saturation)"])
    assert {e["title"]: (e["time"], e["end"]) for e in regions} == {
        job_id: (truth.start_ms, truth.saturated_ms) for job_id, truth in truths.items()
    }
    assert LLAMA in {e["title"] for e in regions}


@pytest.mark.servers
@pytest.mark.parametrize(("select", "jobs"), FILTER_CASES)
def test_jobs_filters(filled: Filled, select: dict[str, str | list[str]], jobs: list[str]) -> None:
    """User, account and partition select the jobs of the table, the summary panels and the annotations."""
    fx = filled.fx
    dashboard = load("jobs")
    scope = Scope(fx.start_ms, fx.end_ms)
    resolve_variables(filled, dashboard, scope, {"job": LLAMA, **select})
    assert sorted(job_table(filled, dashboard, scope)) == sorted(jobs)
    by_job = run_panel(filled, scope, find_panel(dashboard, "Energy by job over the range"))["A"]
    assert sorted(r["job_id"] for r in by_job) == sorted(jobs)
    drift = run_panel(filled, scope, find_panel(dashboard, "J per unit over time, by job name"))["A"]
    assert {s["name"] for s in drift} == {j.name for j in JOBS if j.job_id in jobs}
    for annotation in dashboard["annotations"]["list"]:
        if annotation["datasource"] == DATASOURCE:
            titles = {e["title"] for e in annotation_events(filled, scope, annotation)}
            assert titles <= set(jobs), annotation["name"]
    opened = annotation_events(filled, scope, dashboard["annotations"]["list"][1])
    assert {e["title"] for e in opened} == set(jobs)
    (units,) = run_panel(filled, scope, find_panel(dashboard, "Units: $job_name"))["A"]  # follows $job only
    assert units["value"] == units_of(fx, LLAMA, fx.start_ms, fx.end_ms)


# -- a hole in one agent stream, and time no agent measured (#43) ----------------------------


def fill_holed(store: Store, fx: Fixture) -> None:
    for batch in build_batches(fx, **HOLED):
        result = store.write(batch)
        assert result.rejected == 0, result.reasons


def write_summaries(store: Store) -> None:
    """Each job's summary, as a collector writes it after the close (the same report code)."""
    for job in JOBS:
        record_summary(store, store.write_summary, job.job_id)


@pytest.fixture(scope="module", params=ENGINES)
def holed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Filled]:
    """The fixture's data with :data:`HOLED`'s holes on an engine of its own, as :func:`filled`
    (recent data: the summaries are stamped when written). The jobs' summaries on VictoriaMetrics
    only: a report's edge reads on Prometheus take seconds each (``SeriesApi.edges``), which
    would cost this file over 10 s; the summaries across HOST_B's restart on Prometheus are
    :func:`filled`'s."""
    base_ns = (time.time_ns() // S // 3600 - 2) * 3600 * S
    fx = Fixture(start_ns=base_ns, end_ns=base_ns + DURATION_S * S)
    if request.param == "victoriametrics":
        with contextmanager(run_victoria)(tmp_path_factory, victoria_argv) as victoria_metrics:
            with VictoriaStore(victoria_metrics.url) as store:
                fill_holed(store, fx)
                streams = len(CHANNELS) + sum(1 for c in CHANNELS if c.host in HOLED["restarts"])
                for metric in ("energy_energy_j", "energy_cumulative_j", "energy_cumulative_start_j"):
                    victoria_metrics.export(metric, expect=streams)
                victoria_metrics.export('job_events_sub_ns{event="close"}', expect=sum(len(j.hosts) for j in JOBS))
                write_summaries(store)
            victoria_metrics.export("job_summary_energy_j", expect=len(JOBS))
            yield Filled(victoria_metrics.url, fx, engine=request.param)
        return
    daemon = start_prometheus(tmp_path_factory.mktemp("prometheus-holed"))
    try:
        with PrometheusStore(daemon.url) as store:
            fill_holed(store, fx)
        yield Filled(daemon.url, fx, engine=request.param)
    finally:
        daemon.stop()


@pytest.mark.servers
def test_energy_panels_read_a_hole_as_the_report_does(holed: Filled) -> None:
    """Every energy panel counts the samples the store lacks inside one agent stream by its
    running total (as `wattline report` does), where the stream has a sample on both sides in
    the range, and not the seconds no agent measured (HOST_B down before its new stream); so
    do the jobs' summaries (VictoriaMetrics).
    Prometheus 2's range selectors hold [from, to]: a sample that ends at ``from`` counts there."""
    fx = holed.fx
    left_open = holed.engine != "prometheus"
    lost = [p for p in fx.points if p["counted"] and not p["stored"]]
    assert len(lost) == len(HOLED["lost"][1]) and sum(p["energy_j"] for p in lost) > 3000
    assert len([p for p in fx.points if not p["counted"]]) == HOLED["down_s"] * 3  # HOST_B: 3 channels
    inside_hole = fx.at(HOLED["lost"][1][7]) // 1_000_000  # a range that starts inside the hole: not bridged
    everything = {HOST_A, HOST_B}
    fleet, host_dashboard, jobs = load("fleet"), load("host"), load("jobs")
    for from_ms in (fx.start_ms, inside_hole):
        scope = Scope(from_ms, fx.end_ms)
        resolve_variables(holed, fleet, scope, {})
        for title, key in (
            ("Energy by host", "host"),
            ("Energy by component", "component"),
            ("Measured vs estimated energy", "quality"),
        ):
            got = {r[key]: r["value"] for r in run_panel(holed, scope, find_panel(fleet, title))["A"]}
            want = expected_energy(fx, key, from_ms, fx.end_ms, everything, left_open=left_open)
            assert got.keys() == want.keys(), title
            assert all(close(got[k], want[k] / 3600) for k in want), (title, from_ms, got, want)
        (total,) = run_panel(holed, scope, find_panel(fleet, "Energy over the range"))["A"]
        want_j = sum(expected_energy(fx, "host", from_ms, fx.end_ms, everything, left_open=left_open).values())
        assert close(total["value"] * 3600, want_j)

        for host in (HOST_A, HOST_B):
            resolve_variables(holed, host_dashboard, scope, {"host": host})
            want = expected_energy(fx, "quality", from_ms, fx.end_ms, {host}, left_open=left_open)
            (got,) = run_panel(holed, scope, find_panel(host_dashboard, "Host energy over the range"))["A"]
            assert close(got["value"] * 3600, sum(want.values())), host
            (model,) = run_panel(holed, scope, find_panel(host_dashboard, "Estimated (model) energy"))["A"]
            assert close(model["value"] * 3600, want.get("model", 0.0)), host
            per_channel = table(
                holed,
                scope,
                find_panel(host_dashboard, "Energy by component and device"),
                ("component", "device", "source"),
            )
            powers = stored_power(fx, host, from_ms, fx.end_ms, left_open=left_open)
            assert per_channel.keys() == powers.keys()
            for channel, row in per_channel.items():
                points = [
                    p for p in fx.points
                    if p["ch"].host == host and (p["ch"].component, p["ch"].device, p["ch"].source) == channel
                    and counted(p, from_ms, fx.end_ms, left_open=left_open)
                ]  # fmt: skip
                assert close(row["Energy"], sum(p["energy_j"] for p in points)), (channel, row)
                assert close(row["Mean power"], powers[channel][0]) and row["Peak power"] == powers[channel][1]

    # A job's window (its table link opens it 1 ms before its first edge), and the node energy
    # no job claims over the whole range.
    scope = Scope(fx.at(60) // 1_000_000 - 1, fx.at(541) // 1_000_000)
    resolve_variables(holed, jobs, scope, {"job": LLAMA})
    want = expected_energy(fx, "component", scope.from_ms, scope.to_ms, everything, left_open=left_open)
    (got,) = run_panel(holed, scope, find_panel(jobs, "Mean power: $job_name"))["A"]
    assert close(got["value"], sum(want.values()) / scope.range_s)
    got = {
        r["component"]: r["value"]
        for r in run_panel(holed, scope, find_panel(jobs, "Energy by component: $job_name's hosts"))["A"]
    }
    assert got.keys() == want.keys() and all(close(got[k], want[k] / 3600) for k in want), (got, want)
    got = {
        r["quality"]: r["value"]
        for r in run_panel(holed, scope, find_panel(jobs, "Measured vs estimated: $job_name's hosts"))["A"]
    }
    want = expected_energy(fx, "quality", scope.from_ms, scope.to_ms, everything, left_open=left_open)
    assert got.keys() == want.keys() and all(close(got[k], want[k] / 3600) for k in want), (got, want)
    whole = Scope(fx.start_ms, fx.end_ms)
    resolve_variables(holed, jobs, whole, {"job": LLAMA})
    node = {
        r["host"]: r["node_j"]
        for r in table(holed, whole, find_panel(jobs, "Energy no job claims, by host"), ("host",)).values()
    }
    want = expected_energy(fx, "host", fx.start_ms, fx.end_ms, everything, left_open=left_open)
    assert node == pytest.approx(want, rel=1e-9)

    if holed.engine == "prometheus":
        return  # no summaries there (see holed)
    # Each job's summary across the lost stretch (bridged) and HOST_B's outage (counted for none).
    truths = job_truths(fx)
    table_rows = job_table(holed, jobs, whole)
    assert sorted(table_rows) == sorted(truths)
    for job in JOBS:
        check_job_row(fx, table_rows[job.job_id], job, truths[job.job_id])
    claimed = {
        r["host"]: r["jobs_j"]
        for r in table(holed, whole, find_panel(jobs, "Energy no job claims, by host"), ("host",)).values()
    }
    assert claimed == pytest.approx(claimed_by_host(truths, fx.start_ms, fx.end_ms), rel=1e-9)
