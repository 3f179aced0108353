"""A store killed with SIGKILL loses nothing the collector acknowledged (issue #43).

An operator's bad day, with real processes on loopback: three ``wattline agent`` processes
(RAPL on sysfs trees this test advances at known, different powers; disk spools) stream to
one ``wattline collector`` writing to a store of this test's own, while ``wattline run``
wraps a job of 120 units on the first host. The store is killed with SIGKILL and started
again on its data directory (twice), the second time with the collector killed with SIGKILL
right after the store answers again; then the store hangs (SIGSTOP) for a while. Run for
VictoriaMetrics (which answers a write before it is durable: the collector's replay log
writes the lost window again), InfluxDB 1.x and Prometheus (durable when they answer).

The truths: every record each agent wrote to its spool (:mod:`spool_ledger`) is what the
store holds for that host, no more, no less, same joules; each stream tiles its time with no
gap or overlap; each host's stored energy over its whole span is its zones' power times that
span; the job's energy (alone on its host: ``--share-rule exclusive``) is that host's power
times its stored window, and it counted 120 units.

Tolerances: the store against the spool, 1e-9 relative (a float written as text and read
back); energy against power x time, the issue's 0.5 % (the sysfs writer's 10 ms step at
each end of a 30 s span is 0.07 %); the job, the issue's 1 % (its window's edges fall inside
samples of 0.2 s, which the report splits by time: exact at constant power).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from influxd_peer import influxd_config
from procs import CLI, Proc, clean_env, start_collector
from servers import Daemon, find_binary, free_port, searchable
from spool_ledger import Ledger
from sysfs_trees import PowerAdvancer, Zone, powercap_tree
from victoria_peer import victoria_argv

from wattline.stores.factory import open_store
from wattline.stores.reader import Reader

#: Each host's package and dram power, W: unequal, so a sample stored under the wrong host shows.
HOSTS = {"crash-0": (40.0, 4.0), "crash-1": (55.0, 5.5), "crash-2": (70.0, 7.0)}
JOB_HOST, JOB_ID, UNITS = "crash-0", "crash-job", 120
START_UJ = 10**11
#: The sysfs writer's period (PowerAdvancer's default): the counters' step.
STEP_S = 0.01

#: One unit every 0.2 s (each with its own time stamp), 120 in all.
UNITS_120 = (
    "import os, time\n"
    f"for _ in range({UNITS}):\n"
    "    with open(os.environ['WATTLINE_EVENTS'], 'a') as f:\n"
    "        f.write(f'units 1 {time.time():.6f}\\n')\n"
    "    time.sleep(0.2)\n"
)


@dataclass
class OwnStore:
    """A store server of this test only: killed, hung and started again on one port and data directory."""

    kind: str
    argv: list[str]
    root: Path
    url: str
    ready_path: str
    store_args: list[str]
    reader_args: dict[str, str]
    daemon: Daemon | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        daemon = Daemon(self.argv, self.root / f"{self.kind}-{self.starts}.log", self.url)
        if not daemon.wait_ready(self.ready_path):
            pytest.fail(f"{self.kind} did not start again:\n{daemon.log_tail()}", pytrace=False)
        self.daemon = daemon

    def signal(self, number: signal.Signals) -> None:
        assert self.daemon is not None
        os.kill(self.daemon.process.pid, number)
        if number == signal.SIGKILL:
            self.daemon.process.wait(timeout=10)

    def reader(self) -> Reader:
        if self.kind == "victoriametrics":
            searchable(self.url)  # rows still in its buffers are searchable now
        store = open_store(self.store_args[1], read_only=True, **self.reader_args)
        assert isinstance(store, Reader)
        return store

    def stop(self) -> None:
        if self.daemon is not None:
            os.kill(self.daemon.process.pid, signal.SIGCONT)
            self.daemon.stop()


def own_store(kind: str, root: Path) -> OwnStore:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if kind == "victoriametrics":
        binary = find_binary("VICTORIA_METRICS", "victoria-metrics", "victoria-metrics")
        return OwnStore(kind, victoria_argv(binary, root / "data", port), root, url, "/health", ["--store", url], {})
    if kind == "influxdb":
        config = root / "influxdb.conf"
        config.write_text(influxd_config(root, port, free_port()))
        argv = [find_binary("INFLUXD", "influxd", "influxdb"), "-config", str(config)]
        args = ["--store", url, "--influx-api", "v1", "--influx-database", "crash"]
        return OwnStore(kind, argv, root, url, "/ping", args, {"database": "crash", "api": "v1"})
    from servers import prometheus_argv

    return OwnStore(kind, prometheus_argv(root, port), root, url, "/-/ready", ["--store", f"prometheus+{url}"], {})


@pytest.fixture(params=["victoriametrics", "influxdb", "prometheus"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OwnStore]:
    root = tmp_path / request.param
    root.mkdir()
    server = own_store(request.param, root)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Host:
    """One host: its RAPL tree advanced at its powers, its agent, the ledger of its spool."""

    def __init__(self, tmp: Path, name: str, port: int, outbox: Path) -> None:
        self.name, self.watts = name, sum(HOSTS[name])
        package, dram = HOSTS[name]
        zones = [Zone("intel-rapl:0", "package-0", START_UJ), Zone("intel-rapl:0:1", "dram", START_UJ)]
        tree = powercap_tree(tmp / name / "sysfs", zones)
        self.counters = PowerAdvancer(tree, {"intel-rapl:0": package, "intel-rapl:0:1": dram}, START_UJ, STEP_S)
        spool = tmp / name / "spool"
        spool.mkdir(mode=0o700)
        self.ledger = Ledger(spool, tmp / name / "ledger", name)
        self.agent = Proc(
            ["agent", "--host-id", name, "--sysfs-root", str(tree), "--source", "rapl", "--interval", "0.2",
             "--batch-interval", "0.5", "--push-timeout", "5", "--spool-dir", str(spool),
             "--outbox-dir", str(outbox), f"--collector=127.0.0.1:{port}"],
            tmp / name / "agent.log",
        )  # fmt: skip

    def sampling(self) -> bool:
        return " sampling every " in self.agent.log()

    def finish(self) -> None:
        """Graceful stop: the agent sends what its spool holds first."""
        assert self.agent.terminate(timeout_s=60) == 0, self.agent.log()[-3000:]
        self.counters.close()
        self.ledger.close()
        last = self.agent.log().splitlines()[-1]
        assert "0 dropped, 0 batches left" in last, self.agent.log()[-3000:]

    def close(self) -> None:
        self.counters.close()
        self.ledger.stop.set()
        self.agent.kill9()


def wait_for(done: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def check_host(host: Host, reader: Reader) -> tuple[int, float]:
    """The store holds exactly what ``host``'s agent produced, tiled, at its power (see the
    module doc); returns the samples and the energy's relative error against power x span."""
    produced = host.ledger.samples()
    assert produced, f"{host.name}: the agent produced nothing"
    lo = min(start for _stream, start, _e, _c in produced.values())
    hi = max(end for _device, end in produced)
    stored = {(s.device, s.end_ns): s for s in reader.samples(host.name, lo, hi)}
    lost, extra = sorted(set(produced) - set(stored)), sorted(set(stored) - set(produced))
    assert not lost, f"{host.name}: {len(lost)} of {len(produced)} acknowledged samples lost, first {lost[:3]}"
    assert not extra, f"{host.name}: {len(extra)} samples stored that the agent never produced: {extra[:3]}"
    for key, (stream, start, energy, cumulative) in produced.items():
        s = stored[key]
        assert (s.stream, s.start_ns) == (stream, start), key
        assert s.energy_j == pytest.approx(energy, rel=1e-9) and s.cumulative_j == pytest.approx(cumulative, rel=1e-9)
    by_series: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for s in stored.values():
        by_series.setdefault((s.stream, s.device), []).append((s.start_ns, s.end_ns))
    for series, spans in by_series.items():
        spans.sort()
        joints = [(a, b) for a, b in itertools.pairwise(spans) if b[0] != a[1]]
        assert not joints, f"{host.name} {series}: a gap or an overlap at {joints[:3]}"
    energy = math.fsum(s.energy_j for s in stored.values())
    span_s = (hi - lo) / 1e9
    error = energy / (host.watts * span_s) - 1
    assert abs(error) < 0.005, (host.name, error)
    return len(stored), error


