"""Exact edges (issue #27): a job's energy at its open and close instants is read, not
apportioned from the samples straddling them.

A workload raises its power as its first act and lowers it as its last
(``tests/helpers/step_workload.py`` on a RAPL tree advanced by :class:`sysfs_trees.PowerAdvancer`,
0 W outside the workload). The truth is the power the workload set times the time between
its two steps, from the schedule it wrote; the report, at the default 1 Hz sampling, must
be within 0.2 % of it, its bound must hold the truth and stay under 0.2 % too. Both
embedded (``wattline run`` sampling itself) and through a real ``wattline agent`` and
collector (``wattline run --collector``, the agent ticking on request over its socket):
one told where its socket is, and agents started by hand with no socket setting and no
systemd, whose socket the wrappers find by the same rule (issue #42), also as another user.
The job is alone on its host and every report here is under ``--share-rule exclusive``, which
charges such a job the host: the edges are under test, not the split by CPU time
(tests/unit/test_cpu_*.py, tests/integration/test_run_cpu_shares.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import CLI, Proc, clean_env, start_collector
from servers import free_port
from sysfs_trees import PowerAdvancer, Zone, powercap_tree, step_power
from waits import wait_until

from wattline.agent.settings import AgentSettings
from wattline.jobs.wrappers.embedded import embedded_session
from wattline.jobs.wrappers.job import Job
from wattline.reports.model import ReportSettings

ZONE = "intel-rapl:0"
STEP_W = 80.0
START_UJ = 10**11
SECONDS = 3.75
HOST = "edge-host"
WORKLOAD = Path(__file__).parents[1] / "helpers" / "step_workload.py"
#: The job is alone on its host: it is charged the host (see the module doc).
ALONE = ["--share-rule", "exclusive"]
#: A user other than the agent's, for the wrapper (the usual case: agent as root, jobs as users).
NOBODY = 65534


@pytest.fixture
def stepped(tmp_path: Path) -> Iterator[PowerAdvancer]:
    """One RAPL package zone at 0 W until the workload's schedule says otherwise."""
    root = powercap_tree(tmp_path / "host", [Zone("intel-rapl:0", "package-0", START_UJ)])
    powered = PowerAdvancer(root, {ZONE: 0.0}, START_UJ, schedule=tmp_path / "schedule")
    yield powered
    powered.close()


def truth_j(schedule: Path) -> float:
    """STEP_W x the time between the workload's two steps, from the lines it wrote."""
    (_, up, t_up), (_, down, t_down) = (line.split() for line in schedule.read_text().splitlines())
    assert float(up) == STEP_W and float(down) == 0.0
    return STEP_W * (int(t_down) - int(t_up)) / 1e9


def workload(schedule: Path) -> list[str]:
    return ["--", sys.executable, str(WORKLOAD), str(schedule), ZONE, str(STEP_W), str(SECONDS)]


def check(report: dict[str, Any], truth: float) -> None:
    """Within 0.2 % of the truth, the bound holds it and is no wider than 0.2 %."""
    whole = report["whole_run"]
    energy, bound = float(whole["energy_j"]), float(whole["energy_bound_j"])
    print(f"energy {energy:.3f} J, truth {truth:.3f} J ({100 * (energy / truth - 1):+.3f} %), bound ± {bound:.3f} J")
    assert energy == pytest.approx(truth, rel=0.002)
    assert abs(energy - truth) <= bound
    assert bound <= 0.002 * truth


