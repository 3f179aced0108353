"""A service's latency beside its energy (issue #44): ``wattline run --metrics URL --preset vllm``
stores each bucket of the server's latency histogram as it grows, and ``wattline report`` gives
p50 and p99 of any span (the whole run, a ``--from/--to`` window, each ``--every`` interval) with
the interval of the bucket the true quantile lies in.

The truths are the test's: a vLLM-shaped endpoint whose histogram this test fills with known
latencies in three load steps (two models, the second appearing in the last step with a request
beyond the last finite bucket), scrapes that fail while the first step is observed, and a restart
of the server in the middle of the second (its counts back to 0, ``_created`` changed). Each
window's edges lie in quiet gaps with a scrape on either side, so every observation's window is
known. Through a collector writing SQLite, InfluxDB 1.x, VictoriaMetrics and Prometheus at once,
each report must count each window's observations exactly (none lost to the failed scrapes or the
restart, none doubled), interpolate each quantile as histogram_quantile does on the counts the test
knows, and bound it by exactly the bucket holding the true quantile of the values observed.
"""

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from exposition_server import ExpositionServer, serving
from procs import CLI, clean_env
from schema_check import schema_errors
from servers import Daemon, Influxd, VictoriaMetrics, searchable
from test_run_served import bad_run
from test_store_parity import Tee, same
from typer.testing import CliRunner
from waits import wait_until

from wattline import wire
from wattline.cli.main import app
from wattline.collector.server import CollectorServer
from wattline.jobs.events import EventBuilder, JobSpec, UnitAccumulator
from wattline.jobs.jobs_view import JobNotFound, build_view
from wattline.jobs.wrappers.served import ServedHolder, served_units
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.prometheus.store import PrometheusStore
from wattline.stores.sqlite.store import SqliteStore
from wattline.stores.victoria.store import VictoriaStore

HOST = "latency-host"
HISTOGRAM = "vllm:e2e_request_latency_seconds"
LE = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, math.inf)
LLAMA, QWEN = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct"
#: Latencies (s) observed per step and model, each step in bursts; the second step's second part
#: is observed by the restarted server.
STEP_A = {LLAMA: [0.03] * 6 + [0.2] * 12 + [0.7] * 5 + [3.0]}
STEP_B = {LLAMA: [0.08] * 10 + [0.4] * 8}
STEP_B_RESTARTED = {LLAMA: [0.3] * 9 + [1.5] * 3 + [7.0]}
STEP_C = {LLAMA: [0.04] * 4 + [0.6] * 10 + [2.0] * 2, QWEN: [0.2] * 5 + [20.0]}
SCRAPE = "0.1s"
UNITS = wire.pb.JobEvent.KIND_UNITS


class Served(ExpositionServer):
    """A vLLM-shaped ``/metrics``: each model's e2e latency histogram and finished requests, from
    the latencies the test observed; it can fail its scrapes and restart."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.values: dict[str, list[float]] = {}  # since the last restart
        self.created = time.time()
        self.scrapes = self.failures = 0
        self.failing = False

    def observe(self, values: dict[str, list[float]]) -> None:
        with self.lock:
            for model, latencies in values.items():
                self.values.setdefault(model, []).extend(latencies)

    def restart(self) -> None:
        with self.lock:
            self.values, self.created = {}, self.created + 60.0

    def text(self) -> str | None:
        with self.lock:
            if self.failing:
                self.failures += 1
                return None
            self.scrapes += 1
            lines = ["# TYPE vllm:request_success counter"]
            lines += [
                f'vllm:request_success_total{{finished_reason="stop",model_name="{m}"}} {len(v)}'
                for m, v in self.values.items()
            ]
            return "\n".join([*lines, *histogram_lines(self.values, self.created)]) + "\n"


def histogram_lines(observed: dict[str, list[float]], created: float) -> list[str]:
    """vLLM's e2e latency histogram of each model's ``observed`` latencies, made at ``created``."""
    lines = [f"# TYPE {HISTOGRAM} histogram"]
    for model, values in observed.items():
        labels = f'engine="0",model_name="{model}"'
        for le in LE:
            bound = "+Inf" if le == math.inf else repr(le)
            lines.append(f'{HISTOGRAM}_bucket{{{labels},le="{bound}"}} {sum(v <= le for v in values)}')
        lines.append(f"{HISTOGRAM}_sum{{{labels}}} {math.fsum(values)!r}")
        lines.append(f"{HISTOGRAM}_count{{{labels}}} {len(values)}")
    lines.append(f"# TYPE {HISTOGRAM}_created gauge")
    lines += [f'{HISTOGRAM}_created{{engine="0",model_name="{m}"}} {created}' for m in observed]
    return lines


@pytest.fixture
def served() -> Iterator[Served]:
    with serving(Served()) as server:
        yield server


def true_quantile(q: float, values: list[float]) -> float:
    """The ``q`` quantile of the values themselves (nearest rank)."""
    return sorted(values)[math.ceil(q * len(values)) - 1]


def bucket_of(value: float, bounds: tuple[float, ...] = LE) -> tuple[float, float | None]:
    """(low, high] of the bucket ``value`` lies in; high None: beyond the last finite bound."""
    at = next(i for i, le in enumerate(bounds) if value <= le)
    return (bounds[at - 1] if at else 0.0), (None if bounds[at] == math.inf else bounds[at])


def histogram_quantile(q: float, values: list[float]) -> float:
    """What Prometheus' histogram_quantile gives on the bucket counts of ``values``."""
    cumulative = [sum(v <= le for v in values) for le in LE]
    rank = q * len(values)
    at = next(i for i, count in enumerate(cumulative) if count >= rank)
    if LE[at] == math.inf:
        return LE[-2]
    low, below = (LE[at - 1], cumulative[at - 1]) if at else (0.0, 0)
    return low + (LE[at] - low) * (rank - below) / (cumulative[at] - below)


