"""The Grafana dashboards (grafana/dashboards/*.json) and their provisioning files.

1. Every dashboard validates against a JSON Schema of Grafana's own ``Dashboard`` type,
   generated from the pinned ``@grafana/schema`` npm package by tests/grafana_schema (``npm
   ci`` + ts-json-schema-generator, cached under tests/_build/grafana_schema; a missing
   node/npm FAILS the test).
2. Every panel query, variable query and annotation query runs on a real ``influxd`` 1.x
   filled with realistic data (real ``wire.Batch`` objects written by ``InfluxV1Store``: two
   hosts, RAPL with subzones and psys, GPUs, a Neuron device, modelled CPU and NICs, 1 Hz for
   10 min, an unhealthy GPU interval, three jobs: tests/helpers/grafana_data.py), after substituting the template variables
   the way Grafana does (``$timeFilter``, ``$__interval``..., and multi-value variables as
   escaped regex alternations in ``=~ /^$var$/``). Each must return values; key panels must
   return the known figures of the fixture: its construction (known power x time, units and
   shares: tests/helpers/grafana_data.py's ``job_truths``), never wattline's own report. The Jobs dashboard is run the way its job table's
   data link opens it: time range = the job's window as read from the table's own queries;
   its user/account/partition filters select the right jobs.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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
    RESNET,
    SUBZONES,
    UNHEALTHY,
    Channel,
    Fixture,
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
    query_text,
    schema_errors,
    stored_power,
)
from servers import Influxd

from wattline.reports.summaries.summary import record_summary
from wattline.stores.influxdb.v1 import InfluxV1Store

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = ROOT / "grafana" / "dashboards"
PROVISIONING = ROOT / "grafana" / "provisioning"
DASHBOARDS = {path.stem: path for path in sorted(DASHBOARD_DIR.glob("*.json"))}
DATASOURCE_UID = "wattline-influxdb"
SUBZONE_FILTER = '"component" !~ /^(cpu_core|cpu_uncore|psys)$/'
#: Grafana template variables the dashboards define; a query must use them as /^$name$/ (regex
#: context: Grafana escapes the value and joins a multi-value selection as (a|b)).
DASHBOARD_VARIABLES = ("host", "component", "job")


def test_there_are_four_dashboards() -> None:
    assert sorted(DASHBOARDS) == ["fleet", "host", "jobs", "services"]


# -- 1. Grafana's Dashboard schema ---------------------------------------------------------


def load(name: str) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARDS[name].read_text())
    return dashboard


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_matches_grafana_schema(dashboard_schema: dict[str, Any], name: str) -> None:
    assert "@grafana/schema" in dashboard_schema.get("$comment", "")
    errors = schema_errors(dashboard_schema, load(name))
    assert not errors, f"{name}.json does not match Grafana's Dashboard schema:\n" + "\n".join(errors)


def test_schema_is_strict(dashboard_schema: dict[str, Any]) -> None:
    """The generated schema refuses misspelt keys and missing required ones (it is not a no-op)."""
    misspelt = load("fleet")
    misspelt["panels"][0]["titel"] = "Power"
    assert schema_errors(dashboard_schema, misspelt)
    no_version = load("fleet")
    del no_version["schemaVersion"]
    assert schema_errors(dashboard_schema, no_version)
    bad_grid = load("host")
    bad_grid["panels"][0]["gridPos"]["w"] = "wide"
    assert schema_errors(dashboard_schema, bad_grid)


# -- conventions the schema cannot express ---------------------------------------------------


def all_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, InfluxQL) of every panel target, annotation and query variable."""
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["query"]
    for annotation in dashboard["annotations"]["list"]:
        if annotation["datasource"].get("uid") == DATASOURCE_UID:
            yield f"annotation {annotation['name']!r}", annotation["target"]["query"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield f"variable ${variable['name']}", query_text(variable)


def convention_problems(dashboard: dict[str, Any]) -> list[str]:
    """What breaks the rules the schema cannot express (empty when all is well)."""
    problems = []
    ids = [panel["id"] for panel in all_panels(dashboard)]
    if len(ids) != len(set(ids)):
        problems.append("duplicate panel ids")
    for panel in all_panels(dashboard):
        if panel["datasource"] != {"type": "influxdb", "uid": DATASOURCE_UID}:
            problems.append(f"panel {panel['title']!r}: data source is not {DATASOURCE_UID}")
        if not panel.get("description"):
            problems.append(f"panel {panel['title']!r}: no description")
        for target in panel["targets"]:
            if target["datasource"].get("uid") != DATASOURCE_UID or target.get("rawQuery") is not True:
                problems.append(
                    f"panel {panel['title']!r} {target['refId']}: not a raw InfluxQL query on {DATASOURCE_UID}"
                )
    for variable in dashboard["templating"]["list"]:
        if variable.get("datasource", {}).get("uid") != DATASOURCE_UID:
            problems.append(f"variable ${variable['name']}: data source is not {DATASOURCE_UID}")
    for where, query in all_queries(dashboard):
        for var in DASHBOARD_VARIABLES:
            for match in re.finditer(rf"(.)\${var}\b(.)", query):
                if (match.group(1), match.group(2)) != ("^", "$"):
                    problems.append(f"{where}: ${var} must be used as /^${var}$/ (Grafana formats it as a regex)")
        # Totals must not count the RAPL subzones (inside cpu_package) nor psys (the whole platform).
        if 'FROM "energy"' in query and 'sum("' in query and "(SELECT" not in query:
            per_channel = re.search(r'GROUP BY "component", "device"', query)
            if not per_channel and SUBZONE_FILTER not in query:
                problems.append(f"{where}: a total without {SUBZONE_FILTER}")
    return problems


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_conventions(name: str) -> None:
    dashboard = load(name)
    assert dashboard["uid"] == f"wattline-{name}"
    assert convention_problems(dashboard) == []


def test_conventions_catch_mistakes() -> None:
    """The rules above are live: a quoted '$job', a total over all components, a missing description."""
    dashboard = load("jobs")
    panel = next(p for p in all_panels(dashboard) if p["title"] == "Units: $job_name")
    panel["targets"][0]["query"] = 'SELECT sum("units") FROM "job_events" WHERE "job_id" = \'$job\''
    panel = next(p for p in all_panels(dashboard) if p["title"] == "Energy: $job_name")
    panel["targets"][0]["query"] = 'SELECT sum("energy_j") FROM "energy" WHERE "host" =~ /^$host$/ AND $timeFilter'
    del panel["description"]
    problems = convention_problems(dashboard)
    assert any("$job must be used as" in p for p in problems), problems
    assert any("a total without" in p for p in problems), problems
    assert any("no description" in p for p in problems), problems


def test_provisioning_files_match_the_dashboards() -> None:
    datasource = (PROVISIONING / "datasources" / "wattline.yaml").read_text()
    assert re.search(rf"^\s+uid: {DATASOURCE_UID}$", datasource, re.M)
    assert re.search(r"^\s+type: influxdb$", datasource, re.M)
    assert "url: ${WATTLINE_INFLUX_URL}" in datasource
    assert "dbName: ${WATTLINE_INFLUX_DATABASE}" in datasource
    assert re.search(r"^\s+version: InfluxQL$", datasource, re.M)
    provider = (PROVISIONING / "dashboards" / "wattline.yaml").read_text()
    assert re.search(r"^\s+path: /var/lib/grafana/dashboards/wattline$", provider, re.M)
    assert re.search(r"^\s+type: file$", provider, re.M)
    assert "\t" not in datasource + provider


# -- 2. every query on a real influxd ---------------------------------------------------------


@dataclass
class Filled:
    """A database filled before it is made: nothing is written to it after, so a query's
    answer is kept (``answers``) and a panel run twice is asked once."""

    url: str
    database: str
    fx: Fixture
    answers: dict[str, bytes] = field(default_factory=dict, repr=False)


@pytest.fixture(scope="module")
def filled(influxd: Influxd) -> Filled:
    end_ns = time.time_ns() // (INTERVAL_S * S) * (INTERVAL_S * S)
    fx = Fixture(start_ns=end_ns - DURATION_S * S, end_ns=end_ns)
    store = InfluxV1Store(influxd.url, influxd.new_database())
    try:
        for batch in build_batches(fx):
            result = store.write(batch)
            assert result.rejected == 0, result.reasons
        for job in JOBS:  # the job summaries, as a collector writes them (the same report code)
            record_summary(store, store.write_summary, job.job_id)
    finally:
        store.close()
    return Filled(influxd.url, store.database, fx)


def influxql(filled: Filled, query: str) -> list[dict[str, Any]]:
    """Series of the query's (single) result, times in ms as Grafana asks for them."""
    body = urllib.parse.urlencode({"q": query, "db": filled.database, "epoch": "ms"}).encode()
    if query not in filled.answers:
        request = urllib.request.Request(filled.url + "/query", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=30) as resp:
            filled.answers[query] = resp.read()
    results = json.loads(filled.answers[query])["results"]
    assert len(results) == 1, query
    assert "error" not in results[0], f"InfluxDB refused {query!r}: {results[0]['error']}"
    series: list[dict[str, Any]] = results[0].get("series", [])
    return series


def rows(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**s.get("tags", {}), **dict(zip(s["columns"], v, strict=True))} for s in series for v in s["values"]]


