"""Sources are found again while sampling: a RAPL zone that appears is sampled, one that
vanishes is reported (one log line) and the others go on; an interval every counter could
wrap twice in is refused at start.

Real processes: ``wattline agent`` (rediscovered on SIGHUP, well before its periodic one) streaming to an in-process
collector with SQLite, and ``wattline run`` embedded (periodic rediscovery), both on a sysfs
tree whose counters advance at a known power in wall time.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pipeline import T0_NS
from procs import CLI, Proc, clean_env
from store_rows import energy_rows
from sysfs_trees import PowerAdvancer, Zone, powercap_tree, set_energy, zone_dir
from waits import wait_until

from wattline.agent.clock import StampClock
from wattline.agent.registry import Discovery
from wattline.agent.sampler import VANISHED, Sampler
from wattline.collector.server import CollectorServer
from wattline.stores.factory import open_store
from wattline.stores.sqlite.store import SqliteStore

HOST = "rediscover-host"
START_UJ = 10**9


def samples(store: SqliteStore, device: str) -> list[dict[str, Any]]:
    return [r for r in energy_rows(store, HOST) if r["device"] == device]


def assert_power(rows: list[dict[str, Any]], watts: float) -> None:
    """Joules over the device's samples match ``watts`` over the time they span (wall-time writes: 5 %)."""
    span_s = (rows[-1]["time_ns"] - rows[0]["start_ns"]) / 1e9
    assert span_s > 0.5
    assert sum(r["energy_j"] for r in rows) == pytest.approx(watts * span_s, rel=0.05)
    assert all(r["healthy"] for r in rows)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with open_store(f"sqlite:///{tmp_path / 'w.db'}") as s:
        assert isinstance(s, SqliteStore)
        yield s


def test_agent_samples_a_zone_added_at_run_time_after_sighup_and_reports_a_vanished_one(
    tmp_path: Path, store: SqliteStore
) -> None:
    tree = powercap_tree(tmp_path / "tree", [Zone("intel-rapl:0", "package-0", START_UJ)])
    counters = PowerAdvancer(tree, start_uj=START_UJ)
    counters.add("intel-rapl:0", 40.0)
    server = CollectorServer(store, "127.0.0.1:0")
    server.start()
    agent = Proc(
        [
            *("agent", "--sysfs-root", str(tree), "--source", "rapl", "--host-id", HOST, "--spool-dir", "memory"),
            *("--collector", f"127.0.0.1:{server.port}", "--interval", "0.1", "--batch-interval", "0.2"),
        ],
        tmp_path / "agent.log",
    )
    try:
        wait_until(lambda: len(samples(store, "package-0")) >= 5, "package-0 samples")
        powercap_tree(tree, [Zone("intel-rapl:1", "package-1", START_UJ)])
        counters.add("intel-rapl:1", 25.0)
        added = time.time_ns()
        # the agent went on sampling for a second (its samples of package-0 are stored that far)
        wait_until(lambda: samples(store, "package-0")[-1]["time_ns"] > added + 10**9, "package-0 samples a second on")
        assert samples(store, "package-1") == []  # the periodic rediscovery is a minute away

        agent.process.send_signal(signal.SIGHUP)
        wait_until(lambda: len(samples(store, "package-1")) >= 15, "package-1 samples")
        assert agent.alive()
        assert_power(samples(store, "package-1"), 25.0)
        assert "rediscovery: rapl cpu_package package-1 appeared" in agent.log()

        counters.remove("intel-rapl:0")
        os.unlink(tree / "sys/class/powercap/intel-rapl:0")
        shutil.rmtree(zone_dir(tree, "intel-rapl:0"))
        agent.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "package-0 vanished" in agent.log(), "the vanished line")
        vanished_at = time.time_ns()
        agent.process.send_signal(signal.SIGHUP)  # a second rediscovery reports nothing new
        wait_until(
            lambda: samples(store, "package-1")[-1]["time_ns"] > vanished_at + 10**9, "samples after the vanishing"
        )
        assert agent.log().count("vanished") == 1
        assert "rediscovery: rapl cpu_package package-0 vanished; no longer read" in agent.log()
        last_package_0 = samples(store, "package-0")[-1]["time_ns"]
        assert last_package_0 < vanished_at
        assert_power(samples(store, "package-1"), 25.0)  # the other zone never missed a joule
        assert agent.terminate() == 0
    finally:
        agent.kill9()
        counters.close()
        server.stop()
    assert "Traceback" not in agent.log()


