"""A Slurm job's energy in Slurm's accounting (#45), on the real test cluster with slurmdbd
on Debian's MariaDB (tests/helpers/slurm_accounting.py): the collector writes a closed job's figures
to its AdminComment; ``sacct`` shows them. Truths: each node's known power x the job's
stored window (as tests/e2e/test_slurm.py), the units the script wrote, the counter the nodes'
RAPL trees are; the figure ``sacct`` shows is also compared with ``wattline report``'s.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import slurm_accounting
import slurm_cluster
from test_slurm import POWER_W, check_energy, closed, events, sbatch
from waits import wait_until

from wattline.reports.summaries.slurm_comment import AdminCommentWriter, run_command

WHY = slurm_cluster.missing() or slurm_accounting.missing()
pytestmark = pytest.mark.needs(WHY)


@pytest.fixture(scope="module")
def cluster() -> Iterator[slurm_cluster.Cluster]:
    running = slurm_cluster.start(POWER_W, accounting=True)
    yield running
    for agent in running.agents.values():  # nothing of theirs is read after the tests; a SIGTERM takes 5 s
        agent.kill9()
    running.stop()


def sacct_comment(cluster: slurm_cluster.Cluster, job: str) -> str:
    """The job's AdminComment as ``sacct -j ID -o JobID,AdminComment -P -n`` shows it."""
    rows = cluster.run("sacct", "-j", job, "-o", "JobID,AdminComment", "-P", "-n").stdout.splitlines()
    return next((row.partition("|")[2] for row in rows if row.partition("|")[0] == job), "")


def keys(comment: str) -> dict[str, str]:
    words = comment.split()
    assert words[0] == "wattline.energy/3", comment
    return dict(word.split("=", 1) for word in words[1:])


def truth_j(found: list[dict[str, Any]]) -> float:
    """Each host's power x its stored window (open to close)."""
    at = {(e["host"], e["event"]): e["time_ns"] for e in found if e["event"] in ("open", "close")}
    return sum(POWER_W[host] * (at[(host, "close")] - at[(host, "open")]) / 1e9 for host, kind in at if kind == "open")


def written(cluster: slurm_cluster.Cluster, job: str, report: dict[str, Any]) -> dict[str, str]:
    """The comment once it holds the report's whole-run energy (a one-host figure may come first)."""
    energy = report["whole_run"]["energy_j"]

    def now() -> dict[str, str] | None:
        text = sacct_comment(cluster, job)
        found = keys(text) if text else None
        return found if found and abs(float(found["energy_j"]) - energy) < 0.06 else None

    return wait_until(now, lambda: f"job {job}: AdminComment {sacct_comment(cluster, job)!r}, report {energy}", 20)


def as_nobody(cluster: slurm_cluster.Cluster, *argv: str, munge_ns: bool = False) -> subprocess.CompletedProcess[str]:
    """``argv`` run as nobody (neither root nor SlurmUser); ``munge_ns``: where sacctmgr reaches slurmdbd."""
    wrap = [f"{cluster.root}/bin/in-munge-ns"] if munge_ns else []
    user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    return subprocess.run(
        [*wrap, *user, *argv], capture_output=True, text=True, env=cluster.env, timeout=30, cwd="/tmp"
    )


