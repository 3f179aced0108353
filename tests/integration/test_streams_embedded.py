"""Two ``wattline run`` at once on one host, embedded (one SQLite store): each run samples the
whole host as its own stream. A joule is counted once: each job gets its equal share of the
node's energy where both ran, and A + B is the node's energy over the union of the windows.

The host is a powercap tree whose package-0 counter a thread advances at a known constant
power in real (wall-clock) time, so the truth of any window is ``power x length``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pipeline import equal_share_truth
from sysfs_trees import PowerAdvancer, Zone, powercap_tree
from waits import wait_until

from wattline.stores.factory import open_store

WATTLINE = [sys.executable, "-m", "wattline.cli.main"]
POWER_W = 40.0
HOST = "host-x"


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[PowerAdvancer]:
    """intel-rapl:0 advanced every ~1 ms: ``POWER_W x wall time``."""
    root = powercap_tree(tmp_path / "sys-root", [Zone("intel-rapl:0", "package-0", 0)])
    power = PowerAdvancer(root, {"intel-rapl:0": POWER_W}, period_s=0.001)
    yield power
    power.close()


def start_run(tmp_path: Path, tree: PowerAdvancer, job_id: str, seconds: float) -> subprocess.Popen[str]:
    args = ["run", "--job-id", job_id, "--host-id", HOST, "--source", "rapl", "--sysfs-root", str(tree.root)]
    args += ["--interval", "0.25", "--no-report", "--", "sleep", str(seconds)]
    env = {**os.environ, "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}"}
    return subprocess.Popen([*WATTLINE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def report(tmp_path: Path, job_id: str) -> dict[str, Any]:
    out = subprocess.run(
        # the streams are under test, not the jobs' CPU time (they sleep): the split by windows
        [*WATTLINE, "report", job_id, "--json", "--share-rule", "equal", "--store", f"sqlite:///{tmp_path / 'w.db'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def energy(r: dict[str, Any]) -> float:
    return float(r["warmup"]["energy_j"] + r["measured"]["energy_j"])


def opened(tmp_path: Path, job_id: str) -> bool:
    """``job_id``'s open is stored (no store is created here: its run makes it)."""
    if not (tmp_path / "w.db").exists():
        return False
    with open_store(f"sqlite:///{tmp_path / 'w.db'}") as store:
        return any(e.event == "open" for e in store.job_events(job_id))  # type: ignore[attr-defined]


def windows(tmp_path: Path, *job_ids: str) -> dict[str, tuple[int, int]]:
    """(open, close) of each job as stored, ns."""
    with open_store(f"sqlite:///{tmp_path / 'w.db'}") as store:
        out = {}
        for job_id in job_ids:
            times = {e.event: e.time_ns for e in store.job_events(job_id)}  # type: ignore[attr-defined]
            out[job_id] = (times["open"], times["close"])
    return out


def test_two_overlapping_embedded_runs_count_each_joule_once(tmp_path: Path, tree: PowerAdvancer) -> None:
    a = start_run(tmp_path, tree, "run-a", 6.0)
    wait_until(lambda: opened(tmp_path, "run-a"), "run-a's open stored")  # b opens while a runs
    b = start_run(tmp_path, tree, "run-b", 6.0)
    for proc in (a, b):
        _out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
    wins = windows(tmp_path, "run-a", "run-b")
    opens, closes = [o for o, _ in wins.values()], [c for _, c in wins.values()]
    assert max(opens) < min(closes), "the runs must overlap"  # the test's premise
    truth = equal_share_truth(wins, POWER_W)
    reports = {job: report(tmp_path, job) for job in wins}
    for job, r in reports.items():
        assert energy(r) == pytest.approx(truth[job], rel=0.01), job
        assert f"{HOST}: 2 streams overlapped in time (two agents under one host id?); counted once" in r["notes"]
        assert not any("restarted" in n for n in r["notes"])
    # A + B is the node's energy over the union of the windows (each joule once, none lost)
    union_j = POWER_W * (max(closes) - min(opens)) / 1e9
    assert sum(energy(r) for r in reports.values()) == pytest.approx(union_j, rel=0.01)
