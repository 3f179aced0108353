"""One odd counter never stops a host: a RAPL zone whose counter can wrap within the sampling
interval is named unusable (agent log, ``wattline sources``, a Prometheus metric, the sources
line of ``wattline run``) and gives no energy at all, while the other zone is sampled as usual.

Real processes on a sysfs tree whose counters advance at a known power in wall time: the odd
zone (``dram``) has a 27 J range, so at its plausible maximum (no power constraint: 1000 W x
1.5) it can wrap in 0.018 s, and at the 20 W it draws here it really wraps every 1.35 s.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import CLI, Proc, clean_env
from servers import free_port
from store_rows import energy_rows
from sysfs_trees import PowerAdvancer, Zone, powercap_tree

from wattline.collector.server import CollectorServer
from wattline.stores.factory import open_store
from wattline.stores.sqlite.store import SqliteStore

HOST = "odd-counter-host"
START_UJ = 10**6
PACKAGE_W, DRAM_W = 30.0, 20.0
#: 27 J: at 1500 W (the 1000 W default bound x 1.5) a wrap in 0.018 s.
ODD_RANGE_UJ = 27_000_000
ODD = "rapl package-0/dram (can wrap in 0.018 s)"
WHY = "its counter can wrap in 0.018 s (27 J range at up to 1500 W), within the {} s sampling interval; not sampled"


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    root = powercap_tree(
        tmp_path / "tree",
        [
            Zone("intel-rapl:0", "package-0", START_UJ),
            Zone("intel-rapl:0:2", "dram", START_UJ, max_energy_range_uj=ODD_RANGE_UJ),
        ],
    )
    counters = PowerAdvancer(root, {"intel-rapl:0": PACKAGE_W, "intel-rapl:0:2": DRAM_W}, START_UJ)
    yield root
    counters.close()


def rows(store: SqliteStore, device: str) -> list[dict[str, Any]]:
    return [r for r in energy_rows(store, HOST) if r["device"] == device]


def assert_power(found: list[dict[str, Any]], watts: float) -> None:
    """Joules over the samples match ``watts`` over the time they span (wall-time writes: 5 %)."""
    span_s = (found[-1]["time_ns"] - found[0]["start_ns"]) / 1e9
    assert span_s > 1.0
    assert sum(r["energy_j"] for r in found) == pytest.approx(watts * span_s, rel=0.05)
    assert all(r["healthy"] for r in found)


def test_embedded_run_samples_the_other_zone_and_names_the_odd_one(tmp_path: Path, tree: Path) -> None:
    db = tmp_path / "w.db"
    done = subprocess.run(
        [
            *(*CLI, "run", "--job-id", "odd", "--sysfs-root", str(tree), "--source", "rapl", "--host-id", HOST),
            *("--store", f"sqlite:///{db}", "--interval", "0.5", "--json", "--", "sleep", "3"),
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert (
        f"wattline: sources: measuring rapl; UNUSABLE at this interval, not sampled: {ODD} (-v for details)"
        in done.stderr.splitlines()
    )
    assert "dram" not in done.stdout  # no joule of the odd zone in any figure of the report
    with open_store(f"sqlite:///{db}") as store:
        assert isinstance(store, SqliteStore)
        assert rows(store, "package-0/dram") == []
        assert_power(rows(store, "package-0"), PACKAGE_W)


def test_agent_logs_and_exports_the_odd_zone_and_ships_the_other(tmp_path: Path, tree: Path) -> None:
    port = free_port()
    with open_store(f"sqlite:///{tmp_path / 'w.db'}") as store:
        assert isinstance(store, SqliteStore)
        server = CollectorServer(store, "127.0.0.1:0")
        server.start()
        agent = Proc(
            [
                *("agent", "--sysfs-root", str(tree), "--source", "rapl", "--host-id", HOST, "--spool-dir", "memory"),
                *("--collector", f"127.0.0.1:{server.port}", "--interval", "0.25", "--batch-interval", "0.2"),
                *("--prometheus-port", str(port)),
            ],
            tmp_path / "agent.log",
        )
        try:
            deadline = time.monotonic() + 30
            while len(rows(store, "package-0")) < 12:
                assert agent.alive() and time.monotonic() < deadline, agent.log()
                time.sleep(0.1)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                metrics = answer.read().decode()
            assert agent.terminate() == 0
        finally:
            agent.kill9()
            server.stop()
        assert rows(store, "package-0/dram") == []
        assert_power(rows(store, "package-0"), PACKAGE_W)
    labels = 'component="{}",device="{}",quality="counter",source="rapl"'
    assert f"wattline_channel_unusable{{{labels.format('dram', 'package-0/dram')}}} 1.0" in metrics
    assert f"wattline_channel_unusable{{{labels.format('cpu_package', 'package-0')}}} 0.0" in metrics
    # No energy, power or health series for the odd zone: it has no counter at all.
    assert [x for x in metrics.splitlines() if "package-0/dram" in x] == [
        f"wattline_channel_unusable{{{labels.format('dram', 'package-0/dram')}}} 1.0"
    ]
    log = agent.log()
    assert f"source rapl: dram package-0/dram unusable: {WHY.format(0.25)}" in log
    assert "Traceback" not in log


def test_sources_names_the_odd_zone_and_shows_the_other_ones_power(tree: Path) -> None:
    argv = [*CLI, "sources", "--sysfs-root", str(tree), "--source", "rapl", "--interval", "1", "--sample", "1"]
    done = subprocess.run([*argv, "--json"], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [rapl] = json.loads(done.stdout)
    channels = {ch["device"]: ch for ch in rapl["channels"]}
    assert channels["package-0"]["usable"] is True
    assert channels["package-0"]["power_w"] == pytest.approx(PACKAGE_W, rel=0.05)
    odd = channels["package-0/dram"]
    assert (odd["usable"], odd["power_w"], odd["healthy"]) == (False, None, False)
    assert odd["wrap_period_s"] == pytest.approx(0.018)
    assert odd["status"].startswith(WHY.format(1))

    table = subprocess.run([*argv, "--sample", "0"], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    [line] = [x for x in table.stdout.splitlines() if "package-0/dram" in x]
    assert f"UNUSABLE: {WHY.format(1)}" in line


def test_a_model_stands_in_when_the_package_itself_is_unusable(tmp_path: Path) -> None:
    root = powercap_tree(tmp_path / "tree", [Zone("intel-rapl:0", "package-0", 0, max_energy_range_uj=ODD_RANGE_UJ)])
    argv = [*CLI, "sources", "--sysfs-root", str(root), "--source", "rapl", "--source", "cpu_model", "--json"]
    done = subprocess.run([*argv, "--sample", "0"], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rapl, cpu_model = json.loads(done.stdout)
    assert (rapl["available"], rapl["reason"]) == (False, "every channel unusable at the 1 s interval")
    assert [ch["usable"] for ch in rapl["channels"]] == [False]
    assert cpu_model["available"], cpu_model["reason"]  # RAPL measures no CPU here: the model does not stand down
