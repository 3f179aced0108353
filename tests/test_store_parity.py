"""Every store answers the same (issue #30): one collector writes the same agents' data to
SQLite and to VictoriaMetrics at once, and ``wattline report --json`` and ``wattline jobs
--json`` read the same figures back from both (relative 1e-9).

Truth as elsewhere: a RAPL tree advanced at a known power, a real agent, jobs through
``wattline run --collector``; the messy cases: two runs overlapping, units at one instant
(two lines of output at once), a wrapper killed with SIGKILL (the agent closes its job for
the dead holder).
"""

from __future__ import annotations

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
from servers import VictoriaMetrics, http

from wattline import wire
from wattline.collector.server import CollectorServer
from wattline.collector.stores.base import Store, WriteResult
from wattline.collector.stores.sqlite import SqliteStore
from wattline.collector.stores.victoria import VictoriaStore
from wattline.workloads.jobs_view import JobNotFound, build_view
from wattline.workloads.reading import open_reader

from sysfs_trees import PowerAdvancer, Zone, powercap_tree  # isort: skip

START_UJ = 10**11
POWER_W = {"intel-rapl:0": 40.0, "intel-rapl:0:1": 5.0}
HOST = "parity-host"
UNITS = r"done (\d+)"


class Tee(Store):
    """Writes every batch to both stores; acknowledged once both took it."""

    kind = "tee"
    max_concurrent_writes = 1

    def __init__(self, first: Store, second: Store) -> None:
        self.first, self.second = first, second

    def write(self, batch: wire.pb.Batch) -> WriteResult:
        result = self.first.write(batch)
        other = self.second.write(batch)
        assert (other.written, other.rejected) == (result.written, result.rejected), (result, other)
        return result


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


def wait_closed(store: SqliteStore, job_ids: Sequence[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if all(build_view(j, store.job_events(j)).closed for j in job_ids):
                return
        except JobNotFound:
            pass
        assert time.monotonic() < deadline, "jobs not closed"
        time.sleep(0.5)


@pytest.mark.servers
def test_sqlite_and_victoria_metrics_give_the_same_reports(tmp_path: Path, victoria_metrics: VictoriaMetrics) -> None:
    tree = powercap_tree(
        tmp_path / "host", [Zone("intel-rapl:0", "package-0", START_UJ), Zone("intel-rapl:0:1", "dram", START_UJ)]
    )
    powered = PowerAdvancer(tree, POWER_W, START_UJ)
    sqlite_path = tmp_path / "w.db"
    with SqliteStore(sqlite_path) as sqlite, VictoriaStore(victoria_metrics.url) as victoria:
        server = CollectorServer(Tee(sqlite, victoria), "127.0.0.1:0")
        server.start()
        env = {
            **clean_env(),
            "COLUMNS": "200",
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "WATTLINE_AGENT_EDGE_SOCKET": "off",
            "PARITY_COLLECTOR": f"127.0.0.1:{server.port}",
        }
        outbox = ["--outbox-dir", str(tmp_path / "state" / "wattline" / "outbox"), "--edge-socket", "off"]
        agent = start_rapl_agent(HOST, tree, server.port, 0.5, tmp_path / "agent.log", *outbox)
        try:
            time.sleep(1.5)
            steady = 'for i in 1 2 3 4 5 6; do echo "done 16"; sleep 0.4; done'
            burst = 'sleep 0.5; echo "done 5"; echo "done 7"; sleep 1; printf "done 3\\ndone 4\\n"; sleep 0.6'
            first = subprocess.Popen(run(env, "steady-1", steady), env=env, start_new_session=True)
            time.sleep(0.9)  # the second run overlaps the first
            second = subprocess.Popen(run(env, "burst-1", burst), env=env, start_new_session=True)
            killed = subprocess.Popen(run(env, "killed-1", "echo 'done 2'; sleep 60"), env=env, start_new_session=True)
            assert first.wait(60) == 0 and second.wait(60) == 0
            time.sleep(1.0)
            os.killpg(killed.pid, signal.SIGKILL)  # the wrapper and its command: nobody closes the job
            killed.wait(10)
            wait_closed(sqlite, ["steady-1", "burst-1", "killed-1"])
            time.sleep(2.0)  # the agent's last samples after the closes
        finally:
            agent.terminate()
            server.stop()
            powered.close()
        http("GET", victoria_metrics.url + "/internal/force_flush")
        time.sleep(1.0)
        with open_reader_of(victoria_metrics.url) as reader:
            assert reader.kind == "victoriametrics"

    reports = {}
    for store in (str(sqlite_path), victoria_metrics.url):
        listed = wattline(env, "jobs", "--json", "--store", store)
        assert listed.returncode == 0, listed.stderr
        rows = [r for r in json.loads(listed.stdout) if r["id"] in ("steady-1", "burst-1", "killed-1")]
        assert len(rows) == 3, listed.stdout
        for row in rows:
            row.pop("duration_s", None) if row["status"] == "running" else None
        per_job = {}
        for job_id in ("steady-1", "burst-1", "killed-1"):
            out = wattline(env, "report", job_id, "--json", "--store", store)
            assert out.returncode == 0, out.stderr
            per_job[job_id] = json.loads(out.stdout)
        reports[store] = (rows, per_job)
    (rows_a, jobs_a), (rows_b, jobs_b) = reports.values()
    assert same(rows_a, rows_b) == []
    for job_id in jobs_a:
        assert same(jobs_a[job_id], jobs_b[job_id], job_id) == []
    burst = jobs_a["burst-1"]
    assert burst["units"]["total"] == 19 and burst["job"]["exit_code"] == 0
    assert (
        jobs_a["killed-1"]["job"]["status"] in ("closed", "abandoned")
        and jobs_a["killed-1"]["job"]["exit_code"] is None
    )
    print({job: r["whole_run"]["energy_j"] for job, r in jobs_a.items()})


def open_reader_of(url: str) -> Any:
    from wattline.collector.settings import CollectorSettings

    return open_reader(CollectorSettings(store=url))
