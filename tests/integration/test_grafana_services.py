"""The Services dashboard, both flavours (grafana/dashboards/services.json, InfluxQL, and its
PromQL twin from grafana/generate.py), on the real engines: influxd, VictoriaMetrics and
Prometheus, each filled by the collector's interval writer with two service jobs of known power
and request rate (tests/helpers/service_intervals_data.py). Each panel, with one service selected and
the step the intervals' length, must give each interval's power, J per request, requests per
second and load as the test set them, at the interval's end, and nothing of the other service;
with All selected, both services.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from servers import Daemon, Influxd, VictoriaMetrics, http, searchable
from service_intervals_data import BOUNDS, CLOSE_S, EVERY_S, RECENT, S, Truth, truths, write_service

from wattline.reports.model import ReportSettings
from wattline.reports.summaries.intervals import IntervalWriter
from wattline.stores.base import Store
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.prometheus.store import PrometheusStore
from wattline.stores.victoria.store import VictoriaStore

ROOT = Path(__file__).resolve().parents[2]
#: A day of its own in the session's engines (VictoriaMetrics' label API answers by day).
BASE = RECENT + 100_000 * S  # a day on from test_service_intervals' jobs on the same server
JOBS = ("svc-a", "svc-b")
NAMES = {job: f"svc {job}" for job in JOBS}
FIGURES = {  # panel title -> the figure of an interval it shows
    "Power by service": lambda t: t.energy_j / t.seconds,
    "Energy per unit by service": lambda t: t.j_per_unit,
    "Throughput by service": lambda t: t.units / t.seconds,
    "Load by service": lambda t: t.load,
}


LATENCY = "Latency by service (p50, p99)"


def bucket(seconds: float) -> tuple[float, float]:
    return next((lo, hi) for lo, hi in zip((0.0, *BOUNDS), BOUNDS, strict=False) if lo < seconds <= hi)


def interpolated(q: float, latency_s: float) -> float:
    """histogram_quantile of observations all equal to ``latency_s`` in buckets :data:`BOUNDS`:
    the q-th of them lies q of the way through the bucket holding them."""
    lo, hi = bucket(latency_s)
    return lo + (hi - lo) * q


@dataclass
class Filled:
    engine: str
    url: str
    database: str = ""


def fill(store: Store) -> None:
    for n, job in enumerate(JOBS):
        write_service(store, job, f"svc-host-{n}", BASE)
    if isinstance(store, VictoriaStore):
        searchable(store.url)
    for job in JOBS:
        writer = IntervalWriter(
            store,  # type: ignore[arg-type]
            ReportSettings(share_rule="exclusive"),
            every_s=EVERY_S,
            wait_s=2,
            wall_ns=lambda: BASE + 60 * S,
        )
        assert writer.write_due(job) == len(truths(BASE))


@pytest.fixture(scope="module", params=["influxdb", "victoriametrics", "prometheus"])
def filled(request: pytest.FixtureRequest) -> Iterator[Filled]:
    if request.param == "influxdb":
        influxd: Influxd = request.getfixturevalue("influxd")
        with InfluxV1Store(influxd.url, influxd.new_database()) as influx:
            influx.create_database()
            fill(influx)
            yield Filled("influxdb", influxd.url, influx.database)
    elif request.param == "victoriametrics":
        vm: VictoriaMetrics = request.getfixturevalue("victoria_metrics")
        with VictoriaStore(vm.url) as victoria:
            fill(victoria)
            searchable(vm.url)
            yield Filled("victoriametrics", vm.url)
    else:
        prometheus: Daemon = request.getfixturevalue("prometheus")
        with PrometheusStore(prometheus.url) as prom:
            fill(prom)
            yield Filled("prometheus", prometheus.url)


def dashboard(engine: str) -> dict[str, Any]:
    folder = "dashboards" if engine == "influxdb" else "dashboards-prometheus"
    loaded: dict[str, Any] = json.loads((ROOT / "grafana" / folder / "services.json").read_text())
    return loaded


FROM_MS, TO_MS = BASE // 10**6, (BASE + 60 * S) // 10**6


def interpolate(query: str, services: list[str], influx: bool) -> str:
    """Grafana's substitution for this dashboard's variables and builtins (a step of EVERY_S)."""
    escape = r"[\\^$*+?.()|\[\]{}/]" if influx else r"[\\^$*+?.()|\[\]{}]"
    escaped = [re.sub(escape, lambda m: "\\" + m.group(0), s) for s in services]
    values = {
        "service": escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")",
        "timeFilter": f"time >= {FROM_MS}ms and time <= {TO_MS}ms",
        "__interval": f"{EVERY_S}s",
    }
    return re.sub(r"\$(\w+)", lambda m: values[m.group(1)], query)


def series_of(filled: Filled, query: str, services: list[str]) -> dict[str, dict[int, float]]:
    """Each series of a panel's query (by its name label) -> {time ms: value}."""
    out: dict[str, dict[int, float]] = {}
    if filled.engine == "influxdb":
        params = {"q": interpolate(query, services, True), "db": filled.database, "epoch": "ms"}
        status, body = http("POST", filled.url + "/query", urllib.parse.urlencode(params).encode())
        assert status == 200, body
        (result,) = json.loads(body)["results"]
        assert "error" not in result, result
        for s in result.get("series", []):
            values = out.setdefault(s["tags"]["name"], {})
            values.update({row[0]: row[1] for row in s["values"] if row[1] is not None})
        return out
    params = {
        "query": interpolate(query, services, False),
        "start": f"{FROM_MS / 1000:.3f}",
        "end": f"{TO_MS / 1000:.3f}",
        "step": str(EVERY_S),
    }
    status, body = http("GET", f"{filled.url}/api/v1/query_range?{urllib.parse.urlencode(params)}")
    assert status == 200, body
    for r in json.loads(body)["data"]["result"]:
        out.setdefault(r["metric"]["name"], {}).update({round(t * 1000): float(v) for t, v in r["values"]})
    return out


