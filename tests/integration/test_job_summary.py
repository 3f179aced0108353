"""Job summaries end to end: real agents (RAPL fixture trees advanced in wall time), a real
``wattline collector`` into a real influxd, ``wattline run --collector`` jobs (one on two
hosts). The collector writes each job's ``job_summary`` point when its close arrives; it
must match ``wattline report --json`` for the job (energy and J per unit to 0.1 %), be one
point per job however often it is recomputed, and the Jobs dashboard's summary panels must
give those figures. Plus the writer's own rules (debounce, retry) and the SQLite table. Each
job is alone on its hosts, whose power the test sets (its command barely uses the CPU): the
summaries and reports here are under rule "exclusive", which charges such a job its hosts.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from grafana_data import whole_run_j
from procs import CLI, Proc, clean_env, start_collector, start_rapl_agent
from servers import Influxd, free_port
from sysfs_trees import PowerAdvancer, Zone, powercap_tree
from test_grafana import (
    Filled,
    Fixture,
    Scope,
    find_panel,
    influxql,
    job_table,
    load,
    resolve_variables,
    rows,
    run_dashboard,
    run_panel,
)
from waits import wait_until

from wattline.reports.build import build_report
from wattline.reports.report_json import report_json
from wattline.reports.summaries.summary import Sink, SummaryWriter, record_summary, summary_of
from wattline.stores.base import JobSummary, StoreUnavailable, WriteResult
from wattline.stores.influxdb.influxql import QueryError
from wattline.stores.influxdb.linestore import LineProtocolStore
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.sqlite.store import SqliteStore

START_UJ = 10**11
POWER_W = {"node-a": {"intel-rapl:0": 40.0, "intel-rapl:0:1": 5.0}, "node-b": {"intel-rapl:0": 25.0}}
BATCH_S = 1.0
#: The workload: ``steps`` x 16 documents, one step every 0.5 s.
UNITS = 'i=0; while [ $i -lt {steps} ]; do echo "done 16"; i=$((i + 1)); sleep 0.5; done'


def wattline(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**clean_env(), "COLUMNS": "200"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def run_args(job: str, job_id: str, host: str, port: int, config: Path, steps: int = 8) -> list[str]:
    """``wattline run`` of the workload; ``config`` names this test's own outbox (the default
    one is shared by every wattline process of the machine: events other runs left there
    would reach this collector)."""
    return [
        "run", "--config", str(config), "--job", job, "--job-id", job_id, "--kind", "inference", "--units", "documents", "--host-id", host,
        "--collector", f"127.0.0.1:{port}", "--units-from-stdout", r"done (\d+)", "--saturated-after", "1s",
        "--no-report", "--", "sh", "-c", UNITS.format(steps=steps),
    ]  # fmt: skip


def agent(host: str, tree: Path, port: int, tmp_path: Path) -> Proc:
    spool = ["--spool-dir", str(tmp_path / f"spool-{host}"), "--outbox-dir", str(tmp_path / "outbox")]
    return start_rapl_agent(host, tree, port, BATCH_S, tmp_path / f"{host}.log", *spool)


def assert_matches(summary: JobSummary, report: dict[str, Any]) -> None:
    """The summary holds the report's figures (energy and J per unit to 0.1 %)."""
    f = summary.fields
    assert f["energy_j"] == pytest.approx(report["measured"]["energy_j"], rel=1e-3)
    assert f["energy_total_j"] == pytest.approx(whole_run_j(report), rel=1e-3)
    assert f["j_per_unit"] == pytest.approx(report["measured"]["j_per_unit"], rel=1e-3)
    assert f["units_total"] == report["units"]["total"]
    assert f["units_saturated"] == f["units_measured"] == report["units"]["saturated"]
    assert f["saturated_s"] == f["measured_s"] == pytest.approx(report["durations_s"]["saturated"])
    assert f["hosts"] == len(report["job"]["hosts"])
    assert f["status"] == report["job"]["status"] == "closed" and f["complete"] is True
    assert f["measured_fraction"] == pytest.approx(report["saturated"]["coverage"]["measured_fraction"])
    assert f["measured_share"] == f["measured_fraction"]  # its deprecated name
    assert f["fraction_counter"] == f["share_counter"] == 1.0  # RAPL counters only; then its deprecated name
    assert f["exit_code"] == 0 and f["policy_idle"] == "none" and f["price_usd_per_instance_hour"] == 0.5
    assert f["cost_usd_per_run"] == pytest.approx(report["measured"]["cost_usd_per_run"], rel=1e-3)
    assert summary.tags == {"name": report["job"]["name"], "kind": "inference", "unit": "documents"}


