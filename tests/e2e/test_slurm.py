"""Slurm jobs measured without wrapping (issue #28), through a real Slurm 22.05: jobs go
through sbatch/srun on two emulated nodes whose hooks are deploy/slurm/'s; each node's
agent samples a powercap tree advanced at its own known power. The truth is that power x
each host's window from the stored open and close (never a figure of the report).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slurm_cluster
from waits import wait_until

pytestmark = pytest.mark.needs(slurm_cluster.missing())

POWER_W = {"n1": 30.0, "n2": 50.0}


@pytest.fixture(scope="module")
def cluster() -> Iterator[slurm_cluster.Cluster]:
    running = slurm_cluster.start(POWER_W)
    yield running
    running.stop()


def sbatch(cluster: slurm_cluster.Cluster, *args: str) -> str:
    return cluster.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]


def events(cluster: slurm_cluster.Cluster, job_id: str) -> list[dict[str, Any]]:
    with sqlite3.connect(cluster.db) as conn:
        rows = conn.execute(
            "SELECT host, event, time_ns, fields FROM job_events WHERE job_id = ?", (job_id,)
        ).fetchall()
    return [{"host": h, "event": e, "time_ns": t, **json.loads(f)} for h, e, t, f in rows]


def closed(cluster: slurm_cluster.Cluster, job_id: str, hosts: int = 1, timeout_s: float = 60) -> list[dict[str, Any]]:
    """The job's stored events once a close from ``hosts`` hosts arrived."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = events(cluster, job_id)
        if len({e["host"] for e in found if e["event"] == "close" and "abandoned" not in e}) >= hosts:
            return found
        time.sleep(0.5)
    raise AssertionError(f"job {job_id}: no close from {hosts} hosts: {events(cluster, job_id)}")