def shown_at(filled: Filled, truth: Truth) -> int:
    """Where a panel shows an interval (stamped at its start): InfluxDB's GROUP BY time labels a
    bucket [t, t + step) at t, a PromQL step at t holds the intervals of [t - step, t)."""
    bucket = truth.start_ns // (EVERY_S * S) * EVERY_S * 1000
    return bucket if filled.engine == "influxdb" else bucket + EVERY_S * 1000


@pytest.mark.servers
def test_each_panel_gives_each_interval_its_figures(filled: Filled) -> None:
    board = dashboard(filled.engine)
    panels = {p["title"]: p for p in board["panels"]}
    assert set(panels) == {*FIGURES, LATENCY}
    expected = truths(BASE)
    for title, figure in FIGURES.items():
        (target,) = panels[title]["targets"]
        query = target["query"] if filled.engine == "influxdb" else target["expr"]
        found = series_of(filled, query, [NAMES["svc-a"]])
        assert list(found) == [NAMES["svc-a"]], (title, found)
        points = found[NAMES["svc-a"]]
        want = {shown_at(filled, t): figure(t) for t in expected}
        assert sorted(points) == sorted(want), (title, points)
        for ms, value in want.items():
            assert points[ms] == pytest.approx(value, rel=1e-9), (title, ms)


@pytest.mark.servers
def test_the_latency_panel_gives_each_interval_its_quantiles(filled: Filled) -> None:
    panel = next(p for p in dashboard(filled.engine)["panels"] if p["title"] == LATENCY)
    for target, q in zip(panel["targets"], (0.5, 0.99), strict=True):
        query = target["query"] if filled.engine == "influxdb" else target["expr"]
        found = series_of(filled, query, [NAMES["svc-a"]])
        assert list(found) == [NAMES["svc-a"]], found
        want = {shown_at(filled, t): interpolated(q, t.latency_s) for t in truths(BASE)}
        assert found[NAMES["svc-a"]] == pytest.approx(want, rel=1e-9), q
        # the truth (every request's latency) in the bucket the quantile was read in
        assert all(bucket(v) == bucket(t.latency_s) for v, t in zip(want.values(), truths(BASE), strict=True))


@pytest.mark.servers
def test_all_services_shows_each(filled: Filled) -> None:
    board = dashboard(filled.engine)
    (variable,) = board["templating"]["list"]
    assert variable["includeAll"] and variable["multi"]
    panel = next(p for p in board["panels"] if p["title"] == "Power by service")
    (target,) = panel["targets"]
    query = target["query"] if filled.engine == "influxdb" else target["expr"]
    found = series_of(filled, query, list(NAMES.values()))
    assert sorted(found) == sorted(NAMES.values())
    last = truths(BASE)[-1]
    at = shown_at(filled, last)
    assert all(points[at] == pytest.approx(last.energy_j / last.seconds) for points in found.values())
    assert CLOSE_S < 60  # the range holds the whole job
