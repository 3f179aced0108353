"""A service measured as it serves (issue #44's end-to-end case): the reference LayoutLM served
over HTTP under ``wattline run --metrics``, a load stepping through 25, 50 and 100 % of the
capacity measured first, a powercap zone whose power follows the load, and the server restarted
(by the supervisor the command is) in the middle of the 50 % step.

The truths are the test's: the requests the load generator had answered in each step, and the
energy of the power it set (idle between steps, ``IDLE_W + W_PER_RPS x`` the step's rate during
it) over each window. Each step is a window from the middle of the quiet gap before it to the
middle of the gap after it; the gaps last three scrape intervals, so an idle scrape lies in each
on both sides of its middle and no units event crosses an edge, and the power steps sit more
than a sampling interval from the edges, so no sample straddling an edge changes power.
``wattline report SVC --from --to`` must give each window its requests exactly (none lost or
doubled by the restart), and J per request within 1 % of the truth and within its bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from procs import CLI, clean_env
from served_layoutlm import SERVE
from servers import free_port, http
from sysfs_trees import PowerAdvancer, Zone, powercap_tree, step_power
from waits import wait_until

from wattline.reference.stepped_load import Step, measure_capacity, run_steps

HERE = Path(__file__).parents[1]  # tests/
ZONE = "intel-rapl:0"
IDLE_W, W_PER_RPS = 20.0, 0.2
SCRAPE_S, INTERVAL_S = 0.2, 0.25
LOADS = (0.25, 0.5, 1.0)
STEP_S = 3.0
COUNT = 'requests=layoutlm_requests_total{outcome="ok"}'


def health(port: int) -> str | None:
    try:
        status, body = http("GET", f"http://127.0.0.1:{port}/health", timeout_s=5)
    except OSError:
        return None
    return str(json.loads(body)["status"]) if body.startswith(b"{") else f"HTTP {status}"


def energy_between(steps: list[tuple[int, float]], a_ns: int, b_ns: int) -> float:
    """Joules of a power schedule ``[(from ns, watts), ...]`` between two instants."""
    ends = [t for t, _ in steps[1:]] + [b_ns]
    return sum(w * max(0, min(end, b_ns) - max(t, a_ns)) / 1e9 for (t, w), end in zip(steps, ends, strict=True))


def test_j_per_request_in_each_load_window_with_a_restart_in_the_middle(tmp_path: Path) -> None:
    root = powercap_tree(tmp_path / "host", [Zone(ZONE, "package-0")])
    schedule = tmp_path / "schedule"
    power = [(step_power(schedule, ZONE, IDLE_W), IDLE_W)]
    advancer = PowerAdvancer(root, {ZONE: IDLE_W}, schedule=schedule, period_s=0.005)
    port = free_port()
    store = f"sqlite:///{tmp_path / 'w.db'}"
    pidfile = tmp_path / "supervisor.pid"
    serve = [*CLI, *SERVE, "--host", "127.0.0.1", "--port", str(port), "--linger", "1.5"]
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as log:
        wrapper = subprocess.Popen(
            [*CLI, "run", "--job-id", "svc", "--store", store, "--no-report", "--share-rule", "exclusive",
             "--sysfs-root", str(root), "--source", "rapl", "--interval", str(INTERVAL_S),
             "--metrics", f"http://127.0.0.1:{port}/metrics", "--count", COUNT, "--scrape-every", f"{SCRAPE_S}s",
             "--service", "--", *CLI[:1], str(HERE / "helpers" / "served_supervisor.py"), str(pidfile), *serve],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=clean_env(),
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}/infer"
    edges: list[int] = []
    try:
        wait_until(lambda: health(port) == "serving", lambda: log_path.read_text()[-3000:], timeout_s=90)
        capacity = measure_capacity(url, step_seconds=1.0, max_concurrency=8).rps
        steps = [Step(load * capacity, STEP_S) for load in LOADS]
        restarted = threading.Event()

        def restart_midway() -> None:
            time.sleep(STEP_S / 2)
            os.kill(int(pidfile.read_text()), signal.SIGUSR1)
            wait_until(lambda: health(port) != "serving", "the first server stopping")
            wait_until(lambda: health(port) == "serving", "the second server serving", timeout_s=90)
            restarted.set()

        def on_edge(index: int) -> None:
            if index:
                power.append((step_power(schedule, ZONE, IDLE_W), IDLE_W))  # the step's load has ended
            if index == 1:
                threading.Thread(target=restart_midway, daemon=True).start()
            if index == 2:
                assert restarted.wait(120), "the server did not come back"
            time.sleep(1.5 * SCRAPE_S)
            edges.append(time.time_ns())
            time.sleep(1.5 * SCRAPE_S)
            if index < len(steps):
                watts = IDLE_W + W_PER_RPS * steps[index].rate_rps
                power.append((step_power(schedule, ZONE, watts), watts))

        windows = run_steps(url, steps, seed=11, on_edge=on_edge)
        time.sleep(2 * INTERVAL_S)  # a sample after the last edge
    finally:
        wrapper.send_signal(signal.SIGTERM)
        status = wrapper.wait(timeout=60)
        advancer.close()
    out = log_path.read_text()
    assert status == 0, out[-3000:]
    assert "supervisor: restarting" in out and windows[1].errors, (windows[1], out[-2000:])
    for i, window in enumerate(windows):
        a, b = edges[i], edges[i + 1]
        truth_j = energy_between(power, a, b)
        truth = truth_j / window.answered
        report = subprocess.run(
            [*CLI, "report", "svc", "--json", "--store", store, "--share-rule", "exclusive",
             "--from", repr(a / 1e9), "--to", repr(b / 1e9)],
            capture_output=True, text=True, timeout=60, env=clean_env(),
        )  # fmt: skip
        assert report.returncode == 0, report.stderr
        r: dict[str, Any] = json.loads(report.stdout)
        whole = r["whole_run"]
        print(
            f"step {i} ({LOADS[i]:.0%}): {window.answered} answered, {whole['units']:.3f} counted; "
            f"{whole['j_per_unit']:.5f} J/request ± {whole['j_per_unit_bound']:.5f}, truth {truth:.5f} "
            f"({100 * (whole['j_per_unit'] / truth - 1):+.3f} %)"
        )
        assert r["window"]["units_bound"] == 0.0 and r["job"]["service"] is True
        assert whole["units"] == pytest.approx(window.answered, abs=1e-6)
        assert whole["j_per_unit"] == pytest.approx(truth, rel=0.01)
        assert abs(whole["j_per_unit"] - truth) <= whole["j_per_unit_bound"]
        assert abs(whole["energy_j"] - truth_j) <= whole["energy_bound_j"]
        # and no wider than the two edge samples' energy (the edges lie where the zone idles)
        assert whole["energy_bound_j"] <= 2 * IDLE_W * INTERVAL_S
