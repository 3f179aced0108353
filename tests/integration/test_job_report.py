"""Results in Python: ``from wattline import Job, job_window`` and ``job.report()``,
embedded and with a collector, against ``wattline report`` and power x time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from procs import CLI, clean_env, start_collector, start_rapl_agent
from servers import free_port
from test_faults import HOST, POWER_W, powered_host
from waits import wait_sampled

from wattline import Job, job_window
from wattline.stores.sqlite.store import SqliteStore

SCRIPT = """
import json, sys, time
from wattline import Job, job_window
from wattline.reports.model import ReportSettings

@job_window("py-demo", kind="inference", units="documents", job_id="py-1", store=sys.argv[1], {extra})
def serve(job):
    for _ in range(30):
        time.sleep(0.1)
        job.add_units(2)
    return job

job = serve()
report = job.report(ReportSettings(share_rule=sys.argv[2]))
print(json.dumps({{"dict": report.to_dict(), "units": report.units_saturated + report.units_warmup,
                  "energy_j": report.saturated_window.energy_j, "seconds": report.saturated_window.seconds}}))
"""


def script(
    tmp_path: Path, store: str, extra: str = "", env: dict[str, str] | None = None, rule: str = "cpu-time"
) -> dict[str, Any]:
    path = tmp_path / "job_script.py"
    path.write_text(textwrap.dedent(SCRIPT.format(extra=extra)))
    out = subprocess.run(
        [sys.executable, str(path), store, rule],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean_env(), **(env or {})},
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def report_json(store: str, job_id: str, rule: str = "cpu-time") -> dict[str, Any]:
    out = subprocess.run(
        [*CLI, "report", job_id, "--json", "--store", store, "--share-rule", rule],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_job_report_embedded_equals_wattline_report(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'w.db'}"
    got = script(tmp_path, store)
    assert got["units"] == 60
    assert got["dict"] == report_json(store, "py-1")  # the same figures, field for field
    assert got["dict"]["job"]["closed"] and got["dict"]["complete"] is True
    assert got["energy_j"] == got["dict"]["measured"]["energy_j"] > 0


def test_job_report_with_a_collector_waits_for_the_agents_last_samples(tmp_path: Path) -> None:
    counters = powered_host(tmp_path)
    tree = counters.root
    store = f"sqlite:///{tmp_path / 'w.db'}"
    port = free_port()
    collector = start_collector(port, ["--store", store], tmp_path / "collector.log")
    started = time.time_ns()
    agent = start_rapl_agent(HOST, tree, port, 2, tmp_path / "agent.log")
    try:
        with SqliteStore(tmp_path / "w.db") as stored:  # the agent samples before the job opens
            wait_sampled(stored, HOST, started)
        env = {"WATTLINE_AGENT_HOST_ID": HOST, "WATTLINE_AGENT_BATCH_INTERVAL": "2"}
        # alone on its host, the job is charged the host (its waiting is under test, not its CPU time)
        got = script(tmp_path, store, f'collector="127.0.0.1:{port}"', env, rule="exclusive")
        # printed the moment the job ended, when the agent had not shipped its last 2 s yet
        assert got["dict"]["complete"] is True, got["dict"]["notes"]
        with SqliteStore(tmp_path / "w.db") as stored:  # the truth's window: the stored open and close
            times = {e.event: e.time_ns for e in stored.job_events("py-1") if e.event in ("open", "close")}
        true_j = sum(POWER_W.values()) * (times["close"] - times["open"]) / 1e9
        assert abs(got["energy_j"] - true_j) <= 0.01 * true_j, (got["energy_j"], true_j)
        assert got["dict"]["measured"]["energy_j"] == report_json(store, "py-1", "exclusive")["measured"]["energy_j"]
    finally:
        counters.close()
        agent.kill9()
        collector.terminate()


def test_report_is_refused_where_it_cannot_be_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f"sqlite:///{tmp_path / 'w.db'}"
    with Job("inside", store=store) as job, pytest.raises(RuntimeError, match="after the job's with-block"):
        job.report()
    monkeypatch.setenv("WATTLINE_EVENTS", str(tmp_path / "events"))
    monkeypatch.setenv("WATTLINE_JOB_ID", "parent-1")
    with Job("joined") as joined:
        joined.add_units(1)
    with pytest.raises(RuntimeError, match="wattline run"):
        joined.report()
    assert callable(job_window)