def has_values(series: list[dict[str, Any]]) -> bool:
    return any(value is not None for s in series for row in s["values"] for value in row[1:])


# -- Grafana's variable substitution ----------------------------------------------------------


def regex_escape(value: str) -> str:
    """Grafana's kbn.regexEscape."""
    return re.sub(r"[\\^$*+?.()|\[\]{}/]", lambda m: "\\" + m.group(0), value)


def regex_format(values: list[str]) -> str:
    """Grafana's 'regex' variable format: one escaped value, or an (a|b) alternation."""
    escaped = [regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


@dataclass
class Scope:
    """A dashboard state: time range, interval and the selected variable values."""

    from_ms: int
    to_ms: int
    interval_s: int = INTERVAL_S
    values: dict[str, list[str]] = field(default_factory=dict)
    #: Variables at "All" that have a custom all value (inserted as is, not escaped).
    raw: dict[str, str] = field(default_factory=dict)

    @property
    def range_s(self) -> int:
        return round((self.to_ms - self.from_ms) / 1000)

    def interpolate(self, query: str) -> str:
        time_filter = f"time >= {self.from_ms}ms and time <= {self.to_ms}ms"
        builtins = {
            "timeFilter": time_filter,
            "__timeFilter": time_filter,
            "__interval": f"{self.interval_s}s",
            "interval": f"{self.interval_s}s",
            "__interval_ms": str(self.interval_s * 1000),
            "__range_s": str(self.range_s),
            "__range_ms": str(self.to_ms - self.from_ms),
            "__from": str(self.from_ms),
            "__to": str(self.to_ms),
        }

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2)
            if name in builtins:
                return builtins[name]
            if name in self.raw:
                return self.raw[name]
            assert name in self.values, f"${name} is not defined (yet) when running {query!r}"
            return regex_format(self.values[name])

        return re.sub(r"\$(?:\{(\w+)\}|(\w+))", substitute, query)


