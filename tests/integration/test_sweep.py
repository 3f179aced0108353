"""``wattline sweep`` (issue #32) on a workload whose energy per unit is known by construction.

``tests/helpers/sweep_workload.py`` draws WATTS on a RAPL zone advanced by
:class:`sysfs_trees.PowerAdvancer` and counts RATE units a second: each point's truth is
WATTS / RATE (from the grid, not from the code under test). The grid holds two settings of
equal truth (30 W at 100/s, 45 W at 150/s): never called different; the best (30 W at
150/s) leads the next by 50 %: real. Each run is alone on the host, whose power the workload
sets without using the CPU for it: the sweeps here are under ``--share-rule exclusive``,
which charges a job alone its host (by CPU time its share would follow what the machine
running the tests does, not the grid).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import CLI, clean_env, start_collector, start_rapl_agent
from schema_check import schema_errors
from servers import free_port
from sysfs_trees import PowerAdvancer, Zone, powercap_tree
from waits import wait_sampled

from wattline.stores.sqlite.store import SqliteStore

ZONE = "intel-rapl:0"
WORKLOAD = Path(__file__).parents[1] / "helpers" / "sweep_workload.py"
HOST = "sweep-host"
TRUTH = {("30", "100"): 0.3, ("30", "150"): 0.2, ("45", "100"): 0.45, ("45", "150"): 0.3}


@pytest.fixture
def host(tmp_path: Path) -> Iterator[PowerAdvancer]:
    """One RAPL package zone at 0 W until the workload's schedule says otherwise."""
    root = powercap_tree(tmp_path / "host", [Zone(ZONE, "package-0", 10**11)])
    # the counter is written every 2 ms: a reading is then up to 2 ms stale, and where the
    # saturation point falls inside a sample interval a stale counter adds power x staleness
    # (+0.3 % at the default 10 ms, over a 1.5 s window)
    powered = PowerAdvancer(root, {ZONE: 0.0}, 10**11, period_s=0.002, schedule=tmp_path / "schedule")
    yield powered
    powered.close()


def env_for(tmp_path: Path) -> dict[str, str]:
    return {
        **clean_env(),
        "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "COLUMNS": "200",
    }