def test_embedded_run_rediscovers_periodically(tmp_path: Path, store: SqliteStore) -> None:
    tree = powercap_tree(tmp_path / "tree", [Zone("intel-rapl:0", "package-0", START_UJ)])
    counters = PowerAdvancer(tree, start_uj=START_UJ)
    counters.add("intel-rapl:0", 30.0)
    added = tmp_path / "added"
    # The command adds package-1 to the tree after 0.5 s and runs 3 s more.
    script = (
        "import sys, time; sys.path.insert(0, sys.argv[2]); from pathlib import Path; "
        "from sysfs_trees import Zone, powercap_tree; time.sleep(0.5); "
        f"powercap_tree(Path(sys.argv[1]), [Zone('intel-rapl:1', 'package-1', {START_UJ})]); "
        "Path(sys.argv[3]).touch(); time.sleep(3)"
    )
    env = {**clean_env(), "WATTLINE_AGENT_REDISCOVER_INTERVAL": "0.3"}
    proc = subprocess.Popen(
        [
            *(*CLI, "run", "--job-id", "j1", "--sysfs-root", str(tree), "--source", "rapl", "--host-id", HOST),
            *("--store", f"sqlite:///{tmp_path / 'w.db'}", "--interval", "0.1", "--no-report", "--"),
            *(sys.executable, "-c", script, str(tree), str(Path(__file__).parents[1] / "helpers"), str(added)),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(added.exists, "the zone to be added")
        counters.add("intel-rapl:1", 20.0)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        counters.close()
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    package_1 = samples(store, "package-1")
    assert len(package_1) >= 15, out
    assert_power(package_1, 20.0)
    assert_power(samples(store, "package-0"), 30.0)


AGENT = [*CLI, "agent", "--source", "rapl", "--collector", "127.0.0.1:9", "--spool-dir", "memory"]
LEAN_AGENT = [sys.executable, "-m", "wattline.agent", "--sources", "rapl", "--spool-dir", "memory"]


@pytest.mark.parametrize("entry", ["agent", "lean agent", "run"])
def test_interval_every_counter_could_wrap_twice_in_is_refused(tmp_path: Path, entry: str) -> None:
    """Nothing at all could be sampled: the interval is wrong, not one odd counter (see
    test_unusable_counter.py for one odd counter among others)."""
    # No constraint max power: the 1000 W default bound, 1500 W plausible: 262143 J wrap in 174.8 s.
    tree = powercap_tree(tmp_path / "tree", [Zone("intel-rapl:0", "package-0", START_UJ)])
    marker = tmp_path / "ran"
    common = ["--sysfs-root", str(tree), "--interval", "200"]
    argv = {
        "agent": [*AGENT, *common],
        "lean agent": [*LEAN_AGENT, *common],
        "run": [
            *(*CLI, "run", *common, "--source", "rapl", "--store", f"sqlite:///{tmp_path / 'w.db'}", "--no-report"),
            *("--", "touch", str(marker)),
        ],
    }[entry]
    done = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "wattline: error: option agent.interval: 200 s: every channel found can wrap within it, so nothing would "
        "be measured; rapl package-0 wraps slowest, in 175 s (262143 J range at up to 1500 W); sample more often"
    ]
    assert not marker.exists()  # the command never ran
    # Just below the limit is accepted.
    if entry == "run":
        below = ["174" if a == "200" else a for a in argv]
        ok = subprocess.run(below, env=clean_env(), capture_output=True, text=True, timeout=60)
        assert ok.returncode == 0 and marker.exists(), ok.stderr


def test_a_zone_that_vanishes_and_comes_back_counts_only_what_was_measured(tmp_path: Path) -> None:
    """Synthetic clock: package-1 is read, vanishes for 2 s, comes back; exact joules throughout."""
    tree = powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 0), Zone("intel-rapl:1", "package-1", 0)])
    watts = {"intel-rapl:0": 40.0, "intel-rapl:1": 25.0}
    raw = dict.fromkeys(watts, 0)
    now = [T0_NS]
    out: list[Any] = []
    discovery = Discovery(["rapl"], tree, {}, {}, interval_s=0.5)
    sampler = Sampler(discovery.sources, out.extend, StampClock(wall=lambda: now[0], mono=lambda: now[0] - T0_NS))

    def tick(present: set[str]) -> None:
        now[0] += 500_000_000
        for zone, w in watts.items():
            raw[zone] += round(w * 0.5e6)
            if zone in present:
                set_energy(tree, zone, raw[zone])
        sampler.tick()

    sampler.tick()
    for _ in range(4):
        tick(set(watts))
    os.unlink(tree / "sys/class/powercap/intel-rapl:1")
    shutil.rmtree(zone_dir(tree, "intel-rapl:1"))
    sampler.rediscover(discovery)
    assert {s.channel.device: s.status for s in sampler.snapshot()}["package-1"] == VANISHED
    for _ in range(4):
        tick({"intel-rapl:0"})
    powercap_tree(tree, [Zone("intel-rapl:1", "package-1", raw["intel-rapl:1"])])  # re-registered, counter moved on
    sampler.rediscover(discovery)
    for _ in range(4):
        tick(set(watts))

    by_device: dict[str, list[Any]] = {}
    for s in out:
        by_device.setdefault(s.device, []).append(s)
    assert len(by_device["package-0"]) == 12
    assert sum(s.energy_j for s in by_device["package-0"]) == pytest.approx(40.0 * 6, rel=1e-9)
    back = by_device["package-1"]
    assert len(back) == 4 + 3  # the first read after the return is a new baseline
    assert sum(s.energy_j for s in back) == pytest.approx(25.0 * 0.5 * 7, rel=1e-9)  # the absence is not invented
    assert [s.cumulative_j for s in back] == sorted(s.cumulative_j for s in back)  # one stream: never backwards
    assert back[-1].cumulative_j == pytest.approx(25.0 * 0.5 * 7, rel=1e-9)
    assert back[4].start_ns - back[3].end_ns == 5 * 500_000_000 and all(s.healthy and not s.status for s in back)
    discovery.close()