def resolve_variables(
    filled: Filled, dashboard: dict[str, Any], scope: Scope, select: dict[str, str | list[str]]
) -> dict[str, list[str]]:
    """Run the query variables in order (as Grafana does on load); returns each one's options,
    selected by ``choose``."""
    options: dict[str, list[str]] = {}
    for variable in dashboard["templating"]["list"]:
        name = variable["name"]
        series = influxql(filled, scope.interpolate(query_text(variable)))
        found: list[str] = []
        for s in series:
            for row in s["values"]:
                value = row[1] if len(row) > 1 else row[0]  # Grafana's ResponseParser: value[1], else value[0]
                if value is not None and str(value) not in found:
                    found.append(str(value))
        options[name] = found
        choose(variable, found, select, scope.values, scope.raw)
    return options


def run_panel(filled: Filled, scope: Scope, panel: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {t["refId"]: influxql(filled, scope.interpolate(t["query"])) for t in panel["targets"]}


def run_dashboard(
    filled: Filled, dashboard: dict[str, Any], scope: Scope, except_titles: tuple[str, ...] = ()
) -> list[str]:
    """Run every panel (but those titled in ``except_titles``) and annotation query; those that came back empty."""
    empty = []
    for panel in all_panels(dashboard):
        if panel["title"] in except_titles:
            continue
        for ref, series in run_panel(filled, scope, panel).items():
            if not has_values(series):
                empty.append(f"panel {panel['title']!r} {ref}")
    for annotation in dashboard["annotations"]["list"]:
        target = annotation.get("target", {})
        if annotation["datasource"].get("uid") != DATASOURCE_UID:
            continue
        series = influxql(filled, scope.interpolate(target["query"]))
        if not has_values(series):
            empty.append(f"annotation {annotation['name']!r}")
            continue
        columns = series[0]["columns"]
        for key in ("textColumn", "titleColumn"):
            assert target[key] in columns, f"annotation {annotation['name']!r}: no column {target[key]!r} in {columns}"
        for tag in target["tagsColumn"].split(","):
            assert tag.strip() in columns, f"annotation {annotation['name']!r}: no tags column {tag!r} in {columns}"
    return empty


# -- expected figures, computed from the fixture ---------------------------------------------


def expected_power_by(
    fx: Fixture,
    key: str | tuple[str, ...],
    where: Callable[[Channel], bool] = in_totals,
    within: tuple[int, int] | None = None,
    interval_s: int = INTERVAL_S,
) -> dict[tuple[Any, int], float]:
    """{(tag value(s), bucket start ms): sum over the channels ``where`` selects of the channel's
    mean power in the bucket}, of the samples ending in ``within`` ([from, to] ms; default all)."""
    lo, hi = within or (fx.start_ms, fx.end_ms)
    per_channel: dict[tuple[Channel, int], list[float]] = defaultdict(list)
    for p in fx.points:
        if where(p["ch"]) and lo <= p["time_ms"] <= hi:
            bucket = p["time_ms"] // (interval_s * 1000) * interval_s * 1000
            per_channel[p["ch"], bucket].append(p["power_w"])
    out: dict[tuple[Any, int], float] = defaultdict(float)
    for (ch, bucket), values in per_channel.items():
        label = getattr(ch, key) if isinstance(key, str) else tuple(getattr(ch, k) for k in key)
        out[label, bucket] += sum(values) / len(values)
    return out


def power_rows(
    filled: Filled, scope: Scope, panel: dict[str, Any], key: str | tuple[str, ...], column: str = "power_w"
) -> dict[tuple[Any, int], float]:
    """A time-series panel's rows as {(tag value(s), bucket start ms): value}."""
    return {
        (r[key] if isinstance(key, str) else tuple(r[k] for k in key), r["time"]): r[column]
        for r in rows(run_panel(filled, scope, panel)["A"])
    }


def check_power(got: dict[Any, float], want: dict[Any, float], title: str) -> None:
    assert got.keys() == want.keys(), title
    assert all(close(got[k], want[k]) for k in want), title


# -- the tests --------------------------------------------------------------------------------


@pytest.mark.servers
def test_fleet_queries_on_influxd(filled: Filled) -> None:
    fx = filled.fx
    dashboard = load("fleet")
    scope = Scope(fx.start_ms, fx.end_ms)
    options = resolve_variables(filled, dashboard, scope, {})
    assert sorted(options["host"]) == [HOST_A, HOST_B]
    assert sorted(options["component"]) == sorted({c.component for c in CHANNELS} - SUBZONES)
    assert run_dashboard(filled, dashboard, scope) == []

    got = rows(run_panel(filled, scope, find_panel(dashboard, "Power by host"))["A"])
    expected = expected_power_by(fx, "host")
    assert len(got) == len(expected) >= 2 * DURATION_S // INTERVAL_S
    for row in got:
        assert close(row["power_w"], expected[row["host"], row["time"]]), row

    got = rows(run_panel(filled, scope, find_panel(dashboard, "Power by component"))["A"])
    expected = expected_power_by(fx, "component")
    assert {r["component"] for r in got} == {k for k, _ in expected}
    assert all(close(r["power_w"], expected[r["component"], r["time"]]) for r in got)
    title = "Power by quality (measured vs estimated)"
    check_power(
        power_rows(filled, scope, find_panel(dashboard, title), "quality"), expected_power_by(fx, "quality"), title
    )

    last = {p["ch"]: p["power_w"] for p in fx.points}
    (now,) = rows(run_panel(filled, scope, find_panel(dashboard, "Power now"))["A"])
    assert close(now["power_w"], sum(v for ch, v in last.items() if in_totals(ch)))

    everything = {HOST_A, HOST_B}
    for title, key in (
        ("Energy by host", "host"),
        ("Energy by component", "component"),
        ("Measured vs estimated energy", "quality"),
    ):
        got = {r[key]: r["energy_wh"] for r in rows(run_panel(filled, scope, find_panel(dashboard, title))["A"])}
        want = expected_energy(fx, key, fx.start_ms, fx.end_ms, everything)
        assert got.keys() == want.keys(), title
        assert all(close(got[k], want[k] / 3600) for k in want), (title, got, want)
    assert {"counter", "integrated", "model"} <= set(got)

    (total,) = rows(run_panel(filled, scope, find_panel(dashboard, "Energy over the range"))["A"])
    assert close(
        total["energy_wh"], sum(expected_energy(fx, "host", fx.start_ms, fx.end_ms, everything).values()) / 3600
    )
    (hosts,) = rows(run_panel(filled, scope, find_panel(dashboard, "Hosts reporting"))["A"])
    assert hosts["hosts"] == 2
    (unhealthy,) = rows(run_panel(filled, scope, find_panel(dashboard, "Unhealthy channel-intervals"))["A"])
    assert unhealthy["unhealthy"] == len(UNHEALTHY[1])


@pytest.mark.servers
def test_fleet_host_selection_narrows_the_totals(filled: Filled) -> None:
    """A single host and component selected: the regex forms match exactly those (escaped) values."""
    fx = filled.fx
    dashboard = load("fleet")
    scope = Scope(fx.start_ms, fx.end_ms, values={"host": [HOST_B], "component": ["accelerator", "nic"]})
    got = rows(run_panel(filled, scope, find_panel(dashboard, "Energy by component"))["A"])
    want = expected_energy(fx, "component", fx.start_ms, fx.end_ms, {HOST_B})
    assert {r["component"]: r["energy_wh"] for r in got} == pytest.approx(
        {k: want[k] / 3600 for k in ("accelerator", "nic")}
    )


@pytest.mark.servers
def test_host_queries_on_influxd(filled: Filled) -> None:
    fx = filled.fx
    dashboard = load("host")
    scope = Scope(fx.start_ms, fx.end_ms)
    options = resolve_variables(filled, dashboard, scope, {"host": HOST_A})
    assert sorted(options["host"]) == [HOST_A, HOST_B]
    assert sorted(options["component"]) == sorted({c.component for c in CHANNELS if c.host == HOST_A})
    assert run_dashboard(filled, dashboard, scope) == []

    failures = run_panel(filled, scope, find_panel(dashboard, "Failures: count and last status"))
    (last_status,) = rows(failures["A"])
    (count,) = rows(failures["B"])
    assert last_status["device"] == count["device"] == UNHEALTHY[0]
    assert last_status["last_status"] == UNHEALTHY[2]
    assert last_status["time"] == fx.at(UNHEALTHY[1][-1]) // 1_000_000
    assert count["unhealthy_intervals"] == len(UNHEALTHY[1])

    health = rows(run_panel(filled, scope, find_panel(dashboard, "Source health"))["A"])
    assert {r["device"] for r in health} == {c.device for c in CHANNELS if c.host == HOST_A}
    failing = {(r["device"], r["time"]) for r in health if r["failed"] == 1}
    bucket_ms = INTERVAL_S * 1000
    assert failing == {(UNHEALTHY[0], fx.at(t) // 1_000_000 // bucket_ms * bucket_ms) for t in UNHEALTHY[1]}
    assert {r["failed"] for r in health} == {0, 1}

    table_rows = rows(run_panel(filled, scope, find_panel(dashboard, "Energy by component and device"))["A"])
    assert len(table_rows) == sum(1 for c in CHANNELS if c.host == HOST_A)
    per_channel: dict[tuple[str, str, str], float] = defaultdict(float)
    for p in fx.points:
        if p["ch"].host == HOST_A:
            per_channel[p["ch"].component, p["ch"].device, p["ch"].source] += p["energy_j"]
    for r in table_rows:
        assert close(r["energy_j"], per_channel[r["component"], r["device"], r["source"]]), r

    (model,) = rows(run_panel(filled, scope, find_panel(dashboard, "Estimated (model) energy"))["A"])
    want = sum(p["energy_j"] for p in fx.points if p["ch"].host == HOST_A and p["ch"].quality == "model")
    assert close(model["energy_wh"], want / 3600)

    # Power: the last sample of each channel; by channel, the mean of each bucket's samples.
    mine = [c for c in CHANNELS if c.host == HOST_A]
    last = {p["ch"]: p["power_w"] for p in fx.points if p["ch"].host == HOST_A}
    (now,) = rows(run_panel(filled, scope, find_panel(dashboard, "Host power now"))["A"])
    assert close(now["power_w"], sum(v for ch, v in last.items() if in_totals(ch)))
    (unhealthy,) = rows(run_panel(filled, scope, find_panel(dashboard, "Unhealthy intervals"))["A"])
    assert unhealthy["unhealthy"] == len(UNHEALTHY[1])
    key = ("component", "device", "source")
    want_power = expected_power_by(fx, key, where=lambda c: c.host == HOST_A)
    check_power(power_rows(filled, scope, find_panel(dashboard, "Power by component and device"), key), want_power, "")
    # Utilization and memory: each channel's constant figure, in every bucket its power has.
    for title, column, figure in (
        ("Utilization", "utilization", {(c.component, c.device): c.utilization for c in mine if c.utilization}),
        (
            "Device memory used",
            "memory_used_bytes",
            {(c.component, c.device): 4.0e10 for c in mine if "memory_used_bytes" in c.gauges},
        ),
    ):
        got = power_rows(filled, scope, find_panel(dashboard, title), ("component", "device"), column)
        assert got.keys() == {((c, d), t) for (c, d, _), t in want_power if (c, d) in figure}, title
        assert all(close(v, figure[channel]) for (channel, _), v in got.items()), title

    annotation = next(a for a in dashboard["annotations"]["list"] if a["datasource"].get("uid") == DATASOURCE_UID)
    got_events = {
        (r["time"], r["job_id"], r["event"])
        for r in rows(influxql(filled, scope.interpolate(annotation["target"]["query"])))
    }
    assert got_events == {
        (e["time_ms"], e["job_id"], e["event"])
        for e in fx.events
        if e["host"] == HOST_A and e["event"] in ("open", "close")
    }


def job_table(filled: Filled, dashboard: dict[str, Any], scope: Scope) -> dict[str, dict[str, Any]]:
    """The job table as Grafana's transformations build it: each query's rows joined by job_id,
    Time renamed per query (A: start, C: end, D: saturated_at), throughput = units / duration_s.
    """
    renames = {"A": "start", "C": "end", "D": "saturated_at"}
    table: dict[str, dict[str, Any]] = defaultdict(dict)
    for ref, series in run_panel(filled, scope, find_panel(dashboard, "Jobs in the time range")).items():
        for row in rows(series):
            row = dict(row)
            when = row.pop("time")
            if ref in renames:
                row[renames[ref]] = when
            table[row["job_id"]].update(row)
    for row in table.values():
        if row.get("units") is not None and row.get("duration_s"):
            row["throughput"] = row["units"] / row["duration_s"]
    return table


@pytest.mark.servers
def test_jobs_queries_on_influxd(filled: Filled) -> None:
    fx = filled.fx
    dashboard = load("jobs")

    # The job table over the whole range.
    overview = Scope(fx.start_ms, fx.end_ms)
    options = resolve_variables(filled, dashboard, overview, {"job": LLAMA})
    assert sorted(options["job"]) == sorted(job.job_id for job in JOBS)
    assert options["job_name"] == ["llama-bench"]
    assert sorted(options["host"]) == [HOST_A, HOST_B]
    table = job_table(filled, dashboard, overview)
    assert sorted(table) == sorted(job.job_id for job in JOBS)
    for job in JOBS:
        row = table[job.job_id]
        opens = [o for o, _, _ in job.hosts.values()]
        closes = [c for _, _, c in job.hosts.values()]
        sats = [s for _, s, _ in job.hosts.values() if s is not None]
        units = sum(e.get("units", 0.0) for e in fx.events if e["job_id"] == job.job_id)
        duration = max(c - o for o, _, c in job.hosts.values())
        assert row["name"] == job.name and row["kind"] == job.kind and row["unit"] == job.unit_name
        assert row["hosts"] == len(job.hosts)
        assert row["start"] == fx.at(min(opens)) // 1_000_000
        assert row["end"] == fx.at(max(closes)) // 1_000_000
        assert row["exit_code"] == 0
        assert row["units"] == units
        assert row["duration_s"] == duration
        assert close(row["throughput"], units / duration)
        if sats:
            assert row["saturated"] == "saturated"
            assert row["saturated_at"] == fx.at(min(sats)) // 1_000_000
        else:
            assert "saturated" not in row and "saturated_at" not in row

    # The table's link: the job window (from = start, to = end) and var-job.
    llama = table[LLAMA]
    scope = Scope(llama["start"], llama["end"])
    resolve_variables(filled, dashboard, scope, {"job": LLAMA})
    assert scope.values["job"] == [LLAMA] and sorted(scope.values["host"]) == [HOST_A, HOST_B]
    assert run_dashboard(filled, dashboard, scope) == []

    hosts = {HOST_A, HOST_B}
    energy = sum(expected_energy(fx, "host", scope.from_ms, scope.to_ms, hosts).values())
    units = sum(
        e.get("units", 0.0) for e in fx.events if e["job_id"] == LLAMA and scope.from_ms <= e["time_ms"] <= scope.to_ms
    )
    # The job's own energy and J per unit: its summary (in the window: stamped at its start).
    truth = job_truths(fx)[LLAMA]
    (got,) = rows(run_panel(filled, scope, find_panel(dashboard, "Energy: $job_name"))["A"])
    assert close(got["energy_j"], truth.measured_j)
    (got,) = rows(run_panel(filled, scope, find_panel(dashboard, "Units: $job_name"))["A"])
    assert got["units"] == units
    (got,) = rows(run_panel(filled, scope, find_panel(dashboard, "Energy per unit: $job_name"))["A"])
    assert close(got["j_per_unit"], truth.j_per_unit)
    (got,) = rows(run_panel(filled, scope, find_panel(dashboard, "Throughput: $job_name"))["A"])
    assert close(got["units_per_s"], units / scope.range_s)
    (got,) = rows(run_panel(filled, scope, find_panel(dashboard, "Mean power: $job_name"))["A"])
    assert close(got["power_w"], energy / scope.range_s)

    # Warm-up band: 1 from each host's open to its saturation point, 0 after.
    power = run_panel(filled, scope, find_panel(dashboard, "Power of $job_name's hosts, warm-up shaded"))
    want_power = expected_power_by(fx, "host", within=(scope.from_ms, scope.to_ms))
    check_power({(r["host"], r["time"]): r["power_w"] for r in rows(power["A"])}, want_power, "power of the hosts")
    band = rows(power["B"])
    bucket_ms = INTERVAL_S * 1000
    for host, (open_s, sat_s, _) in next(j for j in JOBS if j.job_id == LLAMA).hosts.items():
        assert sat_s is not None
        values = {r["time"]: r["warmup"] for r in band if r["host"] == host}
        open_bucket = fx.at(open_s) // 1_000_000 // bucket_ms * bucket_ms
        sat_bucket = fx.at(sat_s) // 1_000_000 // bucket_ms * bucket_ms
        assert {v for t, v in values.items() if open_bucket <= t < sat_bucket} == {1}, host
        assert {v for t, v in values.items() if t >= sat_bucket} == {0}, host

    # Units completed: the running total of the job's units events, by bucket, from the range's start.
    done = {
        r["time"]: r["units"]
        for r in rows(run_panel(filled, scope, find_panel(dashboard, "Units completed: $job_name"))["A"])
    }
    assert min(done) == scope.from_ms // bucket_ms * bucket_ms and max(done) == scope.to_ms // bucket_ms * bucket_ms
    for t, v in done.items():
        assert v == sum(
            e.get("units", 0.0)
            for e in fx.events
            if e["job_id"] == LLAMA and scope.from_ms <= e["time_ms"] <= min(t + bucket_ms - 1, scope.to_ms)
        ), t
    assert done[max(done)] == units

    # The measured window (second link): from the saturation point. The job table lists the
    # jobs opened in the range, so there it has no row for this job; everything else has data.
    measured = Scope(llama["saturated_at"], llama["end"])
    resolve_variables(filled, dashboard, measured, {"job": LLAMA})
    assert run_dashboard(filled, dashboard, measured, except_titles=("Jobs in the time range",)) == []
    (got,) = rows(run_panel(filled, measured, find_panel(dashboard, "Units: $job_name"))["A"])
    assert got["units"] == sum(
        e.get("units", 0.0)
        for e in fx.events
        if e["job_id"] == LLAMA and measured.from_ms <= e["time_ms"] <= measured.to_ms
    )


@pytest.mark.servers
def test_jobs_variables_follow_the_job(filled: Filled) -> None:
    fx = filled.fx
    scope = Scope(fx.start_ms, fx.end_ms)
    options = resolve_variables(filled, load("jobs"), scope, {"job": RESNET})
    assert options["job_name"] == ["resnet-train"]
    assert options["host"] == [HOST_B]
    assert sorted(options["component"]) == sorted({c.component for c in CHANNELS if c.host == HOST_B})


@pytest.mark.servers
@pytest.mark.parametrize(("select", "jobs"), FILTER_CASES)
def test_jobs_filters_on_influxd(filled: Filled, select: dict[str, str | list[str]], jobs: list[str]) -> None:
    """User, account and partition select the jobs of the table, the summary panels and the annotations."""
    fx = filled.fx
    dashboard = load("jobs")
    scope = Scope(fx.start_ms, fx.end_ms)
    options = resolve_variables(filled, dashboard, scope, {"job": LLAMA, **select})
    assert {name: sorted(options[name]) for name in FILTER_OPTIONS} == FILTER_OPTIONS
    assert sorted(job_table(filled, dashboard, scope)) == sorted(jobs)
    by_job = rows(run_panel(filled, scope, find_panel(dashboard, "Energy by job over the range"))["A"])
    assert sorted(r["job_id"] for r in by_job) == sorted(jobs)
    drift = rows(run_panel(filled, scope, find_panel(dashboard, "J per unit over time, by job name"))["A"])
    assert {r["name"] for r in drift} == {j.name for j in JOBS if j.job_id in jobs}
    for annotation in dashboard["annotations"]["list"][1:]:
        got = rows(influxql(filled, scope.interpolate(annotation["target"]["query"])))
        assert {r["job_id"] for r in got} <= set(jobs), annotation["name"]
    opened = rows(influxql(filled, scope.interpolate(dashboard["annotations"]["list"][1]["target"]["query"])))
    assert {r["job_id"] for r in opened} == set(jobs)
    # The per-job panels follow $job, whatever the filters.
    (units,) = rows(run_panel(filled, scope, find_panel(dashboard, "Units: $job_name"))["A"])
    assert units["units"] == sum(e.get("units", 0.0) for e in fx.events if e["job_id"] == LLAMA)


@pytest.mark.servers
def test_jobs_summary_panels_on_influxd(filled: Filled) -> None:
    """The panels and the annotation that read job_summary give each job's figures as the fixture builds them."""
    fx = filled.fx
    dashboard = load("jobs")
    scope = Scope(fx.start_ms, fx.end_ms)
    resolve_variables(filled, dashboard, scope, {"job": LLAMA})
    truths = job_truths(fx)

    table = job_table(filled, dashboard, scope)
    assert sorted(table) == sorted(truths)
    for job_id, truth in truths.items():
        row = table[job_id]
        assert close(row["energy_j"], truth.whole_j), (job_id, row)
        assert close(row["j_per_unit"], truth.j_per_unit), (job_id, row)
        assert close(row["kwh_per_million"], truth.kwh_per_million), (job_id, row)
        assert close(row["measured_fraction"], truth.measured_fraction), (job_id, row)
    # Shared host energy split, never counted twice: RESNET ran beside LLAMA on HOST_B.
    assert 0 < table[RESNET]["energy_j"] < sum(expected_energy(fx, "host", fx.start_ms, fx.end_ms, {HOST_B}).values())

    drift = rows(run_panel(filled, scope, find_panel(dashboard, "J per unit over time, by job name"))["A"])
    assert {(r["name"], r["time"]) for r in drift} == {(job.name, truths[job.job_id].start_ms) for job in JOBS}
    for r in drift:
        (job,) = [j for j in JOBS if j.name == r["name"]]
        assert close(r["j_per_unit"], truths[job.job_id].j_per_unit)

    by_job = rows(run_panel(filled, scope, find_panel(dashboard, "Energy by job over the range"))["A"])
    assert {r["job_id"]: r["energy_wh"] for r in by_job} == pytest.approx(
        {job_id: truth.whole_j / 3600 for job_id, truth in truths.items()}, rel=1e-9
    )

    # Node energy minus the jobs' energy, per host (the range covers every job whole).
    unclaimed = run_panel(filled, scope, find_panel(dashboard, "Energy no job claims, by host"))
    node = {r["host"]: r["node_j"] for r in rows(unclaimed["A"])}
    jobs = {r["host"]: r["jobs_j"] for r in rows(unclaimed["B"])}
    assert node == pytest.approx(expected_energy(fx, "host", fx.start_ms, fx.end_ms, {HOST_A, HOST_B}), rel=1e-9)
    claimed = claimed_by_host(truths, fx.start_ms - 1, fx.end_ms)
    assert claimed.keys() == {HOST_A, HOST_B}
    assert jobs == pytest.approx(claimed, rel=1e-9)
    for host in (HOST_A, HOST_B):
        assert 0 < node[host] - jobs[host] < node[host], host  # idle before/after the jobs is nobody's

    (annotation,) = [a for a in dashboard["annotations"]["list"] if a["name"] == "Job open / close"]
    got_events = {
        (r["time"], r["job_id"], r["host"], r["event"])
        for r in rows(influxql(filled, scope.interpolate(annotation["target"]["query"])))
    }
    assert got_events == {
        (e["time_ms"], e["job_id"], e["host"], e["event"]) for e in fx.events if e["event"] in ("open", "close")
    }

    # Warm-up shaded: one region per saturated job, from its start to its saturation point.
    (annotation,) = [a for a in dashboard["annotations"]["list"] if a["name"] == "Warm-up (start to saturation)"]
    got = rows(influxql(filled, scope.interpolate(annotation["target"]["query"])))
    want = {job_id: (truth.start_ms, truth.saturated_ms) for job_id, truth in truths.items()}
    assert want[LLAMA][0] < want[LLAMA][1]  # LLAMA warms up
    assert {r["job_id"]: (r["time"], r[annotation["target"]["timeEndColumn"]]) for r in got} == want


def test_fleet_links_to_jobs() -> None:
    links = [link for link in load("fleet")["links"] if link["type"] == "link"]
    assert any(link["url"].startswith("/d/wattline-jobs/") and link["keepTime"] for link in links), links


# -- a hole in one agent stream, and time no agent measured (#43) ----------------------------


@pytest.fixture(scope="module")
def holed(influxd: Influxd) -> Filled:
    """The fixture's data with :data:`HOLED`'s holes, in a database of its own."""
    end_ns = time.time_ns() // (INTERVAL_S * S) * (INTERVAL_S * S)
    fx = Fixture(start_ns=end_ns - DURATION_S * S, end_ns=end_ns)
    store = InfluxV1Store(influxd.url, influxd.new_database())
    try:
        for batch in build_batches(fx, **HOLED):
            result = store.write(batch)
            assert result.rejected == 0, result.reasons
        for job in JOBS:
            record_summary(store, store.write_summary, job.job_id)
    finally:
        store.close()
    return Filled(influxd.url, store.database, fx)


@pytest.mark.servers
def test_energy_panels_read_a_hole_as_the_report_does_on_influxd(holed: Filled) -> None:
    """Every energy panel counts the samples the store lacks inside one agent stream by its
    running total (as `wattline report` does), where the stream has a sample on both sides in
    the range, and not the seconds no agent measured (HOST_B down before its new stream); so
    do the jobs' summaries."""
    fx = holed.fx
    lost = [p for p in fx.points if p["counted"] and not p["stored"]]
    unmeasured = [p for p in fx.points if not p["counted"]]
    assert len(lost) == len(HOLED["lost"][1]) and len(unmeasured) == HOLED["down_s"] * 3  # HOST_B: 3 channels
    assert sum(p["energy_j"] for p in lost) > 3000  # a GPU's 15 s: what summing the stored samples misses
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
            got = {r[key]: r["energy_wh"] for r in rows(run_panel(holed, scope, find_panel(fleet, title))["A"])}
            want = expected_energy(fx, key, from_ms, fx.end_ms, everything)
            assert got.keys() == want.keys(), title
            assert all(close(got[k], want[k] / 3600) for k in want), (title, from_ms, got, want)
        (total,) = rows(run_panel(holed, scope, find_panel(fleet, "Energy over the range"))["A"])
        assert close(
            total["energy_wh"] * 3600, sum(expected_energy(fx, "host", from_ms, fx.end_ms, everything).values())
        )

        for host in (HOST_A, HOST_B):
            resolve_variables(holed, host_dashboard, scope, {"host": host})
            want = expected_energy(fx, "component", from_ms, fx.end_ms, {host})
            (got,) = rows(run_panel(holed, scope, find_panel(host_dashboard, "Host energy over the range"))["A"])
            assert close(got["energy_wh"] * 3600, sum(want.values())), host
            (model,) = rows(run_panel(holed, scope, find_panel(host_dashboard, "Estimated (model) energy"))["A"])
            want_model = expected_energy(fx, "quality", from_ms, fx.end_ms, {host}).get("model", 0.0)
            assert close(model["energy_wh"] * 3600, want_model), host
            table_rows = rows(
                run_panel(holed, scope, find_panel(host_dashboard, "Energy by component and device"))["A"]
            )
            powers = stored_power(fx, host, from_ms, fx.end_ms)
            assert {(r["component"], r["device"], r["source"]) for r in table_rows} == powers.keys()
            for r in table_rows:
                channel = (r["component"], r["device"], r["source"])
                points = [
                    p for p in fx.points
                    if p["ch"].host == host and (p["ch"].component, p["ch"].device, p["ch"].source) == channel
                    and counted(p, from_ms, fx.end_ms)
                ]  # fmt: skip
                assert close(r["energy_j"], sum(p["energy_j"] for p in points)), r
                assert close(r["mean_power_w"], powers[channel][0]) and r["max_power_w"] == powers[channel][1], r

    # A job's window (its table link), and the node energy no job claims over the whole range.
    scope = Scope(fx.at(60) // 1_000_000, fx.at(541) // 1_000_000)
    resolve_variables(holed, jobs, scope, {"job": LLAMA})
    want = expected_energy(fx, "component", scope.from_ms, scope.to_ms, everything)
    (got,) = rows(run_panel(holed, scope, find_panel(jobs, "Mean power: $job_name"))["A"])
    assert close(got["power_w"], sum(want.values()) / scope.range_s)
    got = {
        r["component"]: r["energy_wh"]
        for r in rows(run_panel(holed, scope, find_panel(jobs, "Energy by component: $job_name's hosts"))["A"])
    }
    assert got.keys() == want.keys() and all(close(got[k], want[k] / 3600) for k in want), (got, want)
    got = {
        r["quality"]: r["energy_wh"]
        for r in rows(run_panel(holed, scope, find_panel(jobs, "Measured vs estimated: $job_name's hosts"))["A"])
    }
    want = expected_energy(fx, "quality", scope.from_ms, scope.to_ms, everything)
    assert got.keys() == want.keys() and all(close(got[k], want[k] / 3600) for k in want), (got, want)
    whole = Scope(fx.start_ms, fx.end_ms)
    resolve_variables(holed, jobs, whole, {"job": LLAMA})
    node = {
        r["host"]: r["node_j"]
        for r in rows(run_panel(holed, whole, find_panel(jobs, "Energy no job claims, by host"))["A"])
    }
    assert node == pytest.approx(expected_energy(fx, "host", fx.start_ms, fx.end_ms, everything), rel=1e-9)

    # Each job's summary across the lost stretch (bridged) and HOST_B's outage (counted for none).
    truths = job_truths(fx)
    table = job_table(holed, jobs, whole)
    assert sorted(table) == sorted(truths)
    for job_id, truth in truths.items():
        row = table[job_id]
        assert close(row["energy_j"], truth.whole_j), (job_id, row)
        assert close(row["j_per_unit"], truth.j_per_unit), (job_id, row)
        assert close(row["measured_fraction"], truth.measured_fraction), (job_id, row)
    claimed = {
        r["host"]: r["jobs_j"]
        for r in rows(run_panel(holed, whole, find_panel(jobs, "Energy no job claims, by host"))["B"])
    }
    assert claimed == pytest.approx(claimed_by_host(truths, fx.start_ms - 1, fx.end_ms), rel=1e-9)