def wattline(args: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """A command; a sweep under ``--share-rule exclusive`` (see the module doc)."""
    ruled = [args[0], "--share-rule", "exclusive", *args[1:]] if args[0] == "sweep" else args
    return subprocess.run([*CLI, *ruled], capture_output=True, text=True, timeout=timeout, env=env)


def check_truth(data: dict[str, Any], runs: int) -> None:
    """Every point's energy per unit within 1 % of its truth, every run counted; the true best first."""
    by = {(p["params"]["watts"], p["params"]["rate"]): p for p in data["points"]}
    assert set(by) == set(TRUTH)
    for key, truth in TRUTH.items():
        got = by[key]["j_per_unit"]
        print(key, f"{got['mean']:.5f} J vs truth {truth} ({100 * (got['mean'] / truth - 1):+.3f} %)", got["runs"])
        assert got["mean"] == pytest.approx(truth, rel=0.01)
        assert by[key]["runs_ok"] == runs
        assert by[key]["latency_s"]["mean"] == pytest.approx(1 / float(key[1]), rel=1e-9)
    assert (data["points"][0]["params"]["watts"], data["points"][0]["params"]["rate"]) == min(TRUTH, key=TRUTH.get)


def workload(tmp_path: Path, *tail: str) -> list[str]:
    """The constructed workload's command, its watts and rate from the grid."""
    return [sys.executable, str(WORKLOAD), str(tmp_path / "schedule"), ZONE, "{watts}", "{rate}", "1.5", "0.5", *tail]


def test_sweep_finds_the_true_best_and_never_splits_equal_settings(tmp_path: Path, host: PowerAdvancer) -> None:
    env = env_for(tmp_path)
    sampling = ["--sysfs-root", str(host.root), "--source", "rapl", "--interval", "0.25"]
    command = workload(tmp_path)
    outputs = ["--plot", str(tmp_path / "p.png"), "--html", str(tmp_path / "p.html"), "--csv", str(tmp_path / "p.csv")]
    out = wattline(
        ["sweep", "--param", "watts=30,45", "--param", "rate=100,150", "--units", "items", "--sla", "1000000/h",
         "--price", "2", "--json", *sampling, *outputs, "--", *command],
        env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)
    assert schema_errors("sweep", data) == []  # docs/schema/sweep.schema.json
    check_truth(data, runs=3)
    ranked = [(p["params"]["watts"], p["params"]["rate"]) for p in data["points"]]
    assert ranked[0] == ("30", "150")
    lead = data["points"][0]["advantage_over_next"]
    assert lead["real"] and lead["pct"] == pytest.approx(50, abs=2)
    # the two settings of equal truth sit next to each other: never different
    equal = data["points"][1]["advantage_over_next"]
    assert {ranked[1], ranked[2]} == {("30", "100"), ("45", "150")}
    assert not equal["real"] and equal["verdict"].startswith("within uncertainty"), equal
    assert [p["pareto"] for p in data["points"]] == [True, False, False, False]
    choices = {c["figure"]: c for c in data["choices"]}
    assert choices["energy per unit"]["params"] == {"watts": "30", "rate": "150"}
    assert choices["energy at the SLA"]["params"] == {"watts": "30", "rate": "150"}
    assert choices["cost at the SLA"]["params"]["rate"] == "150"  # the fewest instances
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    assert [(r["param_watts"], r["param_rate"]) for r in rows] == ranked
    assert (tmp_path / "p.png").stat().st_size > 10_000
    assert "<svg" in (tmp_path / "p.html").read_text()

    # every run is a job labelled with the sweep and its point; a resume runs nothing again
    listed = wattline(["jobs", "--no-energy", "--json", "--label", f"sweep={data['sweep']}"], env)
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 12
    only = wattline(["jobs", "--no-energy", "--json", "--label", "param.watts=45", "--label", "param.rate=100"], env)
    assert len(json.loads(only.stdout)) == 3
    again = wattline(["sweep", "--resume", data["sweep"], "--json", *sampling, "--sla", "1000000"], env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "12 runs done, reused" in again.stderr and "run 1/" not in again.stderr
    assert schema_errors("sweep", json.loads(again.stdout)) == []
    resumed = json.loads(again.stdout)["points"]
    assert [p["params"] for p in resumed] == [p["params"] for p in data["points"]]
    assert [p["latency_s"] for p in resumed] == [p["latency_s"] for p in data["points"]]  # kept, not re-run


def test_sweep_through_a_collector_and_a_host_agent(tmp_path: Path, host: PowerAdvancer) -> None:
    """The runs' events go to a `wattline collector` (SQLite store), the energy comes from a
    `wattline agent` sampling the host: the sweep reads each run's report from that store."""
    db = tmp_path / "fleet.db"
    port = free_port()
    collector = start_collector(port, ["--store", f"sqlite:///{db}"], tmp_path / "collector.log")
    started = time.time_ns()
    agent = start_rapl_agent(
        HOST, host.root, port, 0.5, tmp_path / "agent.log", env={"XDG_STATE_HOME": str(tmp_path / "agent-state")}
    )
    try:
        with SqliteStore(db) as store:  # the agent's first batches: samples before the first run opens
            wait_sampled(store, HOST, started)
        out = wattline(
            ["sweep", "--param", "watts=30,45", "--param", "rate=100,150", "--units", "items", "--repeat", "2",
             "--json", "--host-id", HOST, f"--collector=127.0.0.1:{port}", "--store", f"sqlite:///{db}",
             "--", *workload(tmp_path, "0.6")],  # the agent samples every 0.25 s
            env_for(tmp_path),
        )  # fmt: skip
    finally:
        agent.terminate()
        collector.terminate()
    assert out.returncode == 0, out.stderr[-3000:] + agent.log()[-2000:] + collector.log()[-2000:]
    check_truth(json.loads(out.stdout), runs=2)


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    for args, says in (
        (["--param", "batch", "--", "true"], "expected NAME=V1,V2"),
        (["--param", "batch=1,2", "--", "true"], "the command has no {batch}"),
        (["--param", "batch=1,2", "--", "echo", "{threads}"], "{threads}, which no --param names"),
        (["--param", "batch=1", "--sla", "fast", "--", "echo", "{batch}"], "option --sla"),
        (["--param", "batch=1", "--", "no-such-command-x", "{batch}"], "command not found"),
        (["--resume", "nope"], "no sweep of that id"),
    ):
        out = wattline(["sweep", *args], env, timeout=60)
        assert out.returncode in (2, 127), (args, out.returncode, out.stderr)
        assert says in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_failed_line_names_each_failed_point_its_statuses_and_runs() -> None:
    from wattline.sweep.analysis import RunFigures
    from wattline.sweep.command import failed_line
    from wattline.sweep.grid import Param, points
    from wattline.sweep.plan import Plan

    plan = Plan("s-2", [Param("b", ("1", "2", "3"))], ["cmd", "{b}"], repeat=3)
    one, two, three = points(plan.params)
    statuses = {one: (0, 3, 0), two: (0, 0, 0), three: (127, 1, 1)}
    runs = [RunFigures(p, k, f"j{k}", s) for p, ss in statuses.items() for k, s in enumerate(ss)]
    assert failed_line(plan, runs) == (
        "wattline sweep s-2: error: 2 points failed: b=1 (exit 3 in 1 of 3 runs); b=3 (exit 1, 127 in 3 of 3 runs); "
        "the other runs ran; run the failed ones again with: wattline sweep --resume s-2"
    )
    assert failed_line(plan, [r for r in runs if r.status == 0]) == ""
    # every run failed: no "other runs" to speak of
    lone = Plan("s-3", [Param("b", ("1",))], ["cmd", "{b}"], repeat=2)
    failed = [RunFigures(points(lone.params)[0], k, f"j{k}", 2) for k in range(2)]
    assert failed_line(lone, failed) == (
        "wattline sweep s-3: error: a point failed: b=1 (exit 2 in 2 of 2 runs); "
        "run the failed ones again with: wattline sweep --resume s-3"
    )
