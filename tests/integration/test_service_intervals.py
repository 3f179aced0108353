"""Service intervals in the store (measurement ``service_interval``, issue #44): a service job
with known power and request rate (tests/helpers/service_intervals_data.py) gives each interval its
energy (power x time), requests (rate x time), J per request, throughput, mean power and load,
on SQLite, InfluxDB 1.x, VictoriaMetrics and Prometheus; an interval is written once it has
ended (never the one in progress), final ones are not computed again, and on the stores where
a rewrite replaces (SQLite, InfluxDB) late samples rewrite the interval in place.
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import Proc, start_collector, start_rapl_agent
from servers import Daemon, Influxd, VictoriaMetrics, free_port, http, searchable
from service_intervals_data import (
    BOUNDS,
    CLOSE_S,
    EVERY_S,
    RECENT,
    S,
    Truth,
    event_batch,
    samples,
    service_events,
    truths,
    write_service,
)
from sysfs_trees import PowerAdvancer, Zone, powercap_tree
from waits import wait_until

from wattline.reports.model import ReportSettings
from wattline.reports.summaries.intervals import IntervalWriter
from wattline.stores.base import Store
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.prometheus.store import PrometheusStore
from wattline.stores.sqlite.store import SqliteStore
from wattline.stores.victoria.store import VictoriaStore

WAIT_S = 2.0
#: Each test's job at its own time (the engines are the session's): 1000 s apart, multiples of EVERY_S.
BASES = (RECENT + n * 1000 * S for n in itertools.count())
TAGS = ("time", "job_id", "name", "unit", "latency")


class Stored:
    """A store under test and how the test reads its ``service_interval`` points back."""

    def __init__(self, kind: str, store: Store, engine: Any) -> None:
        self.kind, self.store, self.engine = kind, store, engine

    def flush(self) -> None:
        if self.kind == "victoria":
            searchable(self.engine.url)

    def points(self, job_id: str, base: int) -> tuple[dict[int, dict[str, float]], int]:
        """(interval start ns -> its fields, how many values were stored per (interval, field) at most)."""
        out: dict[int, dict[str, float]] = {}
        copies: Counter[tuple[int, str]] = Counter()
        if isinstance(self.store, SqliteStore):
            for start, fields in self.store._rows(
                "SELECT start_ns, fields FROM service_interval WHERE job_id = ?", [job_id]
            ):
                copies.update((start, f) for f in json.loads(fields))
                out.setdefault(start, {}).update(json.loads(fields))  # the figures' row, the latency's
        elif self.kind == "influxdb1":
            engine: Influxd = self.engine
            for row in engine.query(f"SELECT * FROM service_interval WHERE job_id = '{job_id}'", self.store.database):  # type: ignore[attr-defined]
                fields = {k: v for k, v in row.items() if k not in TAGS and v is not None}
                copies.update((row["time"], f) for f in fields)
                out.setdefault(row["time"], {}).update(fields)
        else:
            self.flush()
            query = urllib.parse.urlencode(
                {"query": f'{{__name__=~"service_interval_.+",job_id="{job_id}"}}[1000s]', "time": base // S + 500}
            )
            status, body = http("GET", f"{self.engine.url}/api/v1/query?{query}")
            assert status == 200, body
            for series in json.loads(body)["data"]["result"]:
                name = series["metric"]["__name__"].removeprefix("service_interval_")
                for at, value in series["values"]:
                    start = round(float(at) * 1000) * 10**6
                    copies[(start, name)] += 1
                    out.setdefault(start, {})[name] = float(value)
        return out, max(copies.values(), default=0)


@pytest.fixture(params=["sqlite", "influxdb1", "victoria", "prometheus"])
def stored(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stored]:
    kind = request.param
    if kind == "sqlite":
        with SqliteStore(tmp_path / "w.db") as sqlite:
            yield Stored(kind, sqlite, None)
    elif kind == "influxdb1":
        influxd: Influxd = request.getfixturevalue("influxd")
        with InfluxV1Store(influxd.url, influxd.new_database()) as influx:
            influx.create_database()
            yield Stored(kind, influx, influxd)
    elif kind == "victoria":
        vm: VictoriaMetrics = request.getfixturevalue("victoria_metrics")
        with VictoriaStore(vm.url) as victoria:
            yield Stored(kind, victoria, vm)
    else:
        prometheus: Daemon = request.getfixturevalue("prometheus")
        with PrometheusStore(prometheus.url) as prom:
            yield Stored(kind, prom, prometheus)


def writer(store: Store, wall: list[int]) -> IntervalWriter:
    return IntervalWriter(
        store,  # type: ignore[arg-type]
        ReportSettings(share_rule="exclusive"),
        every_s=EVERY_S,
        wait_s=WAIT_S,
        recheck_every_s=5,
        wall_ns=lambda: wall[0],
    )


def check(found: dict[str, float], truth: Truth, complete: bool = True) -> None:
    """``found`` against the truth the test set: each figure within float rounding of it."""
    expected = {
        "seconds": truth.seconds,
        "energy_j": truth.energy_j,
        "units": truth.units,
        "j_per_unit": truth.j_per_unit,
        "throughput_per_s": truth.units / truth.seconds,
        "mean_power_w": truth.energy_j / truth.seconds,
        "load": truth.load,
        "complete": 1.0 if complete else 0.0,
        "estimate_fraction": 0.0,  # counter samples: none of it a model estimate
        "estimate_share": 0.0,  # its deprecated name, the same
    }
    for name, value in expected.items():
        assert found.get(name) == pytest.approx(value, rel=1e-9), (name, found)
    # latency: every request took truth.latency_s, so that is the mean, and each quantile lies in its bucket
    assert found["observations"] == truth.units and found["observations_bound"] == 0
    assert found["mean_s"] == pytest.approx(truth.latency_s, rel=1e-9)
    bucket = [(lo, hi) for lo, hi in zip((0.0, *BOUNDS), BOUNDS, strict=False) if lo < truth.latency_s <= hi]
    for q in ("p50", "p99"):
        assert (found[f"{q}_low_s"], found[f"{q}_high_s"]) == bucket[0]
        assert found[f"{q}_low_s"] < found[f"{q}_s"] <= found[f"{q}_high_s"]
    # the bound: the truth within it, and it no wider than 1 % (counter samples that tile the interval)
    assert 0 <= found["energy_bound_j"] <= 0.01 * truth.energy_j
    assert abs(found["energy_j"] - truth.energy_j) <= found["energy_bound_j"] + 1e-9


def test_each_interval_of_a_service_once_it_has_ended(stored: Stored) -> None:
    base, host, job = next(BASES), f"svc-host-{stored.kind}", f"svc-{stored.kind}"
    events = service_events(job, base)
    running = [e for e in events if e.time_ns <= base + 36 * S]
    assert stored.store.write(samples(host, base, -2, 36, 1)).rejected == 0
    assert stored.store.write(event_batch(host, base, running, 1)).rejected == 0
    stored.flush()
    wall = [base + 36 * S]
    w = writer(stored.store, wall)
    assert w.write_due(job) == 3  # [3, 10), [10, 20), [20, 30): ended; [30, 40) still serving
    points, copies = stored.points(job, base)
    expected = truths(base)
    assert sorted(points) == [t.start_ns for t in expected[:3]]
    for truth in expected[:3]:
        check(points[truth.start_ns], truth)

    assert stored.store.write(samples(host, base, 36, CLOSE_S + 2, 2)).rejected == 0
    assert stored.store.write(event_batch(host, base, events[len(running) :], 2)).rejected == 0
    stored.flush()
    wall[0] = base + (CLOSE_S + 5) * S
    assert w.write_due(job) == 2  # the two left; the three final ones are not computed again
    assert w.write_due(job) == 0
    points, copies = stored.points(job, base)
    assert sorted(points) == [t.start_ns for t in expected]
    assert copies == 1
    for truth in expected:
        check(points[truth.start_ns], truth)


@pytest.mark.parametrize("stored", ["sqlite", "influxdb1"], indirect=True)
def test_late_samples_rewrite_an_interval_in_place(stored: Stored) -> None:
    assert getattr(stored.store, "replaces_intervals", False)
    base, host, job = next(BASES), f"late-host-{stored.kind}", f"late-{stored.kind}"
    write_service(stored.store, job, host, base, samples_to_s=25)  # the agent's spool holds the rest
    stored.flush()
    wall = [base + 31 * S]
    w = writer(stored.store, wall)
    assert w.write_due(job) == 2  # [3, 10) and [10, 20) final; [20, 30) waits for its samples
    wall[0] = base + int((CLOSE_S + 2 + WAIT_S) * S)
    assert w.write_due(job) == 3  # the wait is over: written as they are, incomplete
    expected = truths(base)
    points, _ = stored.points(job, base)
    assert [points[t.start_ns]["complete"] for t in expected] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert points[expected[2].start_ns]["energy_j"] < expected[2].energy_j  # 5 s of 10 measured

    assert stored.store.write(samples(host, base, 25, CLOSE_S + 2, 2)).rejected == 0
    wall[0] += 5 * S
    assert w.write_due(job) == 3
    points, copies = stored.points(job, base)
    assert sorted(points) == [t.start_ns for t in expected]
    assert copies == 1  # rewritten in place, not beside
    for truth in expected:
        check(points[truth.start_ns], truth)
    wall[0] += 5 * S
    assert w.write_due(job) == 0  # all final


def test_a_job_that_is_no_service_has_no_intervals(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "w.db") as store:
        base = next(BASES)
        batch = event_batch("h", base, [e for e in service_events("batchjob", base)], 1)
        for e in batch.job_events:
            if e.kind == e.KIND_OPEN:
                e.service = False
        store.write(batch)
        w = writer(store, [base + 100 * S])
        assert w.write_due("batchjob") == 0
        assert store._rows("SELECT count(*) FROM service_interval", []) == [(0,)]


#: The end-to-end service: 12 x 16 requests, one line every 0.5 s, on a host drawing POWER_W.
E2E_STEPS, E2E_PER_STEP, POWER_W, ADVANCE_S = 12, 16, 40.0, 0.01
AGENT_INTERVAL_S = 0.25  #: start_rapl_agent's sampling interval
E2E_LOOP = f'i=0; while [ $i -lt {E2E_STEPS} ]; do echo "done {E2E_PER_STEP}"; i=$((i + 1)); sleep 0.5; done'


def test_a_collector_writes_a_served_jobs_intervals(tmp_path: Path) -> None:
    """Through the real processes: ``wattline collector --service-interval 2`` on SQLite, an agent
    on a powercap zone advanced at POWER_W, a ``wattline run --service`` counting requests from
    its output. Each interval once, aligned to 2 s, its mean power the power set (within the
    advancer's step, POWER_W x ADVANCE_S at each edge, and within its bound), its requests
    adding up to those printed."""
    root = powercap_tree(tmp_path / "host", [Zone("intel-rapl:0", "package-0")])
    advancer = PowerAdvancer(root, {"intel-rapl:0": POWER_W}, period_s=ADVANCE_S)
    port, db = free_port(), tmp_path / "w.db"
    config = tmp_path / "wattline.toml"
    config.write_text(f'[agent]\noutbox_dir = "{tmp_path / "outbox"}"\n')
    collector = start_collector(
        port, ["--store", f"sqlite:///{db}", "--config", str(config)], tmp_path / "collector.log",
        "--service-interval", "2", "--summary-wait", "3", "--summary-interval", "1",
        "--summary-share-rule", "exclusive",
    )  # fmt: skip
    agent = start_rapl_agent("svc-node", root, port, 0.5, tmp_path / "agent.log", "--config", str(config))
    try:
        run = Proc(
            ["run", "--config", str(config), "--job", "e2e-svc", "--job-id", "e2e-svc", "--service", "--host-id",
             "svc-node", "--collector", f"127.0.0.1:{port}", "--units-from-stdout", r"done (\d+)", "--no-report",
             "--", "sh", "-c", E2E_LOOP],
            tmp_path / "run.log",
        )  # fmt: skip
        assert run.process.wait(timeout=60) == 0, run.log()

        def rows() -> list[tuple[int, dict[str, float]]] | None:
            with sqlite3.connect(db) as conn:
                found = [(s, json.loads(f)) for s, f in conn.execute("SELECT start_ns, fields FROM service_interval")]
            units = math.fsum(f["units"] for _, f in found)  # apportioned by overlap: fractions
            done = abs(units - E2E_STEPS * E2E_PER_STEP) < 1e-6 and all(f["complete"] == 1.0 for _, f in found)
            return sorted(found, key=lambda r: r[0]) if done else None

        def stored() -> str:
            with sqlite3.connect(db) as conn:
                found = list(conn.execute("SELECT start_ns, fields FROM service_interval ORDER BY start_ns"))
            return f"the service's intervals, complete; stored: {found}\n{collector.log()[-2000:]}"

        found = wait_until(rows, stored, timeout_s=40)
    finally:
        agent.terminate()
        collector.terminate()
        advancer.close()
    assert "Traceback" not in collector.log(), collector.log()[-3000:]
    starts = [s for s, _ in found]
    assert len(set(starts)) == len(starts) >= 3
    assert all(s % (2 * S) == 0 for s in starts[1:])  # wall-clock aligned (the first starts at the open)
    for (a, fa), (b, _) in itertools.pairwise(found):
        assert a + fa["seconds"] * S == pytest.approx(b, abs=1e3)  # they tile the run
    for _, f in found:
        truth = POWER_W * f["seconds"]
        slack = (
            2 * POWER_W * advancer.lag_s
        )  # the advancer writes every ADVANCE_S (or later, stalled): one step at each edge
        assert abs(f["energy_j"] - truth) <= slack, f
        assert abs(f["energy_j"] - truth) <= f["energy_bound_j"] + slack, f
        assert f["energy_bound_j"] <= POWER_W * AGENT_INTERVAL_S, f  # no wider than a sample's energy
        assert f["mean_power_w"] == pytest.approx(f["energy_j"] / f["seconds"])


@pytest.mark.parametrize("stored", ["victoria", "prometheus"], indirect=True)
def test_on_a_store_that_cannot_replace_an_interval_is_written_once(stored: Stored) -> None:
    """VictoriaMetrics and Prometheus: an interval whose samples are late waits until the report
    wait is over, then is written as it is (``complete`` 0), and late samples do not add a
    second value beside it."""
    assert not getattr(stored.store, "replaces_intervals", True)
    base, host, job = next(BASES), f"once-host-{stored.kind}", f"once-{stored.kind}"
    write_service(stored.store, job, host, base, samples_to_s=25)
    stored.flush()
    wall = [base + 31 * S]
    w = writer(stored.store, wall)
    assert w.write_due(job) == 2  # [20, 30) lacks samples and its wait is not over
    wall[0] = base + int((CLOSE_S + 2 + WAIT_S) * S)
    assert w.write_due(job) == 3
    assert stored.store.write(samples(host, base, 25, CLOSE_S + 2, 2)).rejected == 0
    stored.flush()
    wall[0] += 60 * S
    assert w.write_due(job) == 0
    points, copies = stored.points(job, base)
    expected = truths(base)
    assert copies == 1
    assert [points[t.start_ns]["complete"] for t in expected] == [1.0, 1.0, 0.0, 0.0, 0.0]
    for truth in expected[:2]:
        check(points[truth.start_ns], truth)


def test_a_running_service_is_looked_at_again_when_its_interval_ends(tmp_path: Path) -> None:
    """Read once an interval, not every poll; but every poll while an interval waits for samples."""
    with SqliteStore(tmp_path / "w.db") as store:
        base, job = next(BASES), "sched"
        events = service_events(job, base)
        assert store.write(samples("h", base, -2, 36, 1)).rejected == 0
        assert store.write(event_batch("h", base, [e for e in events if e.time_ns <= base + 36 * S], 1)).rejected == 0
        wall = [base + 36 * S]
        w = IntervalWriter(store, ReportSettings(share_rule="exclusive"), every_s=EVERY_S, wait_s=WAIT_S,
                           poll_s=0.5, clock=lambda: 100.0, wall_ns=lambda: wall[0])  # fmt: skip
        assert w.write_due(job) == 3
        assert w._due[job] == pytest.approx(100.0 + 4.0)  # [30, 40) ends in 4 s
        wall[0] = base + 40 * S  # it ended; its samples (up to 36 s) do not cover it yet
        assert w.write_due(job) == 0
        assert w._due[job] == pytest.approx(100.0 + 0.5)


def test_an_interval_waits_for_its_units_not_only_its_samples(tmp_path: Path) -> None:
    """The samples cover [20, 30) but the holder's events stop at 25 s (its connection is behind
    the agent's): the interval is not final until an event past its end arrives, then has every
    request."""
    with SqliteStore(tmp_path / "w.db") as store:
        base, job = next(BASES), "units-late"
        events = service_events(job, base)
        assert store.write(samples("h", base, -2, 36, 1)).rejected == 0
        early = [e for e in events if e.time_ns <= base + 25 * S]
        assert store.write(event_batch("h", base, early, 1)).rejected == 0
        wall = [base + 31 * S]
        w = writer(store, wall)
        assert w.write_due(job) == 2  # [20, 30) waits for its units
        rest = [e for e in events if base + 25 * S < e.time_ns <= base + 36 * S]
        assert store.write(event_batch("h", base, rest, 2)).rejected == 0
        wall[0] = base + 32 * S
        assert w.write_due(job) == 1
        points, _ = Stored("sqlite", store, None).points(job, base)
        for truth in truths(base)[:3]:
            check(points[truth.start_ns], truth)


def test_a_collector_that_starts_late_looks_back_from_an_interval_edge(tmp_path: Path) -> None:
    """A collector started long after the service opened computes at most ``backfill_s`` back,
    from an interval's edge: never a clipped interval overlapping one written before."""
    with SqliteStore(tmp_path / "w.db") as store:
        base, job = next(BASES), "late-start"
        events = service_events(job, base)
        assert store.write(samples("h", base, -2, 36, 1)).rejected == 0
        assert store.write(event_batch("h", base, [e for e in events if e.time_ns <= base + 36 * S], 1)).rejected == 0
        w = IntervalWriter(store, ReportSettings(share_rule="exclusive"), every_s=EVERY_S, wait_s=WAIT_S,
                           backfill_s=25, wall_ns=lambda: base + 36 * S)  # fmt: skip
        assert w.write_due(job) == 2  # 36 - 25 = 11 s: from 10 s, [10, 20) and [20, 30)
        points, _ = Stored("sqlite", store, None).points(job, base)
        assert sorted(points) == [t.start_ns for t in truths(base)[1:3]]
        check(points[base + 10 * S], truths(base)[1])