def wattline(cluster: slurm_cluster.Cluster, *args: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-m", "wattline.cli.main", *args, "--json", "--store", f"sqlite:///{cluster.db}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **cluster.env},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def check_energy(cluster: slurm_cluster.Cluster, job_id: str, found: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's energy per host within 1 % of that host's power x its stored window."""
    report = wattline(cluster, "report", job_id)
    window = {e["host"]: [e["time_ns"], 0] for e in found if e["event"] == "open"}
    for e in found:
        if e["event"] == "close" and "abandoned" not in e:
            window[e["host"]][1] = e["time_ns"]
    by_host: dict[str, float] = {}
    for part in ("warmup", "measured"):
        for row in report[part]["by_host"]:
            by_host[row["host"]] = by_host.get(row["host"], 0.0) + row["energy_j"]
    assert set(by_host) == set(window)
    for host, (start, end) in window.items():
        truth = POWER_W[host] * (end - start) / 1e9
        assert by_host[host] == pytest.approx(truth, rel=0.01), (host, by_host, truth)
    return dict(report)


def test_one_node_job_is_measured_with_its_user_and_partition(cluster: slurm_cluster.Cluster) -> None:
    job = sbatch(cluster, "-w", "n1", "-J", "one-node", "--wrap", "sleep 4")
    found = closed(cluster, job)
    report = check_energy(cluster, job, found)
    assert report["job"]["status_text"] == "ok (exit 0)"
    assert report["job"]["name"] == "one-node"
    assert report["job"]["labels"]["user"] == "root"
    assert report["job"]["labels"]["partition"] == "debug"
    assert report["job"]["hosts"] == ["n1"]


def test_a_job_on_two_nodes_is_one_job(cluster: slurm_cluster.Cluster) -> None:
    job = sbatch(cluster, "-N", "2", "--wrap", "srun sleep 5")  # 1 % of 5 s: see the array tasks
    found = closed(cluster, job, hosts=2)
    report = check_energy(cluster, job, found)
    assert sorted(report["job"]["hosts"]) == ["n1", "n2"]
    assert report["job"]["labels"]["nodes"] == "n[1-2]"


def test_exit_status_and_a_job_longer_than_the_lease(cluster: slurm_cluster.Cluster) -> None:
    """A 15 s job outlives the 9 s lease: only the agent's heartbeats for slurmd keep it running."""
    job = sbatch(cluster, "-w", "n2", "--wrap", "sleep 15; exit 3")
    opened = wait_until(
        lambda: next((e["time_ns"] for e in events(cluster, job) if e["event"] == "open"), None), f"job {job} open"
    )
    # time, not a state: the lease (9 s) runs out 1 s before this look, 5 s before the job ends
    time.sleep(max(0.0, opened / 1e9 + 10.0 - time.time()))
    rows = {r["id"]: r for r in wattline(cluster, "jobs", "--no-energy")}
    assert rows[job]["status"] == "running", rows[job]
    found = closed(cluster, job)
    assert any(e["event"] == "heartbeat" for e in found)
    report = check_energy(cluster, job, found)
    assert report["job"]["exit_code"] == 3
    assert report["job"]["status_text"] == "failed (exit 3)"


def test_scancel_says_so(cluster: slurm_cluster.Cluster) -> None:
    """22.05 shows a cancelled job COMPLETING to its epilog: the agent asks again afterwards and
    the close, sent again under its identity, says "cancelled" (one close stored)."""
    job = sbatch(cluster, "-w", "n1", "--wrap", "sleep 60")
    wait_until(lambda: any(e["event"] == "open" for e in events(cluster, job)), f"job {job} open")
    cluster.run("scancel", job)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        closes = [e for e in events(cluster, job) if e["event"] == "close"]
        if closes and closes[0].get("end_state"):
            break
        time.sleep(0.5)
    assert len(closes) == 1 and closes[0]["end_state"] == "cancelled", closes
    assert closes[0]["exit_code"] == 128 + 15
    report = check_energy(cluster, job, events(cluster, job))
    assert report["job"]["status_text"] == "cancelled (exit 143, SIGTERM)"
    rows = {r["id"]: r for r in wattline(cluster, "jobs", "--no-energy")}
    assert rows[job]["end_state"] == "cancelled"


def test_an_agent_killed_during_a_job(cluster: slurm_cluster.Cluster) -> None:
    """The node's agent is killed (SIGKILL) during a job and started again 3 s later: still one
    job, opened and closed by the hooks' notes, with its exit status; its energy is the node's
    power x the time the two agents' samples cover within the window (the gap between them is
    not measured, and the report says so)."""
    job = sbatch(cluster, "-w", "n2", "--wrap", "sleep 12; exit 4")
    wait_until(lambda: any(e["event"] == "open" for e in events(cluster, job)), f"job {job} open")
    time.sleep(1)  # time, not a state: the first agent samples a second of the job
    cluster.agents["n2"].kill9()
    time.sleep(3)
    cluster.restart_agent("n2")
    found = closed(cluster, job)
    window = [next(e["time_ns"] for e in found if e["event"] == kind) for kind in ("open", "close")]
    with sqlite3.connect(cluster.db) as conn:
        spans = conn.execute(
            "SELECT start_ns, time_ns, stream FROM energy WHERE host = 'n2' AND time_ns > ? AND start_ns < ?", window
        ).fetchall()
    assert len({stream for _, _, stream in spans}) == 2  # the killed agent's and the new one's
    covered_s = sum(min(end, window[1]) - max(start, window[0]) for start, end, _ in spans) / 1e9
    assert (window[1] - window[0]) / 1e9 - covered_s >= 2.5  # the agent was dead for 3 s
    report = wattline(cluster, "report", job)
    energy = sum(row["energy_j"] for part in ("warmup", "measured") for row in report[part]["by_host"])
    assert energy == pytest.approx(POWER_W["n2"] * covered_s, rel=0.01)
    assert report["job"]["exit_code"] == 4
    assert any("agent restarted during the job" in note for note in report["notes"]), report["notes"]


def test_array_tasks_are_jobs_of_their_own(cluster: slurm_cluster.Cluster) -> None:
    """Task 1 runs under the array's own id, task 2 under the next one (Slurm numbers them so)."""
    # one at a time: each has its node; 5 s each, so 1 % is 50 ms, beyond what a starved machine
    # moves an edge by (2 s jobs read 1.05 % off under two busy loops: the fake counter's thread late)
    first = sbatch(cluster, "--array=1-2%1", "--wrap", "sleep 5")
    tasks = {}
    for job in (first, str(int(first) + 1)):
        report = check_energy(cluster, job, closed(cluster, job))
        assert report["job"]["labels"]["array_job_id"] == first
        tasks[report["job"]["labels"]["array_task_id"]] = job
    assert sorted(tasks) == ["1", "2"]


def test_units_from_an_events_file_and_the_python_api(cluster: slurm_cluster.Cluster) -> None:
    script = (
        'echo "units 5 $(date +%s.%N)" >> "$WATTLINE_EVENTS"; sleep 1; '
        f"{sys.executable} -c 'from wattline import Job\n"
        'with Job("inside") as job:\n    job.add_units(7)\'; sleep 1'
    )
    job = sbatch(cluster, "-w", "n1", "--wrap", script)
    found = closed(cluster, job)
    assert sum(e["units"] for e in found if e["event"] == "units") == 12
    report = check_energy(cluster, job, found)
    assert report["whole_run"]["units"] == 12


def test_units_without_a_time_count_when_written(cluster: slurm_cluster.Cluster) -> None:
    """The agent reads an open job's events file as it grows: a line without a time counts when
    written (within 1 s), not at the epilog; the epilog sends none of them again."""
    marks = "/tmp/wl-units-marks"  # the script notes when it wrote each line: the truth
    script = (
        f'for n in 1 2 3; do sleep 2; echo "units $n" >> "$WATTLINE_EVENTS"; date +%s.%N >> {marks}.$SLURM_JOB_ID; done;'
        " sleep 3"
    )
    job = sbatch(cluster, "-w", "n2", "--wrap", script)
    found = closed(cluster, job)
    notes = Path(f"{marks}.{job}")
    written = [float(t) for t in notes.read_text().split()]
    notes.unlink()
    units = sorted((e["time_ns"] / 1e9, e["units"]) for e in found if e["event"] == "units")
    assert [u for _, u in units] == [1, 2, 3], units
    for (at, _), truth in zip(units, written, strict=True):
        assert abs(at - truth) <= 1.0, (units, written)


def test_the_python_api_counts_from_add_units_0(cluster: slurm_cluster.Cluster, tmp_path: Path) -> None:
    """Inside a Slurm job, ``add_units(0)`` 1 s in, ``mark_saturated()`` 1 s later, ``add_units(10)``
    1 s after that (tests/helpers/zero_units_workload.py; each instant known to its bracket): the 0
    reaches the store at its time through the job's events file, and half the units are
    saturated, not a third."""
    marks = tmp_path / "marks.json"
    workload = Path(__file__).parents[1] / "helpers" / "zero_units_workload.py"
    job = sbatch(cluster, "-w", "n1", "--wrap", f"{sys.executable} {workload} '' {marks}")
    found = closed(cluster, job)
    slack = 2_000  # the API's lines carry microseconds, read back through a float of seconds (0.24 us apart)
    at = json.loads(marks.read_text())
    (a, b), (c, d), (e, f) = ([t - slack, u + slack] for t, u in (at["zero"], at["mark"], at["ten"]))
    zero = [x["time_ns"] for x in found if x["event"] == "units" and x["units"] == 0]
    assert len(zero) == 1 and a <= zero[0] <= b, (zero, a, b)
    units = wattline(cluster, "report", job)["units"]
    assert 10 * (e - d) / (f - a) <= units["saturated"] <= 10 * (f - c) / (e - b), units
    assert units["total"] == 10
