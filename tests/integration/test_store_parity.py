"""Every store answers the same (issue #30): one collector writes the same agents' data to
SQLite, InfluxDB 1.x, VictoriaMetrics and Prometheus (remote write) at once, and ``wattline
report --json``, ``wattline jobs --json``, ``wattline compare --json`` and ``wattline export
--csv -`` read the same figures back from all four (relative 1e-9).

Truth as elsewhere: a RAPL tree advanced at a known power, a real agent, jobs through
``wattline run --collector``; the messy cases: two runs overlapping, units at one instant
(two lines of output at once), a wrapper killed with SIGKILL (the agent closes its job for
the dead holder).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from procs import CLI, clean_env, start_rapl_agent
from servers import Daemon, Influxd, VictoriaMetrics, searchable
from waits import wait_sampled, wait_until

from wattline import wire
from wattline.collector.server import CollectorServer
from wattline.jobs.jobs_view import JobNotFound, build_view
from wattline.reports.summaries.reading import open_reader
from wattline.stores.base import Store, WriteResult
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.prometheus.store import PrometheusStore
from wattline.stores.reader import Reader
from wattline.stores.sqlite.store import SqliteStore
from wattline.stores.victoria.store import VictoriaStore

from sysfs_trees import PowerAdvancer, Zone, powercap_tree  # isort: skip

START_UJ = 10**11
POWER_W = {"intel-rapl:0": 40.0, "intel-rapl:0:1": 5.0}
HOST = "parity-host"
UNITS = r"done (\d+)"


class Tee(Store):
    """Writes every batch to every store; acknowledged once all took it, each the same way."""

    kind = "tee"
    max_concurrent_writes = 1

    def __init__(self, *stores: Store) -> None:
        self.stores = stores

    def write(self, batch: wire.pb.Batch) -> WriteResult:
        first, *others = [store.write(batch) for store in self.stores]
        for other in others:
            assert (other.written, other.rejected) == (first.written, first.rejected), (first, other)
        return first


def wattline(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)


def same(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON documents differ (numbers to relative 1e-9)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [d for k in keys for d in same(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in same(x, y, f"{path}[{i}]")]
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def run(env: dict[str, str], job_id: str, script: str, *extra: str) -> list[str]:
    return [
        *CLI, "run", "--job", job_id.split("-")[0], "--job-id", job_id, "--kind", "inference", "--units", "documents",
        "--host-id", HOST, "--collector", env["PARITY_COLLECTOR"], "--units-from-stdout", UNITS,
        "--saturated-after", "1s", "--no-report", *extra, "--", "sh", "-c", script,
    ]  # fmt: skip


def wait_closed(store: SqliteStore, job_ids: Sequence[str]) -> None:
    def closed() -> bool:
        try:
            return all(build_view(j, store.job_events(j)).closed for j in job_ids)
        except JobNotFound:
            return False

    wait_until(closed, f"{', '.join(job_ids)} closed")


def has_event(store: SqliteStore, job_id: str, kind: str) -> bool:
    return any(e.event == kind for e in store.job_events(job_id))


def shown_as_in(reader: Reader, sqlite: SqliteStore) -> bool:
    """``reader`` shows the jobs' events and the host's last samples that SQLite holds."""

    def last(store: Reader) -> dict[tuple[str, ...], int]:
        return {s.series: s.end_ns for s in store.last_before(HOST, time.time_ns())}

    return last(reader) == last(sqlite) and all(len(reader.job_events(j)) == len(sqlite.job_events(j)) for j in JOBS)


JOBS = ("steady-1", "burst-1", "killed-1")


@pytest.mark.servers
def test_sqlite_influxdb_victoria_metrics_and_prometheus_give_the_same_reports(
    tmp_path: Path, influxd: Influxd, victoria_metrics: VictoriaMetrics, prometheus: Daemon
) -> None:
    tree = powercap_tree(
        tmp_path / "host", [Zone("intel-rapl:0", "package-0", START_UJ), Zone("intel-rapl:0:1", "dram", START_UJ)]
    )
    powered = PowerAdvancer(tree, POWER_W, START_UJ)
    sqlite_path = tmp_path / "w.db"
    database = influxd.new_database()
    with (
        SqliteStore(sqlite_path) as sqlite,
        InfluxV1Store(influxd.url, database) as influx,
        VictoriaStore(victoria_metrics.url) as victoria,
        PrometheusStore(prometheus.url) as prom,
    ):
        server = CollectorServer(Tee(sqlite, influx, victoria, prom), "127.0.0.1:0")
        server.start()
        env = {
            **clean_env(),
            "COLUMNS": "200",
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "WATTLINE_AGENT_EDGE_SOCKET": "off",
            "PARITY_COLLECTOR": f"127.0.0.1:{server.port}",
        }
        outbox = ["--outbox-dir", str(tmp_path / "state" / "wattline" / "outbox"), "--edge-socket", "off"]
        started = time.time_ns()
        agent = start_rapl_agent(HOST, tree, server.port, 0.5, tmp_path / "agent.log", *outbox)
        try:
            wait_sampled(sqlite, HOST, started)  # the agent's first batches: samples before the jobs open
            steady = 'for i in 1 2 3 4 5 6; do echo "done 16"; sleep 0.4; done'
            burst = 'sleep 0.5; echo "done 5"; echo "done 7"; sleep 1; printf "done 3\\ndone 4\\n"; sleep 0.6'
            first = subprocess.Popen(run(env, "steady-1", steady), env=env, start_new_session=True)
            wait_until(lambda: has_event(sqlite, "steady-1", "open"), "steady-1 open")  # the second run overlaps it
            second = subprocess.Popen(run(env, "burst-1", burst, "--service"), env=env, start_new_session=True)
            killed = subprocess.Popen(run(env, "killed-1", "echo 'done 2'; sleep 60"), env=env, start_new_session=True)
            assert first.wait(60) == 0 and second.wait(60) == 0
            wait_until(lambda: has_event(sqlite, "killed-1", "open"), "killed-1 open")  # then killed while it runs
            os.killpg(killed.pid, signal.SIGKILL)  # the wrapper and its command: nobody closes the job
            killed.wait(10)
            wait_closed(sqlite, JOBS)
            closed = max(e.time_ns for j in JOBS for e in sqlite.job_events(j) if e.event == "close")
            wait_sampled(sqlite, HOST, closed)  # the agent's samples up to the last close
        finally:
            agent.terminate()
            server.stop()
            powered.close()

        def flushed() -> bool:  # the Tee wrote every batch to every store: VictoriaMetrics shows them
            searchable(victoria_metrics.url)
            return shown_as_in(victoria, sqlite)

        wait_until(flushed, "VictoriaMetrics shows what SQLite holds")
        for url, kind in ((victoria_metrics.url, "victoriametrics"), (prometheus.url, "prometheus")):
            with open_reader_of(url) as reader:
                assert reader.kind == kind

    stores = {
        "sqlite": ["--store", str(sqlite_path)],
        "influxdb": ["--store", influxd.url, "--influx-database", database],
        "victoriametrics": ["--store", victoria_metrics.url],
        "prometheus": ["--store", prometheus.url],
    }
    answers = {name: read_all(env, where) for name, where in stores.items()}
    truth = answers.pop("sqlite")
    for name, answer in answers.items():
        for what in truth:
            assert same(truth[what], answer[what], f"{name}:{what}") == []
    burst = truth["report burst-1"]
    assert burst["units"]["total"] == 19 and burst["job"]["exit_code"] == 0
    assert burst["job"]["service"] is True and truth["report steady-1"]["job"]["service"] is False
    assert truth["report killed-1"]["job"]["status"] in ("closed", "abandoned")
    assert truth["report killed-1"]["job"]["exit_code"] is None
    assert len(truth["export steady-1"]) > 4  # samples inside the window, from both zones
    print({job: truth[f"report {job}"]["whole_run"]["energy_j"] for job in JOBS})

    # Against the power set, not only SQLite: by rule "equal" the jobs' figures add up to the
    # host's energy over the union of their windows (their stored open and close), P x that time,
    # to the counters' lag (PowerAdvancer writes every 10 ms) at each end of each stretch of it.
    with SqliteStore(sqlite_path) as stored:
        windows = []
        for job in JOBS:
            times = {e.event: e.time_ns for e in stored.job_events(job) if e.event in ("open", "close")}
            windows.append((times["open"], times["close"]))
    union: list[list[int]] = []
    for a, b in sorted(windows):
        if union and a <= union[-1][1]:
            union[-1][1] = max(union[-1][1], b)
        else:
            union.append([a, b])
    power = sum(POWER_W.values())
    host_j = power * sum(b - a for a, b in union) / 1e9
    lag_j = 2 * len(union) * power * 0.01
    for name, where in stores.items():
        equal = [
            json.loads(ok(wattline(env, "report", job, "--json", "--share-rule", "equal", *where))) for job in JOBS
        ]
        total = sum(r["whole_run"]["energy_j"] for r in equal)
        assert total == pytest.approx(host_j, abs=lag_j), (name, total, host_j)


def read_all(env: dict[str, str], where: Sequence[str]) -> dict[str, Any]:
    """What `jobs`, `report`, `compare` and `export` print for the test's jobs from one store."""
    listed = json.loads(ok(wattline(env, "jobs", "--json", *where)))
    rows = [r for r in listed if r["id"] in JOBS]
    assert len(rows) == len(JOBS), listed
    for row in rows:
        if row["status"] == "running":
            row.pop("duration_s", None)  # grows with the reading's time
    answer: dict[str, Any] = {"jobs": rows}
    for job_id in JOBS:
        answer[f"report {job_id}"] = json.loads(ok(wattline(env, "report", job_id, "--json", *where)))
        exported = ok(wattline(env, "export", job_id, "--csv", "-", *where))
        answer[f"export {job_id}"] = [numbers(row) for row in csv.DictReader(io.StringIO(exported))]
    answer["compare"] = json.loads(ok(wattline(env, "compare", "steady-1", "burst-1", "--json", *where)))
    return answer


def ok(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, out.stderr
    return out.stdout


def numbers(row: dict[str, str]) -> dict[str, Any]:
    """A CSV row with its numbers as numbers (compared to 1e-9, not by their spelling)."""
    out: dict[str, Any] = {}
    for key, text in row.items():
        try:
            out[key] = float(text)
        except ValueError:
            out[key] = text
    return out


def open_reader_of(url: str) -> Any:
    from wattline.collector.settings import CollectorSettings

    return open_reader(CollectorSettings(store=url))