def test_a_store_killed_and_hung_loses_nothing_acknowledged(tmp_path: Path, store: OwnStore) -> None:
    port = free_port()
    outbox = tmp_path / "outbox"  # the job's events no collector took yet; crash-0's agent delivers them
    replay = tmp_path / "replay"
    collector_args = [*store.store_args, "--replay-dir", str(replay)]
    logs = itertools.count(1)

    def collector() -> Proc:
        return start_collector(port, collector_args, tmp_path / f"collector-{next(logs)}.log")

    collectors = [collector()]
    hosts = [Host(tmp_path, name, port, outbox) for name in HOSTS]
    job: subprocess.Popen[str] | None = None
    try:
        wait_for(lambda: all(h.sampling() for h in hosts), "the agents never started sampling")
        env = {**clean_env(), "WATTLINE_AGENT_OUTBOX_DIR": str(outbox)}
        job = subprocess.Popen(
            [*CLI, "run", "--host-id", JOB_HOST, "--job-id", JOB_ID, f"--collector=127.0.0.1:{port}",
             "--", sys.executable, "-c", UNITS_120],
            env=env, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        t0 = time.monotonic()

        def at(t: float) -> None:
            time.sleep(max(0.0, t0 + t - time.monotonic()))

        at(5)
        store.signal(signal.SIGKILL)  # what it acknowledged in the last seconds is in its memory only
        at(9)
        store.start()
        at(12)
        store.signal(signal.SIGKILL)
        at(15)
        store.start()
        collectors[-1].kill9()  # right after the store answers again: before or after it saw the restart
        collectors.append(collector())
        at(19)
        store.signal(signal.SIGSTOP)
        at(24)
        store.signal(signal.SIGCONT)
        _, err = job.communicate(timeout=60)
        assert job.returncode == 0, err
        wait_for(lambda: not [p for p in outbox.iterdir() if p.name != "holders"], "the outbox was never delivered")
        for host in hosts:
            host.finish()
        assert collectors[-1].terminate() == 0, collectors[-1].log()[-3000:]
    finally:
        if job is not None and job.poll() is None:
            job.kill()
        for host in hosts:
            host.close()
        for proc in collectors:
            proc.kill9()
    logs_text = "\n".join(p.log() for p in collectors)
    assert "Traceback" not in logs_text, logs_text[-5000:]
    if store.kind == "victoriametrics":  # the live collector and the one started after the kill each wrote again
        replays = [p.log().count("written again from the replay log") for p in collectors]
        assert replays[0] >= 1 and sum(replays) >= 2, replays

    reader = store.reader()
    try:
        figures = [check_host(host, reader) for host in hosts]
    finally:
        reader.close()
    print(
        f"\n[{store.kind}] killed twice, hung 5 s, the collector killed once: "
        + ", ".join(
            f"{h.name} {n} samples ({e:+.4%} vs power x span)" for h, (n, e) in zip(hosts, figures, strict=True)
        )
    )

    report = subprocess.run(
        [*CLI, "report", JOB_ID, "--json", "--share-rule", "exclusive", *store.store_args],
        capture_output=True, text=True, env=clean_env(),
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    result = json.loads(report.stdout)
    assert result["job"]["closed"] and result["job"]["exit_code"] == 0
    assert result["units"]["total"] == UNITS
    reader = store.reader()
    try:
        times = {e.event: e.time_ns for e in reader.job_events(JOB_ID) if e.event in ("open", "close")}
    finally:
        reader.close()
    truth = sum(HOSTS[JOB_HOST]) * (times["close"] - times["open"]) / 1e9
    energy = result["warmup"]["energy_j"] + result["measured"]["energy_j"]
    print(f"job {energy:.2f} J, truth {truth:.2f} J ({energy / truth - 1:+.3%}), {result['units']['total']} units")
    assert energy == pytest.approx(truth, rel=0.01)