def test_embedded_run_reads_the_energy_at_its_edges(tmp_path: Path, stepped: PowerAdvancer) -> None:
    env = {**clean_env(), "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}", "COLUMNS": "200"}
    sampling = ["--sysfs-root", str(stepped.root), "--source", "rapl", "--interval", "1"]
    out = subprocess.run(
        [*CLI, "run", "--job-id", "step", "--host-id", HOST, "--json", *ALONE, *sampling, *workload(tmp_path / "schedule")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    check(json.loads(out.stdout), truth_j(tmp_path / "schedule"))


def test_job_api_on_a_running_session_reads_the_energy_at_its_edges(tmp_path: Path, stepped: PowerAdvancer) -> None:
    """An embedded session that samples before the job opens (the program loads its model
    first): the job's open falls inside a sample, not on a tick of the session's start."""
    store = f"sqlite:///{tmp_path / 'w.db'}"
    settings = AgentSettings(host_id=HOST, sysfs_root=stepped.root, sources=["rapl"], interval=1.0)
    session = embedded_session(store, settings)
    time.sleep(1.5)  # half-way between two ticks
    schedule = tmp_path / "schedule"
    with Job("step", job_id="step-api", sink=session, store=store) as job:
        step_power(schedule, ZONE, STEP_W)
        time.sleep(SECONDS)
        step_power(schedule, ZONE, 0.0)
        time.sleep(0.05)  # the fake counter is rewritten every 10 ms: let it show the step first
    check(job.report(ReportSettings(share_rule="exclusive")).to_dict(), truth_j(schedule))


def test_run_through_an_agent_reads_the_energy_at_its_edges(tmp_path: Path, stepped: PowerAdvancer) -> None:
    """A real agent (1 Hz) and collector; `wattline run --collector` asks the agent to tick
    at the job's open and close over the agent's socket."""
    sock = tmp_path / "edge.sock"
    store = f"sqlite:///{tmp_path / 'w.db'}"
    port = free_port()
    collector = start_collector(port, ["--store", store], tmp_path / "collector.log")
    agent = Proc(
        ["agent", "--host-id", HOST, "--sysfs-root", str(stepped.root), "--source", "rapl", "--interval", "1",
         "--batch-interval", "0.5", f"--collector=127.0.0.1:{port}", "--edge-socket", str(sock)],
        tmp_path / "agent.log",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert agent.alive() and time.monotonic() < deadline, agent.log()[-3000:]
            time.sleep(0.05)
        time.sleep(1.5)  # the job opens half-way between two of the agent's ticks
        env = {**clean_env(), "WATTLINE_AGENT_EDGE_SOCKET": str(sock), "WATTLINE_AGENT_BATCH_INTERVAL": "0.5"}
        out = subprocess.run(
            [*CLI, "run", "--job-id", "step-agent", "--host-id", HOST, "--collector", f"127.0.0.1:{port}",
             "--store", store, "--json", *ALONE, *workload(tmp_path / "schedule")],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        check(json.loads(out.stdout), truth_j(tmp_path / "schedule"))
    finally:
        agent.terminate()
        collector.terminate()


@contextlib.contextmanager
def agent_by_hand(work: Path, tree: Path, runtime: Path) -> Iterator[tuple[int, str, Proc]]:
    """A collector into SQLite and a 1 Hz agent started as an operator would by hand: no
    systemd (no $RUNTIME_DIRECTORY), no socket setting, ``runtime`` its $XDG_RUNTIME_DIR;
    (collector port, store URL, agent) once the agent says it samples."""
    store = f"sqlite:///{work / 'w.db'}"
    port = free_port()
    collector = start_collector(port, ["--store", store], work / "collector.log")
    agent = Proc(
        ["agent", "--host-id", HOST, "--sysfs-root", str(tree), "--source", "rapl", "--interval", "1",
         "--batch-interval", "0.5", f"--collector=127.0.0.1:{port}"],
        work / "agent.log", env={"XDG_RUNTIME_DIR": str(runtime)},
    )  # fmt: skip
    try:
        wait_until(lambda: "sampling every" in agent.log(), lambda: agent.log()[-3000:], timeout_s=30)
        time.sleep(1.5)  # the job opens half-way between two of the agent's ticks
        yield port, store, agent
    finally:
        agent.terminate()
        collector.terminate()


def served_where(agent: Proc, tree: Path, runtime: Path) -> None:
    """The agent said where it serves: root's folder under its root (made 0755, every user may
    ask), any other user's under $XDG_RUNTIME_DIR (made 0700); the socket is gone once it stopped."""
    folder, mode = (tree / "run/wattline", 0o755) if os.geteuid() == 0 else (runtime / "wattline", 0o700)
    assert f"ticking at jobs' edges on request at {folder / 'edge.sock'}" in agent.log()
    assert stat.S_IMODE(folder.stat().st_mode) == mode
    assert agent.terminate() == 0 and not (folder / "edge.sock").exists()


def test_an_agent_started_by_hand_serves_the_edges_by_default(tmp_path: Path, stepped: PowerAdvancer) -> None:
    """No systemd, no ``edge_socket``: the agent serves its socket where the rule puts it,
    and `wattline run --collector` (same user, same rule) finds it: the job's edges are read.
    Before issue #42 the agent served none here and the figure was -2.8 % off."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    with agent_by_hand(tmp_path, stepped.root, runtime) as (port, store, agent):
        out = subprocess.run(
            [*CLI, "run", "--job-id", "step-by-hand", "--host-id", HOST, "--collector", f"127.0.0.1:{port}",
             "--sysfs-root", str(stepped.root), "--store", store, "--json", *ALONE, *workload(tmp_path / "schedule")],
            capture_output=True, text=True, timeout=60,
            env={**clean_env(), "XDG_RUNTIME_DIR": str(runtime), "WATTLINE_AGENT_BATCH_INTERVAL": "0.5"},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        check(json.loads(out.stdout), truth_j(tmp_path / "schedule"))
        served_where(agent, stepped.root, runtime)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the wrapper as another user: needs root")
def test_another_users_run_finds_a_root_agents_socket(tmp_path: Path) -> None:
    """The agent as root, the job as user nobody with a $XDG_RUNTIME_DIR of its own (asked
    first, nobody serves there): the wrapper goes on to root's folder and the edges are read."""
    try:
        probe = subprocess.run([sys.executable, "-c", "import wattline"], env=clean_env(), user=NOBODY).returncode
    except OSError:  # e.g. an interpreter under /root (mode 0700)
        probe = -1
    if probe != 0:
        pytest.skip(f"user {NOBODY} cannot run {sys.executable} with wattline")
    shared = Path(tempfile.mkdtemp(prefix="wattline-edges-"))  # pytest's own tmp is root's alone
    try:
        shared.chmod(0o755)
        tree = powercap_tree(shared / "host", [Zone(ZONE, "package-0", START_UJ)])
        user = shared / "user"  # what the job's user writes: its runtime and state, the schedule
        for folder in (user, user / "runtime", user / "state"):
            folder.mkdir(mode=0o700)
            os.chown(folder, NOBODY, NOBODY)
        schedule = user / "schedule"
        powered = PowerAdvancer(tree, {ZONE: 0.0}, START_UJ, schedule=schedule)
        try:
            with agent_by_hand(tmp_path, tree, tmp_path) as (port, store, _agent):
                env = {
                    **clean_env(),
                    "XDG_RUNTIME_DIR": str(user / "runtime"),
                    "XDG_STATE_HOME": str(user / "state"),
                    "XDG_DATA_HOME": str(user / "state"),
                    "HOME": str(user),
                    "WATTLINE_AGENT_BATCH_INTERVAL": "0.5",
                }
                out = subprocess.run(
                    [*CLI, "run", "--job-id", "step-user", "--host-id", HOST, "--collector", f"127.0.0.1:{port}",
                     "--sysfs-root", str(tree), "--no-report", *workload(schedule)],
                    capture_output=True, text=True, timeout=60, env=env, user=NOBODY, group=NOBODY, extra_groups=[],
                )  # fmt: skip
                assert out.returncode == 0, out.stderr[-3000:]
                report = wait_until(lambda: completed(store, "step-user"), "the job's report complete")
        finally:
            powered.close()
        check(report, truth_j(schedule))
    finally:
        shutil.rmtree(shared)


def completed(store: str, job_id: str) -> dict[str, Any] | None:
    """The job's report once the store holds all it needs (the samples past its close)."""
    done = subprocess.run(
        [*CLI, "report", job_id, "--store", store, "--json", *ALONE],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    report = json.loads(done.stdout) if done.returncode == 0 else None
    return report if report and report["complete"] else None