def assert_the_power_set(summary: JobSummary, events: list[Any], lag_s: float) -> None:
    """The truth is the test's: each host draws the sum of its POWER_W zones (no other job
    on it meanwhile), so its energy is that power x its window as the stored open and close
    give it, to the counters' lag at each edge (``lag_s``: the longest the PowerAdvancers went
    between two writes); the units are the workload's 16 per step."""
    total_j = slack_j = 0.0
    for host, zones in POWER_W.items():
        mine = [e for e in events if e.host == host]
        if not mine:
            continue
        [opened] = [e.time_ns for e in mine if e.event == "open"]
        [closed] = [e.time_ns for e in mine if e.event == "close"]
        power_w = sum(zones.values())
        truth = power_w * (closed - opened) / 1e9
        assert summary.hosts[host] == pytest.approx(truth, abs=2 * power_w * lag_s), host
        total_j, slack_j = total_j + truth, slack_j + 2 * power_w * lag_s
    assert summary.fields["energy_total_j"] == pytest.approx(total_j, abs=slack_j)
    steps = {"solo-1": 8, "pair-1": 8 + 50}[summary.job_id]
    assert summary.fields["units_total"] == 16 * steps


@pytest.mark.servers
def test_collector_writes_job_summaries_that_match_the_report(tmp_path: Path, influxd: Influxd) -> None:
    database = influxd.new_database()
    config = tmp_path / "wattline.toml"
    config.write_text(f'[collector]\ninflux_database = "{database}"\n[agent]\noutbox_dir = "{tmp_path / "outbox"}"\n')
    port = free_port()
    collector = start_collector(
        port,
        ["--store", influxd.url, "--config", str(config)],
        tmp_path / "collector.log",
        "--summary-wait", "10", "--summary-interval", "3", "--summary-price", "0.5",
        "--summary-share-rule", "exclusive",
    )  # fmt: skip
    trees = {
        host: powercap_tree(tmp_path / host, [Zone(z, "package-0" if z == "intel-rapl:0" else "dram", START_UJ)
                                              for z in power])
        for host, power in POWER_W.items()
    }  # fmt: skip
    counters = [PowerAdvancer(trees[host], power, START_UJ) for host, power in POWER_W.items()]
    agents = [agent(host, trees[host], port, tmp_path) for host in POWER_W]
    store = InfluxV1Store(influxd.url, database)
    try:
        begun = time.time_ns()
        for host in POWER_W:  # the agents' samples cover the jobs' opens
            wait_until(lambda h=host: store.samples(h, begun, time.time_ns() + 10**9), f"{host}'s samples")
        solo = Proc(run_args("ocr-solo", "solo-1", "node-a", port, config), tmp_path / "solo.log")
        assert solo.process.wait(timeout=60) == 0, solo.log()
        # The two-host job: node-b starts 1 s after node-a and runs 25 s (node-a: 4 s; a loaded machine makes that slower), so
        # node-a closes first: a summary while node-b runs, then one when it closes.
        first = Proc(run_args("ocr-pair", "pair-1", "node-a", port, config), tmp_path / "pair-a.log")
        # node-b opens once node-a's open is stored: node-a's window starts first
        wait_until(lambda: any(e.event == "open" for e in store.job_events("pair-1")), "node-a's open of pair-1")
        second = Proc(run_args("ocr-pair", "pair-1", "node-b", port, config, steps=50), tmp_path / "pair-b.log")
        assert first.process.wait(timeout=60) == 0, first.log()
        while_running = wait_until(lambda: store.job_summary("pair-1"), "pair summary after node-a's close")
        assert second.alive(), "node-b's run ended before the summary after node-a's close was checked"
        assert while_running.fields["status"] == "running" and while_running.fields["closed"] is False
        assert second.process.wait(timeout=60) == 0, second.log()

        def closed_summary(job_id: str, hosts: int) -> JobSummary | None:
            s = store.job_summary(job_id)
            # complete: a summary written incomplete (samples late on a loaded machine) is
            # computed again every summary_interval until its samples have arrived
            closed = s and s.fields.get("status") == "closed" and s.fields.get("hosts") == hosts
            return s if closed and s.fields.get("complete") is True else None

        summaries = {
            "solo-1": wait_until(lambda: closed_summary("solo-1", 1), "solo summary"),
            "pair-1": wait_until(lambda: closed_summary("pair-1", 2), "pair summary"),
        }
        reports = {}
        for job_id, summary in summaries.items():
            out = wattline(
                "report", job_id, "--json", "--store", influxd.url, "--config", str(config), "--price", "0.5",
                "--share-rule", "exclusive",
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            reports[job_id] = json.loads(out.stdout)
            assert_matches(summary, reports[job_id])
        assert set(summaries["pair-1"].hosts) == set(POWER_W)
        for job_id, summary in summaries.items():
            assert_the_power_set(summary, store.job_events(job_id), max(c.lag_s for c in counters))
        assert sum(summaries["pair-1"].hosts.values()) == pytest.approx(whole_run_j(reports["pair-1"]), rel=1e-3)

        # One point per job, though the two-host job was computed as each host closed.
        log = collector.log()
        assert "Traceback" not in log, log[-3000:]
        assert "job summary of pair-1 written (running, 2 host(s))" in log, log[-3000:]
        assert "job summary of pair-1 written (closed, 2 host(s))" in log, log[-3000:]
        assert summaries["pair-1"].fields["computed_ns"] > while_running.fields["computed_ns"]
        for job_id in summaries:
            (count,) = influxd.query(f"SELECT count(energy_j) FROM job_summary WHERE job_id = '{job_id}'", database)
            assert count["count"] == 1, job_id
        # Recomputed (as another collector would): rewritten in place, not duplicated.
        again = record_summary(store, store.write_summary, "pair-1", build_report_settings())
        (count,) = influxd.query("SELECT count(energy_j) FROM job_summary WHERE job_id = 'pair-1'", database)
        assert count["count"] == 1
        rewritten = store.job_summary("pair-1")
        assert rewritten is not None and rewritten.fields["computed_ns"] > summaries["pair-1"].fields["computed_ns"]
        assert rewritten.fields["energy_j"] == pytest.approx(again.saturated_window.energy_j)

        check_dashboard(influxd, database, reports)
    finally:
        for proc in agents:
            proc.kill9()
        for c in counters:
            c.close()
        collector.terminate()
        store.close()


def build_report_settings() -> Any:
    from wattline.reports.model import ReportSettings

    return ReportSettings(price_per_instance_hour=0.5, share_rule="exclusive")


def check_dashboard(influxd: Influxd, database: str, reports: dict[str, dict[str, Any]]) -> None:
    """Every Jobs dashboard query runs on the pipeline's data; the summary panels give the reports' figures."""
    events = influxd.query("SELECT * FROM job_events", database)
    first_ms = min(e["time"] for e in events) // 10**6 - 60_000
    last_ms = max(e["time"] for e in events) // 10**6 + 60_000
    filled = Filled(influxd.url, database, Fixture(first_ms * 10**6, last_ms * 10**6))
    dashboard = load("jobs")
    overview = Scope(first_ms, last_ms, interval_s=1)
    resolve_variables(filled, dashboard, overview, {"job": "pair-1"})
    table = job_table(filled, dashboard, overview)
    for job_id, report in reports.items():
        assert table[job_id]["energy_j"] == pytest.approx(whole_run_j(report), rel=1e-3)
        assert table[job_id]["j_per_unit"] == pytest.approx(report["measured"]["j_per_unit"], rel=1e-3)
    pair = table["pair-1"]
    scope = Scope(pair["start"], pair["end"], interval_s=1)
    resolve_variables(filled, dashboard, scope, {"job": "pair-1"})
    assert run_dashboard(filled, dashboard, scope) == []
    (energy,) = rows(run_panel(filled, scope, find_panel(dashboard, "Energy: $job_name"))["A"])
    assert energy["energy_j"] == pytest.approx(reports["pair-1"]["measured"]["energy_j"], rel=1e-3)
    (per_unit,) = rows(run_panel(filled, scope, find_panel(dashboard, "Energy per unit: $job_name"))["A"])
    assert per_unit["j_per_unit"] == pytest.approx(reports["pair-1"]["measured"]["j_per_unit"], rel=1e-3)
    drift = rows(run_panel(filled, overview, find_panel(dashboard, "J per unit over time, by job name"))["A"])
    assert {r["name"]: r["j_per_unit"] for r in drift} == pytest.approx(
        {report["job"]["name"]: report["measured"]["j_per_unit"] for report in reports.values()}, rel=1e-3
    )
    by_job = rows(run_panel(filled, overview, find_panel(dashboard, "Energy by job over the range"))["A"])
    assert {r["job_id"]: r["energy_wh"] * 3600 for r in by_job} == pytest.approx(
        {job_id: whole_run_j(report) for job_id, report in reports.items()}, rel=1e-3
    )
    unclaimed = run_panel(filled, overview, find_panel(dashboard, "Energy no job claims, by host"))
    node = {r["host"]: r["node_j"] for r in rows(unclaimed["A"])}
    jobs = {r["host"]: r["jobs_j"] for r in rows(unclaimed["B"])}
    assert set(jobs) == set(POWER_W) and all(0 < jobs[h] < node[h] for h in jobs)
    annotation = next(a for a in dashboard["annotations"]["list"] if a["name"] == "Warm-up (start to saturation)")
    got = rows(influxql(filled, overview.interpolate(annotation["target"]["query"])))
    assert {r["job_id"] for r in got} == {j for j, r in reports.items() if r["saturation"]["saturated"]}


@pytest.mark.servers
def test_influx_summary_rewrite_keeps_one_point_when_start_or_fields_change(influxd: Influxd) -> None:
    """A job whose start moved (an earlier host's open arrived late) or whose figures lost a
    field (no price any more) still has one job_summary point, holding only the new figures."""
    store = InfluxV1Store(influxd.url, influxd.new_database())
    try:
        first = JobSummary("j-9", 10**18, {"name": "a"}, {"energy_j": 2.0, "cost_usd_per_run": 1.0}, {"h1": 2.0})
        store.write_summary(first)
        store.write_summary(first)
        assert store.job_summary("j-9") == first
        moved = JobSummary("j-9", 10**18 - 10**9, {"name": "a"}, {"energy_j": 3.0}, {"h2": 3.0})
        store.write_summary(moved)
        assert store.job_summary("j-9") == moved
        for measurement in ("job_summary", "job_summary_host"):
            (count,) = influxd.query(f"SELECT count(energy_j) FROM {measurement}", store.database)
            assert count["count"] == 1, measurement
        # Two collectors raced (two starts written, bypassing the check): the next write heals it.
        LineProtocolStore.write_summary(store, first)
        with pytest.raises(QueryError, match="2 job_summary points"):
            store.job_summary("j-9")
        store.write_summary(moved)
        assert store.job_summary("j-9") == moved
    finally:
        store.close()


# -- the writer's rules, on SQLite -------------------------------------------------------------


def test_sqlite_job_summary_is_one_row_per_job(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "w.db")
    try:
        summary = JobSummary("j-1", 10**18, {"name": "a"}, {"energy_j": 1.5, "status": "running"}, {"h": 1.5})
        assert store.write_summary(summary).written == 1
        later = JobSummary("j-1", 10**18, {"name": "a"}, {"energy_j": 3.0, "status": "closed"}, {"h": 3.0})
        store.write_summary(later)
        assert store.job_summaries() == [later]
        bad = JobSummary("j-2", 10**18, {"name": "a\n"}, {"energy_j": 1.0}, {})
        result = store.write_summary(bad)
        assert result.rejected == 1 and "line feed" in result.reasons[0]
    finally:
        store.close()
    # A v4 file (before summaries) upgrades in place: the table appears, nothing else changes.
    import sqlite3

    with sqlite3.connect(tmp_path / "w.db") as db:
        db.execute("DROP TABLE job_summary")
        db.execute("PRAGMA user_version = 4")
    store = SqliteStore(tmp_path / "w.db")
    try:
        assert store.job_summaries() == []
        store.write_summary(later)
        assert store.job_summaries() == [later]
    finally:
        store.close()


class FlakySink:
    """A summary sink that fails its first ``failures`` writes (store down), then keeps them."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.written: list[JobSummary] = []

    def __call__(self, summary: JobSummary) -> WriteResult:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("influxdb down")
        self.written.append(summary)
        return WriteResult(written=1)


def embedded_job(tmp_path: Path) -> SqliteStore:
    """A closed job in a SQLite store, written by an embedded `wattline run` (which writes its summary)."""
    db = tmp_path / "e.db"
    out = wattline("run", "--job", "emb", "--job-id", "emb-1", "--store", f"sqlite:///{db}", "--interval", "0.2",
                   "--no-report", "--", "sleep", "1")  # fmt: skip
    assert out.returncode == 0, out.stderr
    return SqliteStore(db)


def test_embedded_run_writes_its_summary_and_the_writer_retries(tmp_path: Path, caplog: Any) -> None:
    store = embedded_job(tmp_path)
    try:
        stored = store.job_summary("emb-1")
        assert stored is not None, "the embedded run wrote no summary"
        report = build_report(store, "emb-1")
        assert stored.fields["energy_j"] == pytest.approx(report.saturated_window.energy_j, rel=1e-9)
        assert stored.time_ns == report.job.start_ns

        sink = FlakySink(failures=2)
        writer = SummaryWriter(store, sink, retry_s=0.05, running_every_s=60.0, wait_s=0.0).start()
        try:
            writer.job_events([("emb-1", True), ("emb-1", True)])  # debounced: one job due
            wait_until(lambda: sink.written, "summary after retries")
            assert len(sink.written) == 1 and writer.failed == 2 and writer.written == 1
            assert sink.written[0].fields["energy_j"] == pytest.approx(report.saturated_window.energy_j)
            assert sum("failed (attempt" in r.message for r in caplog.records) == 2
            # A running job's events within running_every_s of its last summary wait for it.
            writer.job_events([("emb-1", False)])
            barrier(writer, caplog)  # everything due by now is done: emb-1 is not
            assert len(sink.written) == 1 and writer.pending() == 1
        finally:
            writer.stop()
    finally:
        store.close()


def test_summary_of_carries_the_report_json(tmp_path: Path) -> None:
    store = embedded_job(tmp_path)
    try:
        report = build_report(store, "emb-1")
        data = report_json(report)
        summary = summary_of(report, computed_ns=1)
        assert summary.fields["schema"] == "wattline.job_summary/1"
        assert summary.fields["energy_j"] == data["measured"]["energy_j"]
        for comp in data["measured"]["by_component"]:
            assert summary.fields[f"energy_{comp['component']}_j"] == comp["energy_j"]
        assert "cost_usd_per_run" not in summary.fields  # no price: absent, never 0
        assert all(v is not None for v in summary.fields.values())
    finally:
        store.close()


# -- scale-out: which engine serves reads -------------------------------------------------------


@pytest.mark.servers
def test_victoria_metrics_takes_writes_but_serves_no_report_reads(tmp_path: Path, victoria_metrics: Any) -> None:
    """VictoriaMetrics stores what the collector writes (PromQL reads it back), but answers no
    InfluxQL: a report, a job summary or an InfluxQL dashboard cannot read from it, and says so."""
    from servers import T0, http, make_batch

    from wattline.stores.influxdb.influxql import QueryError

    store = InfluxV1Store(victoria_metrics.url, "wattline")
    try:
        assert store.write(make_batch(host="vm-node", job_id="vm-job")).rejected == 0
        assert victoria_metrics.export('{__name__="energy_energy_j",host="vm-node"}', expect=2)
        query = urllib_query({"query": 'sum(energy_energy_j{host="vm-node"})', "time": str(T0 / 1e9 + 2)})
        status, body = http("GET", f"{victoria_metrics.url}/api/v1/query?{query}")
        assert status == 200 and json.loads(body)["data"]["result"], body  # PromQL/MetricsQL reads work
        for read in (lambda: store.job_events("vm-job"), lambda: store.samples("vm-node", T0, T0 + 4 * 10**9)):
            with pytest.raises(QueryError, match="answers no InfluxQL"):
                read()
    finally:
        store.close()
    from wattline.cli.daemons import summary_writer
    from wattline.collector.settings import CollectorSettings

    assert summary_writer(CollectorSettings(store=victoria_metrics.url, influx_api="v1")) is None  # said in the log
    config = tmp_path / "vm.toml"
    config.write_text('[collector]\ninflux_api = "v1"\n')
    out = wattline("report", "vm-job", "--store", victoria_metrics.url, "--config", str(config))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "answers no InfluxQL" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def urllib_query(params: dict[str, str]) -> str:
    import urllib.parse

    return urllib.parse.urlencode(params)


# -- the collector's hook ---------------------------------------------------------------------


def test_collector_hook_names_each_written_jobs_events_and_never_fails_a_batch(tmp_path: Path) -> None:
    from servers import make_batch

    from wattline.collector.server import CollectorServer

    calls: list[list[tuple[str, bool]]] = []

    def hook(jobs: list[tuple[str, bool]]) -> None:
        calls.append(jobs)
        raise RuntimeError("a broken hook")  # logged; the batch is still written and acknowledged

    store = SqliteStore(tmp_path / "h.db")
    server = CollectorServer(store, "127.0.0.1:0", on_job_events=hook)
    try:
        ack = asyncio.run(server.service.Push(make_batch(job_id="hooked"), None))  # type: ignore[arg-type]
        assert ack.written == 8 and ack.rejected == 0
        asyncio.run(server.service.Push(make_batch(seq=2), None))  # type: ignore[arg-type]  # no job events: no call
        assert calls == [[("hooked", True)]]
        assert len(store.job_events("hooked")) == 4
    finally:
        server.stop(0)
        store.close()


def test_job_events_never_wait_for_a_summary_being_computed(tmp_path: Path) -> None:
    """Ingest's call returns at once even while the writer is stuck in a slow store write."""
    store = embedded_job(tmp_path)
    release = threading.Event()
    entered = threading.Event()

    def slow_sink(summary: JobSummary) -> WriteResult:
        entered.set()
        release.wait(10)
        return WriteResult(written=1)

    writer = SummaryWriter(store, slow_sink).start()
    try:
        writer.job_events([("emb-1", True)])
        assert entered.wait(10)
        started = time.perf_counter()
        for i in range(1000):
            writer.job_events([("emb-1", True), (f"other-{i}", False)])
        assert time.perf_counter() - started < 0.5
        assert writer.pending() == 1001  # each job due once, however many events
    finally:
        release.set()
        writer.stop()
        store.close()


def test_a_summary_written_incomplete_is_computed_again_when_late_samples_arrive(tmp_path: Path) -> None:
    """The job's close reaches the store before its host's last 5 s of samples (an agent
    whose spool delivers late): the summary written after ``wait_s`` says complete=false, and
    the writer looks again every ``running_every_s`` until the samples have arrived; the
    summary then equals the report (50 W x 15 s), not the 50 W x 10 s first seen."""
    from pipeline import SyntheticHost, ZoneSpec

    from wattline import wire
    from wattline.jobs.events import EventBuilder, JobSpec

    host = SyntheticHost(tmp_path / "h", "late-host", [ZoneSpec("intel-rapl:0", "package-0", 50.0)])
    store = SqliteStore(tmp_path / "w.db")

    def ship() -> None:
        host.spool.seal()
        while (batch := host.spool.peek()) is not None:
            store.write(batch)
            host.spool.ack(batch.seq)

    try:
        b = EventBuilder(JobSpec("late-1", "late", "inference", "items"))
        host.advance(2.0, 2)
        opened = host.t_ns
        host.advance(10.0, 10)
        ship()  # samples up to open + 10 s reach the store; the job closes at open + 15 s
        events = [b.open(opened), b.close(0, opened + 15 * 10**9)]
        store.write(wire.Batch(stream_id="wrapper", seq=1, host=wire.Host(host_id="late-host"), job_events=events))
        sink = FlakySink(failures=0)
        writer = SummaryWriter(store, sink, wait_s=0.2, poll_s=0.05, running_every_s=0.3).start()
        try:
            writer.job_events([("late-1", True)])
            first = wait_until(lambda: sink.written, "the incomplete summary")[0]
            assert first.fields["complete"] is False
            assert first.fields["energy_j"] == pytest.approx(50.0 * 10, rel=1e-6)
            host.advance(7.0, 7)  # the late samples arrive
            ship()
            last = wait_until(lambda: [s for s in sink.written if s.fields["complete"]], "a complete summary")[0]
            assert last.fields["energy_j"] == pytest.approx(50.0 * 15, rel=1e-6)
            assert last.fields["energy_j"] == pytest.approx(
                build_report(store, "late-1").saturated_window.energy_j, rel=1e-9
            )
            time.sleep(1.0)  # time, not a state: complete, so not computed again (3 x running_every_s)
            assert sum(s.fields["complete"] for s in sink.written) == 1 and writer.pending() == 0
        finally:
            writer.stop()
    finally:
        store.close()
        host.close()


# -- docs/reports.md's promises on the writer's timing, on a clock the test moves --------------


class TestClock:
    """The writer's clock (s), moved only by the test. The writer thread waits real time for
    a clock-time gap, so each move is followed by :func:`barrier`, which wakes it."""

    __test__ = False

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class RecordingSink(FlakySink):
    """A :class:`FlakySink` that notes the writer's clock at each attempt, failed or not."""

    def __init__(self, clock: TestClock, failures: int) -> None:
        super().__init__(failures)
        self.clock = clock
        self.attempts: list[float] = []

    def __call__(self, summary: JobSummary) -> WriteResult:
        self.attempts.append(self.clock())
        return super().__call__(summary)


_BARRIERS = itertools.count()


def barrier(writer: SummaryWriter, caplog: Any, at: float | None = None, clock: TestClock | None = None) -> None:
    """Move the clock to ``at`` and return once the writer has done everything due by then.
    A job of no store is marked due at ``at``: the writer takes due jobs earliest first on one
    thread, so once it has logged that job as not written, every job due before ``at`` was
    computed (a state to wait for, where "nothing happened yet" is not)."""
    if clock is not None and at is not None:
        clock.t = at
    marker = f"barrier-{next(_BARRIERS)}"
    writer.job_events([(marker, False)])
    wait_until(lambda: any(f"summary of {marker} not written" in r.getMessage() for r in caplog.records), marker)


def driven_writer(tmp_path: Path, clock: TestClock, sink: Sink, **kw: Any) -> tuple[SqliteStore, SummaryWriter]:
    store = embedded_job(tmp_path)
    # wait_s 0: a job of no store is given up at once, so a barrier never waits for itself
    return store, SummaryWriter(store, sink, wait_s=0.0, clock=clock, **kw).start()


def test_a_failed_write_is_retried_at_2_s_doubling_to_60_s(tmp_path: Path, caplog: Any) -> None:
    """docs/reports.md: a failed write is retried (2 s, doubling to 60 s). Seven failures: the
    attempts come exactly 2, 4, 8, 16, 32, 60 and 60 s apart, never earlier (a barrier just
    before each due time finds no attempt), and the eighth writes the summary."""
    caplog.set_level("INFO")
    clock = TestClock()
    sink = RecordingSink(clock, failures=7)
    store, writer = driven_writer(tmp_path, clock, sink)
    try:
        writer.job_events([("emb-1", False)])
        wait_until(lambda: writer.failed == 1, "the first attempt")
        for gap in (2, 4, 8, 16, 32, 60, 60):
            due = sink.attempts[-1] + gap
            tries = len(sink.attempts)
            barrier(writer, caplog, due - 0.01, clock)
            assert len(sink.attempts) == tries, f"retried before {gap} s"
            barrier(writer, caplog, due, clock)
            assert sink.attempts[-1] == due
        assert writer.failed == 7 and writer.written == 1 and len(sink.written) == 1
    finally:
        writer.stop()
        store.close()


def test_an_incomplete_summary_is_computed_again_up_to_an_hour_after_the_close(tmp_path: Path, caplog: Any) -> None:
    """README: an incomplete summary is computed again every ``summary_interval`` until
    complete, up to an hour after the close. A closed job whose samples never cover its
    window (its host's samples stop before the close) is computed at the close, every 600 s
    after it up to 3600 s, and never after."""
    from pipeline import SyntheticHost, ZoneSpec

    from wattline import wire
    from wattline.jobs.events import EventBuilder, JobSpec

    caplog.set_level("INFO")
    host = SyntheticHost(tmp_path / "h", "late-host", [ZoneSpec("intel-rapl:0", "package-0", 50.0)])
    store = SqliteStore(tmp_path / "w.db")
    clock = TestClock()
    sink = RecordingSink(clock, failures=0)
    writer = SummaryWriter(store, sink, wait_s=0.0, running_every_s=600.0, clock=clock).start()
    try:
        b = EventBuilder(JobSpec("late-1", "late", "inference", "items"))
        host.advance(2.0, 2)
        opened = host.t_ns
        host.advance(5.0, 5)
        host.spool.seal()
        while (batch := host.spool.peek()) is not None:
            store.write(batch)
            host.spool.ack(batch.seq)
        closing = [b.open(opened), b.close(0, opened + 15 * 10**9)]
        store.write(wire.Batch(stream_id="wrapper", seq=1, host=wire.Host(host_id="late-host"), job_events=closing))
        writer.job_events([("late-1", True)])
        wait_until(lambda: sink.written, "the summary at the close")
        for at in range(600, 3600 + 3 * 600, 600):  # each interval's due time, then past the hour
            barrier(writer, caplog, float(at), clock)
        assert sink.attempts == [0.0, 600.0, 1200.0, 1800.0, 2400.0, 3000.0, 3600.0]
        assert not any(s.fields["complete"] for s in sink.written)
    finally:
        writer.stop()
        store.close()
        host.close()


def test_the_due_table_takes_10000_jobs_and_names_the_one_it_cannot_take(tmp_path: Path, caplog: Any) -> None:
    """README: a job the full table (10,000 due jobs) cannot take is logged by id. The
    default writer, not started (nothing leaves the table): 10,000 jobs are due, the
    10,001st is dropped and named, and a job already due is never dropped by its next event."""
    writer = SummaryWriter(SqliteStore(tmp_path / "t.db"), FlakySink(failures=0))
    try:
        writer.job_events((f"job-{i}", False) for i in range(10_000))
        writer.job_events([("job-0", True), ("job-10000", False)])
        assert writer.pending() == 10_000 and writer.dropped == 1
        assert [r.getMessage() for r in caplog.records if "not summarised now" in r.getMessage()] == [
            "job summaries: 10000 jobs already due; job-10000 not summarised now (its next event or "
            "`wattline report` has its figures)"
        ]
    finally:
        writer.reader.close()  # type: ignore[attr-defined]