def test_a_two_node_jobs_energy_in_sacct_and_its_user_cannot_change_it(cluster: slurm_cluster.Cluster) -> None:
    job = as_nobody(cluster, "sbatch", "--parsable", "-N", "2", "--wrap", "srun sleep 4").stdout.strip()
    assert job.isdigit(), job
    running = ["squeue", "-h", "-j", job, "-o", "%T"]
    wait_until(lambda: cluster.run(*running).stdout.strip() == "RUNNING", f"job {job} running")
    # while it runs (after it, Slurm says "Job has already finished" to anyone)
    refused = as_nobody(cluster, "scontrol", "update", f"JobId={job}", "AdminComment=wattline.energy/1 energy_j=1")
    assert refused.returncode != 0 and "denied" in refused.stderr, refused
    found = closed(cluster, job, hosts=2)
    report = check_energy(cluster, job, found)
    comment = written(cluster, job, report)
    truth = truth_j(found)
    assert float(comment["energy_j"]) == pytest.approx(truth, rel=0.01)
    assert "j_per_unit" not in comment and "unit" not in comment  # no units counted
    assert comment["hosts"] == "2"
    assert comment["quality"] == "counter"  # RAPL trees: counters only
    assert comment["accel_fraction"] == "0.000"  # no accelerator on these nodes
    assert comment["complete"] == "1"
    assert float(comment["bound_j"]) == pytest.approx(report["whole_run"]["energy_bound_j"], abs=0.06)
    forged = [
        "/usr/bin/sacctmgr",
        "-i",
        "modify",
        "job",
        "where",
        f"jobid={job}",
        "set",
        "AdminComment=wattline.energy/1 energy_j=1",
    ]
    refused = as_nobody(cluster, *forged, munge_ns=True)
    assert refused.returncode != 0 and "permission denied" in refused.stderr, refused
    assert keys(sacct_comment(cluster, job)) == comment


def test_a_controller_outage_during_the_write(cluster: slurm_cluster.Cluster) -> None:
    """slurmdbd stopped (SIGSTOP) while the job runs, slurmctld too once its close is stored:
    the job closes and its summary is written meanwhile, the writer's sacctmgr times out with a
    line; resumed, the comment is written, the job and nodes are as they were."""
    job = sbatch(cluster, "-w", "n1", "--wrap", 'echo "units 6" >> "$WATTLINE_EVENTS"; sleep 3')
    wait_until(lambda: any(e["event"] == "open" for e in events(cluster, job)), f"job {job} open")
    daemons = [int((cluster.root / f"{d}.pid").read_text().split()[0]) for d in ("slurmdbd", "slurmctld")]
    log = cluster.root / "log" / "collector.log"
    try:
        os.kill(daemons[0], signal.SIGSTOP)
        found = closed(cluster, job)
        os.kill(daemons[1], signal.SIGSTOP)
        report = check_energy(cluster, job, found)  # the store's job and figure, during the outage
        line = f"slurm job {job}: AdminComment not written yet (retried)"
        wait_until(lambda: line in log.read_text(), f"{line!r} in the collector's log", timeout_s=20)
    finally:
        for pid in daemons:
            os.kill(pid, signal.SIGCONT)
    comment = written(cluster, job, report)
    truth = truth_j(found)
    assert float(comment["energy_j"]) == pytest.approx(truth, rel=0.01)
    assert float(comment["j_per_unit"]) == pytest.approx(truth / 6, rel=0.01)
    assert comment["unit"] == "units" and comment["hosts"] == "1"
    assert [e["event"] for e in events(cluster, job)].count("close") == 1
    state = cluster.run("sacct", "-j", job, "-X", "-o", "State", "-P", "-n").stdout.split()
    assert state == ["COMPLETED"]
    nodes = cluster.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split()
    assert nodes == ["n1", "idle", "n2", "idle"]


def test_a_job_accounting_does_not_know_is_skipped_with_a_line(
    cluster: slurm_cluster.Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A job slurmdbd has no record of (a purged one): looked for twice, then one line."""
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    writer = AdminCommentWriter(run_command, sacctmgr=f"{cluster.root}/bin/sacctmgr", retry_s=0.1, not_found_tries=2)
    writer.start()
    try:
        with caplog.at_level(logging.WARNING):
            start = time.monotonic()
            writer.queue("999999", "wl", "wattline.energy/1 energy_j=1")
            wait_until(lambda: writer.skipped == 1, "job 999999 skipped")
    finally:
        writer.stop()
    assert writer.written == 0 and writer.pending() == 0
    assert time.monotonic() - start < 15
    lines = [r.getMessage() for r in caplog.records if "999999" in r.getMessage()]
    assert len(lines) == 1 and "skipped: not in Slurm's accounting after 2 looks" in lines[0], lines
