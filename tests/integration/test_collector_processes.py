"""``wattline collector --processes 2`` into a real influxd: several processes on one port.

Truth: agents (one gRPC channel each, so the kernel spreads them over the processes) push
batches of known samples with distinct times; the database must hold each exactly once,
every acknowledged batch must be stored, the supervisor's /metrics must add up all
processes, a killed process must be replaced without losing a sample, SIGTERM must drain
and exit 0, and two agents under one host id must be noticed whichever processes hear them.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from collector_procs import SAMPLES, Agent, Collector, run_all
from procs import CLI, clean_env
from servers import Influxd


@pytest.fixture
def collector(tmp_path: Path, influxd: Influxd) -> Iterator[Collector]:
    c = Collector(tmp_path, influxd)
    yield c
    c.proc.terminate()


def test_many_agents_each_sample_stored_once_and_metrics_add_up(collector: Collector) -> None:
    agents = [Agent(collector.port, f"node-{i}", batches=5, resend_first=True) for i in range(16)]
    run_all(agents)
    assert [a.acked for a in agents] == [[1, 1, 2, 3, 4, 5]] * 16
    assert collector.stored() == 16 * 5 * SAMPLES  # the resent batch overwrote itself
    m = collector.metrics()
    assert m["wattline_collector_points_written_total"] == sum(a.written for a in agents) == 16 * 6 * SAMPLES
    assert m["wattline_collector_batches_total"] == 16 * 6
    assert m["wattline_collector_processes"] == 2
    assert m["wattline_collector_hosts_with_duplicate_streams"] == 0
    assert m['wattline_collector_refused_calls_total{reason="busy"}'] == 0
    assert collector.proc.terminate() == 0


def test_sigterm_drains_every_process_and_acks_only_what_is_stored(collector: Collector) -> None:
    agents = [Agent(collector.port, f"node-{i}", batches=10_000) for i in range(8)]
    for a in agents:
        a.start()
    deadline = time.monotonic() + 30
    while min(len(a.acked) for a in agents) < 3 and time.monotonic() < deadline:  # every agent under way
        time.sleep(0.05)
    collector.proc.process.send_signal(signal.SIGTERM)
    assert collector.proc.process.wait(timeout=60) == 0, collector.proc.log()[-3000:]
    for a in agents:
        a.stop.set()
        a.join(30)
    assert all(len(a.acked) for a in agents)  # what an agent got after the stop (CANCELLED...) it resends later
    for a in agents:  # one batch at a time: acked 1..n, and n+1 perhaps written when the stop came
        assert len(a.acked) * SAMPLES <= collector.stored(a.host) <= (len(a.acked) + 1) * SAMPLES
    for pid in collector.pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_a_killed_process_is_replaced_and_nothing_is_lost(collector: Collector) -> None:
    agents = [Agent(collector.port, f"node-{i}", batches=40, pause_s=0.05) for i in range(8)]
    for a in agents:
        a.start()
    deadline = time.monotonic() + 30
    while sum(len(a.acked) for a in agents) < 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    victim = collector.pids[0]
    subprocess.run(["kill", "-9", str(victim)], check=True)
    run_all(agents)
    assert [len(a.acked) for a in agents] == [40] * 8
    assert collector.stored() == 8 * 40 * SAMPLES
    log = collector.proc.log()
    assert re.search(rf"collector process 0 \(pid {victim}\) died \(killed by signal 9\); starting it again", log)
    deadline = time.monotonic() + 30
    while (m := collector.metrics())["wattline_collector_processes"] != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert m["wattline_collector_processes"] == 2
    assert m["wattline_collector_process_restarts_total"] == 1
    assert collector.proc.terminate() == 0


def test_two_agents_under_one_host_id_are_noticed_across_processes(collector: Collector) -> None:
    # Four streams of one host on four connections: the kernel spreads them over both
    # processes (all four on one: 1 in 8), and their sample times overlap.
    agents = [Agent(collector.port, "twin", batches=3, pause_s=0.3, stream=f"twin-{k}") for k in range(4)]
    run_all(agents)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = collector.metrics()
        if m.get('wattline_collector_duplicate_streams{host="twin"}') == 4:
            break
        time.sleep(0.2)
    assert m['wattline_collector_duplicate_streams{host="twin"}'] == 4
    assert m["wattline_collector_hosts_with_duplicate_streams"] == 1
    warnings = [
        line for line in collector.proc.log().splitlines() if "agent streams send samples of the same time" in line
    ]
    assert len(warnings) == 1 and "[process" not in warnings[0], warnings


def collector_pids(supervisor: int) -> list[int]:
    """The supervisor's collector processes (not multiprocessing's resource tracker)."""
    pids = []
    try:
        for task in Path(f"/proc/{supervisor}/task").iterdir():
            for pid in (task / "children").read_text().split():
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(int(pid))
    except FileNotFoundError:  # a process exited meanwhile
        pass
    return pids


def test_a_process_that_keeps_dying_stops_the_collector_non_zero(collector: Collector) -> None:
    supervisor = collector.proc.process.pid
    killed: set[int] = set()
    seen: set[int] = set()
    deadline = time.monotonic() + 120
    while collector.proc.alive() and time.monotonic() < deadline:
        current = collector_pids(supervisor)
        seen.update(current)
        pids = [p for p in current if p not in killed]
        serving = collector.proc.log().count("collector listening on")
        if len(pids) == 2 and serving == 2 + len(killed):  # both serve: kill one again
            subprocess.run(["kill", "-9", str(pids[0])], check=False)
            killed.add(pids[0])
        time.sleep(0.2)
    assert collector.proc.process.wait(timeout=60) == 1
    log = collector.proc.log()
    assert "6 deaths within 60 s: giving up" in log.splitlines()[-1], log[-2000:]
    assert log.splitlines()[-1].startswith("wattline: error: collector process")
    assert len(killed) == 6
    survivors = [p for p in seen if Path(f"/proc/{p}").exists()]
    assert survivors == [], "a collector process outlived its supervisor"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env={**clean_env(), **(env or {})})


@pytest.mark.parametrize("how", ["flag", "env", "config"])
def test_sqlite_with_several_processes_is_refused_in_one_line(tmp_path: Path, how: str) -> None:
    config = tmp_path / "wattline.toml"
    config.write_text("[collector]\nprocesses = 3\n")
    args, env = {
        "flag": (["--processes", "3"], {}),
        "env": ([], {"WATTLINE_COLLECTOR_PROCESSES": "3"}),
        "config": (["--config", str(config)], {}),
    }[how]
    done = run_cli("collector", "--store", f"sqlite:{tmp_path / 'w.db'}", *args, env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "wattline: error: option collector.processes: 3 processes cannot share a SQLite store (one writer per "
        "file); use processes = 1, or an InfluxDB store (http://...)"
    ]


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_port_in_use_is_one_line_not_shared(influxd: Influxd, processes: str) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        done = run_cli("collector", "--listen", f"127.0.0.1:{port}", "--store", influxd.url, "--processes", processes)
    assert done.returncode == 1
    # one line: no gRPC C-core log line, no advice about GRPC_VERBOSITY
    assert done.stderr.strip().splitlines() == [
        f"wattline: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    ], done.stderr


def test_credentials_are_checked_before_any_process_starts(tmp_path: Path, influxd: Influxd) -> None:
    missing = tmp_path / "no-token"
    done = run_cli("collector", "--store", influxd.url, "--processes", "2", "--token-file", str(missing))
    assert done.returncode == 2  # as with one process: a configuration error, named
    assert done.stderr.strip().splitlines() == [
        f"wattline: error: collector.token_file file {missing}: No such file or directory"
    ]
