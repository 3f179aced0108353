"""The report printed at job end is complete, or says what it lacks.

A real ``wattline agent`` (RAPL on a sysfs tree advanced at a known power) ships its samples
to a real collector every 2 s; ``wattline run --collector … --store …`` prints the report the
moment its command ends, when the agent has not shipped the last seconds yet. The report
printed then must match the same report built later (and the truth, power x time) within
1 %; and where the samples cannot arrive (the agent is gone) the report says "incomplete"
instead of printing a quiet shortfall. The job is alone on its host: every report here is
under ``--share-rule exclusive``, which charges it the host (completeness is under test, not
its CPU time: it sleeps).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from procs import CLI, Proc, clean_env, start_collector, start_rapl_agent
from servers import free_port
from test_faults import HOST, POWER_W, powered_host
from waits import wait_until

from wattline.agent.settings import AgentSettings
from wattline.reports.build import report_wait_s
from wattline.stores.reader import StoredJobEvent
from wattline.stores.sqlite.store import SqliteStore

TRUE_W = sum(POWER_W.values())  # package + dram: both are in the host's total
BATCH_S = 2.0


def wattline(*args: str, store: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**clean_env(), "WATTLINE_AGENT_BATCH_INTERVAL": str(BATCH_S), "COLUMNS": "200"}
    ruled = ["--share-rule", "exclusive"] if args[0] in ("report", "jobs", "run") else []
    return subprocess.run(
        [*CLI, args[0], "--store", store, *ruled, *args[1:]], capture_output=True, text=True, timeout=timeout, env=env
    )


def stored_events(store: str, job_id: str) -> list[StoredJobEvent]:
    with SqliteStore(store.removeprefix("sqlite:///")) as reader:
        return reader.job_events(job_id)


def stored_window(store: str, job_id: str) -> tuple[float, float]:
    """(open, close) in Unix s of a closed one-host job, from its stored events: the truth's window."""
    times = {e.event: e.time_ns / 1e9 for e in stored_events(store, job_id) if e.event in ("open", "close")}
    return times["open"], times["close"]


def measured(report: dict[str, Any]) -> tuple[float, float]:
    """(energy J, seconds) of the report's measured window."""
    return float(report["measured"]["energy_j"]), float(report["measured"]["seconds"])


def json_run(job: str, seconds: float, port: int, store: str, log_path: Path) -> Proc:
    """``wattline run --json`` of ``sleep seconds`` as job ``job`` (id ``job-1``) on HOST."""
    return Proc(
        ["run", "--job", job, "--job-id", f"{job}-1", "--host-id", HOST, "--collector", f"127.0.0.1:{port}",
         "--store", store, "--json", "--share-rule", "exclusive", "--", "sleep", str(seconds)],
        log_path,
    )  # fmt: skip


def printed_report(run: Proc) -> dict[str, Any]:
    """The JSON report a :func:`json_run` printed when its command ended."""
    log = run.log()
    return dict(json.loads(log[log.index("{") :]))


def test_report_at_job_end_waits_for_the_last_samples(tmp_path: Path) -> None:
    counters = powered_host(tmp_path)
    tree = counters.root
    store = f"sqlite:///{tmp_path / 'w.db'}"
    port = free_port()
    collector = start_collector(port, ["--store", store], tmp_path / "collector.log")
    # A job that starts before the host's agent does: its first seconds have no samples.
    early = json_run("early", 4, port, store, tmp_path / "early.log")
    wait_until(lambda: stored_events(store, "early-1"), "the early job's open stored")
    agent = start_rapl_agent(HOST, tree, port, BATCH_S, tmp_path / "agent.log")
    try:
        assert early.process.wait(timeout=60) == 0, early.log()
        first = printed_report(early)
        assert first["complete"] is False and list(first["samples_from"]) == [HOST]
        assert any(n.startswith(f"incomplete: {HOST}: samples only from") for n in first["notes"]), first["notes"]

        ran = wattline(
            "run", "--job", "tail", "--job-id", "tail-1", "--host-id", HOST, "--collector", f"127.0.0.1:{port}",
            "--json", "--", "sleep", "3.3", store=store,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        at_end = json.loads(ran.stdout)
        assert at_end["complete"] is True, at_end["notes"]
        assert not any(n.startswith("incomplete") for n in at_end["notes"])
        later = json.loads(wattline("report", "tail-1", "--json", store=store).stdout)
        energy_end, _seconds = measured(at_end)
        energy_later, _ = measured(later)
        assert abs(energy_end - energy_later) <= 0.01 * energy_later, (energy_end, energy_later)
        # the truth: the power the test set over the window its stored open and close give
        # (no saturation mark: the measured window is the whole job)
        opened, closed = stored_window(store, "tail-1")
        truth = TRUE_W * (closed - opened)
        assert abs(energy_end - truth) <= 0.01 * truth, (energy_end, truth)

        # The agent dies during a job: its last samples never come. The report says so, after
        # waiting the README's two batch intervals plus 3 s from the close, and no longer.
        job = json_run("cut", 3, port, store, tmp_path / "run.log")
        wait_until(lambda: stored_events(store, "cut-1"), "the cut job's open stored")
        time.sleep(1.5)  # the job's own run time: the agent dies in its middle
        agent.kill9()
        assert job.process.wait(timeout=60) == 0, job.log()
        exited = time.time()
        _opened, closed = stored_window(store, "cut-1")
        waited = exited - closed
        # Upper side, the README's promise: this agent's two batch intervals plus 3 s, plus
        # building the report and the exit (a loaded machine: 3 s slack). Lower side: it cannot
        # have given up before its deadline, which `wattline run` takes from the default batch
        # interval (1.5 s: 6 s, within the promise for this 2 s agent).
        assert report_wait_s(BATCH_S) == 2 * BATCH_S + 3
        deadline = report_wait_s(AgentSettings().batch_interval)
        assert deadline - 0.5 <= waited <= report_wait_s(BATCH_S) + 3.0, waited
        cut = printed_report(job)
        assert cut["complete"] is False
        assert list(cut["samples_up_to"]) == [HOST]
        assert any(n.startswith(f"incomplete: {HOST}: samples up to") for n in cut["notes"]), cut["notes"]
    finally:
        counters.close()
        agent.kill9()
        collector.terminate()