def merged(*steps: dict[str, list[float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for step in steps:
        for model, values in step.items():
            out.setdefault(model, []).extend(values)
    return out


def check(latency: list[dict[str, Any]], truth: dict[str, list[float]], where: str) -> None:
    """Each model's figures against the values observed in the span."""
    assert [(x["name"], x["labels"]) for x in latency] == [("e2e", {"model_name": m}) for m in sorted(truth)], where
    for x in latency:
        values = truth[x["labels"]["model_name"]]
        assert x["observations"] == len(values) and x["observations_bound"] == 0, where
        assert x["mean_s"] == pytest.approx(math.fsum(values) / len(values), rel=1e-9), where
        assert [p["q"] for p in x["quantiles"]] == [0.5, 0.99]
        for p in x["quantiles"]:
            true = true_quantile(p["q"], values)
            assert p["value"] == pytest.approx(histogram_quantile(p["q"], values), rel=1e-9), (where, p)
            assert (p["low"], p["high"]) == bucket_of(true), (where, p, true)  # the bucket, no wider
            assert p["low"] < true and (p["high"] is None or true <= p["high"]), (where, p, true)


def report(where: list[str], *args: str) -> str:
    """``wattline report lat --store WHERE ARGS``'s output (in this process: a CLI start per
    report would be most of the test's time)."""
    result = CliRunner().invoke(app, ["report", "lat", "--store", *where, *args], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return result.stdout


def closed(store: SqliteStore) -> bool:
    try:
        return build_view("lat", store.job_events("lat")).closed
    except JobNotFound:
        return False


@pytest.mark.servers
def test_p50_p99_per_window_within_their_buckets_through_a_restart_and_failed_scrapes(
    tmp_path: Path, served: Served, influxd: Influxd, victoria_metrics: VictoriaMetrics, prometheus: Daemon
) -> None:
    database = influxd.new_database()
    sqlite, victoria, prom = (
        SqliteStore(tmp_path / "w.db"),
        VictoriaStore(victoria_metrics.url),
        PrometheusStore(prometheus.url),
    )
    server = CollectorServer(Tee(sqlite, InfluxV1Store(influxd.url, database), victoria, prom), "127.0.0.1:0")
    server.start()
    env = {**clean_env(), "XDG_STATE_HOME": str(tmp_path / "state"), "WATTLINE_AGENT_EDGE_SOCKET": "off"}
    done = tmp_path / "done"
    edges: list[int] = []

    def scraped(more: int) -> None:
        """Until ``more`` scrapes rendered after now: the first of them is counted by the time
        the second renders (one scraping thread)."""
        start = served.scrapes
        wait_until(lambda: served.scrapes >= start + more, f"{more} scrapes")

    def gap() -> None:
        """A quiet gap with an edge in its middle: a reading after the step's last observation
        before it, one more after it, so no event across it holds an observation."""
        scraped(2)
        edges.append(time.time_ns())
        scraped(2)

    def step(values: dict[str, list[float]]) -> None:
        for part in range(3):  # in bursts, as load comes
            served.observe({m: v[part::3] for m, v in values.items()})
            time.sleep(0.05)

    try:
        run = subprocess.Popen(
            [*CLI, "run", "--job-id", "lat", "--host-id", HOST, "--collector", f"127.0.0.1:{server.port}",
             "--metrics", served.url, "--preset", "vllm", "--scrape-every", SCRAPE, "--no-report", "--service",
             "--", "sh", "-c", f"while [ ! -e {done} ]; do sleep 0.05; done"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        scraped(1)
        served.failing = True  # the first step observed while scrapes fail
        step(STEP_A)
        wait_until(lambda: served.failures >= 3, "failed scrapes")
        served.failing = False
        gap()
        step(STEP_B)
        scraped(2)
        served.restart()
        step(STEP_B_RESTARTED)
        gap()
        step(STEP_C)
        gap()
        done.touch()
        _, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        wait_until(lambda: closed(sqlite), "the job closed")
    finally:
        server.stop()
    assert "reset (its _created changed)" in err or "reset (it went down)" in err, err

    def shown() -> bool:
        searchable(victoria_metrics.url)
        count = len(sqlite.job_events("lat"))
        return len(victoria.job_events("lat")) == count and len(prom.job_events("lat")) == count

    wait_until(shown, "VictoriaMetrics and Prometheus show the job's events")
    stores = {
        "sqlite": [f"sqlite:///{tmp_path / 'w.db'}"],
        "influxdb": [influxd.url, "--influx-database", database],
        "victoriametrics": [victoria_metrics.url],
        "prometheus": [prometheus.url],
    }
    whole = merged(STEP_A, STEP_B, STEP_B_RESTARTED, STEP_C)
    b_and_c = merged(STEP_B, STEP_B_RESTARTED, STEP_C)
    window = ["--from", repr(edges[0] / 1e9), "--to", repr(edges[2] / 1e9)]
    every = ["--every", f"{(edges[1] - edges[0]) / 1e9!r}s"]
    answers: dict[str, list[dict[str, Any]]] = {}
    for name, where in stores.items():
        reports = [json.loads(report(where, "--json", *more)) for more in ([], [*window, *every])]
        for r in reports:
            assert schema_errors("report", r) == [], name
            assert all(k["name"] != "e2e" for k in r["unit_kinds"]), name  # latency is no unit kind
        run_report, window_report = reports
        assert run_report["units"]["total"] == sum(map(len, whole.values())), name  # the requests, none lost
        check(run_report["latency"], whole, f"{name} whole run")
        check(window_report["latency"], b_and_c, f"{name} window")
        rows = window_report["intervals"]["rows"]
        assert len(rows) == 2, (name, rows)
        check(rows[0]["latency"], merged(STEP_B, STEP_B_RESTARTED), f"{name} interval 1")
        check(rows[1]["latency"], STEP_C, f"{name} interval 2")
        answers[name] = reports
    for name in ("influxdb", "victoriametrics", "prometheus"):
        for mine, theirs in zip(answers["sqlite"], answers[name], strict=True):
            assert same(mine["latency"], theirs["latency"]) == [], name
    text = report(stores["sqlite"], *window, *every)
    assert "Latency" in text and "p99" in text and "> 10 s" in text, text  # qwen's p99: beyond 10 s
    qwen_p50_ms = histogram_quantile(0.5, STEP_C[QWEN]) * 1000  # the second interval's
    assert f"e2e {QWEN}: {qwen_p50_ms:g} ms / > 10 s" in text, text


#: Three readings' observations (s), one second apart after the open at T: each bucket's events
#: cover the time since the previous reading. The histogram's bounds.
READINGS = [[0.05] * 4, [0.3] * 6, [2.0] * 2]
BOUNDS = (0.1, 0.5, math.inf)
T = 1_780_000_000 * 10**9
S = 10**9


def stored_readings(path: Path) -> str:
    """A job whose holder stored :data:`READINGS` as a latency histogram's buckets; its store."""
    batch = wire.Batch()
    batch.host.host_id = HOST
    builder = EventBuilder(JobSpec("lat", "lat"))
    batch.job_events.append(builder.open(T))
    for i, values in enumerate(READINGS, start=1):
        for le in BOUNDS:
            labels = {"le": "+Inf" if le == math.inf else repr(le)}
            count = sum(v <= le for v in values)
            batch.job_events.append(builder.make(UNITS, T + i * S, units=count, unit="e2e", unit_labels=labels))
        sum_s = math.fsum(values)
        batch.job_events.append(builder.make(UNITS, T + i * S, units=sum_s, unit="e2e", unit_labels={"le": "sum"}))
    batch.job_events.append(builder.close(0, T + 5 * S))
    with SqliteStore(path) as store:
        assert store.write(batch).rejected == 0
    return f"sqlite:///{path}"


@pytest.mark.parametrize("from_s", [0.5, 1.25, 1.875, 2.0])
def test_a_window_edge_across_a_reading_bounds_each_quantile_by_every_way_its_observations_fall(
    tmp_path: Path, from_s: float
) -> None:
    """A window whose start cuts one reading's span: its observations may all lie inside or all
    outside, or any number of them. Each quantile's [low, high] must hold the true quantile of
    every such choice and be no wider: its ends are the buckets of the extreme choices."""
    store = stored_readings(tmp_path / "w.db")
    window = ["--from", repr((T + from_s * S) / 1e9), "--to", repr((T + 10 * S) / 1e9)]
    r = json.loads(report([store], "--json", *window))
    assert schema_errors("report", r) == []
    (x,) = r["latency"]
    cut = math.ceil(from_s) - 1  # the reading whose span (cut, cut + 1] s holds the window's start
    share = cut + 1 - from_s  # of its span, inside the window (0: the start is a reading's time)
    inside, edge = [v for values in READINGS[cut + 1 :] for v in values], READINGS[cut] if share else []
    # --from in float seconds: the edge is known to a few hundred ns of the reading's 1 s span
    close = {"rel": 1e-9, "abs": 1e-5}
    assert x["observations"] == pytest.approx(len(inside) + share * len(edge), **close)
    assert x["observations_bound"] == pytest.approx(max(share, 1 - share) * len(edge), **close)
    for p in x["quantiles"]:
        buckets = [bucket_of(true_quantile(p["q"], inside + edge[:k]), BOUNDS) for k in range(len(edge) + 1)]
        low = min(b[0] for b in buckets)
        high = None if any(b[1] is None for b in buckets) else max(b[1] for b in buckets if b[1] is not None)
        assert (p["low"], p["high"]) == (low, high), (from_s, p, buckets)


def test_a_unit_split_by_le_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Stored, ``le`` marks a latency bucket: a unit split by it would be read as one."""
    count = ["--count", "requests=req_total by le"]
    bad_run(tmp_path, ["--metrics", "http://127.0.0.1:9/metrics", *count], "le names a histogram's buckets")


def test_latency_from_count_sends_each_bucket_s_growth_through_a_restart() -> None:
    """``--count`` with ``--latency``: on canned scrapes through a restart (counts back, a new
    ``_created``), each bucket's events add up to the observations at or below its bound, the sum's
    to their sum; a bucket idle at its first scrape is stored then (the layout), its 0s held."""
    bounds = (0.1, 1.0, math.inf)
    lives = [[[0.3, 0.3], [0.3, 0.3, 0.3, 2.0]], [[0.05]]]  # per server life, its scrapes' observations so far

    def text(created: int, values: list[float]) -> str:
        lines = ["# TYPE req counter", f"req_total {len(values)}", "# TYPE h histogram"]
        lines += [
            f'h_bucket{{le="{"+Inf" if le == math.inf else le}"}} {sum(v <= le for v in values)}' for le in bounds
        ]
        lines += [f"h_sum {math.fsum(values)!r}", f"h_count {len(values)}", "# TYPE h_created gauge"]
        return "\n".join([*lines, f"h_created {created}"]) + "\n"

    texts = [text(1_700_000_000 + life, values) for life, scrapes in enumerate(lives) for values in scrapes]
    served, unit = served_units(
        "http://127.0.0.1:9/metrics", ["requests=req_total"], None, None, None, False, ["lat=h"]
    )
    assert served is not None and unit == "requests"
    events: list[wire.pb.JobEvent] = []
    units = UnitAccumulator(EventBuilder(JobSpec("c", "c")), events.extend)
    said: list[str] = []
    holder = ServedHolder(served, units, time.time_ns(), said.append, lambda url, timeout_s: texts.pop(0))
    for _ in range(3):
        assert holder.scrape(1.0) is not None
    assert any("reset" in line for line in said), said
    observed = lives[0][-1] + lives[1][-1]  # all the server observed: its first life's last scrape, then its second
    buckets: dict[str, list[float]] = {}
    for e in events:
        if e.unit:
            assert e.unit == "lat" and set(e.unit_labels) == {"le"}
            buckets.setdefault(e.unit_labels["le"], []).append(e.units)
    assert buckets["0.1"] == [0, 0, 1]  # idle at the first scrape: stored then; the second's 0 sent before the 1
    for le in bounds:
        assert math.fsum(buckets["+Inf" if le == math.inf else repr(le)]) == sum(v <= le for v in observed)
    assert math.fsum(buckets["sum"]) == pytest.approx(math.fsum(observed), rel=1e-12)
    assert holder.total == len(observed)  # the job's requests, apart from the buckets


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--latency", "e2e=h"], "option --latency needs --metrics URL"),
        (["--metrics", "http://127.0.0.1:9/m", "--preset", "vllm", "--latency", "e2e=h"], "named twice: e2e, e2e"),
        (["--metrics", "http://127.0.0.1:9/m", "--count", "r=r_total", "--latency", "e2e=h_bucket"], "without _bucket"),
    ],
)
def test_bad_latency_options_are_one_line_and_exit_2(tmp_path: Path, args: list[str], said: str) -> None:
    bad_run(tmp_path, args, said)
