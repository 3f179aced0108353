"""A service held by a systemd unit named in the agent's config (#44): the real agent, a
collector with SQLite, ``wattline report SVC --since 1m``.

The host is a fake tree under the agent's sysfs root: a RAPL package at a known power
(:class:`sysfs_trees.PowerAdvancer`) and a cgroup v2 hierarchy as systemd lays it out
(fixtures/cgroup_systemd/SOURCE.md): the root's ``cpu.stat`` counts the host's CPU time, the
unit's ``system.slice/vllm.service`` its own, both advanced by the test at known rates while
the unit runs (``cgroup.procs`` holds a PID, ``cgroup.events`` says ``populated 1``). A small
HTTP server is the unit's ``/metrics``: a request counter with ``_created``, advanced by known
numbers, restarted from 0 with the unit (and answering 503 while it is stopped).

Truths: the unit's CPU energy is the package's power times its share of the host's CPU time
(UNIT_CORES / (UNIT_CORES + OTHER_CORES)) times the seconds it ran; its requests are those the
test counted. The agent sees each start and stop only at its next look, and takes the unit's
CPU time between two looks as spent at one pace: in a stretch of L seconds where the unit ran a
fraction f, it is given ``W L U f / (O + U f)`` for a truth of ``W L f U / (O + U)`` (U, O: its
cores and the others'), never less, and at most EDGE_SHARE x W x L more (the largest gap over f).
So the report may exceed the truth by that for each of the four edges (start, stop, start
again, stop), with L the looks' spacing (two poll intervals: a loaded machine's looks come late),
and fall short of it by nothing but the counters' granularity. Its bound must hold the truth:
each edge's period may have held the unit's share of all of it or none of it (its ``split``
term), at most SHARE x W x L each.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from procs import CLI, Proc, clean_env, start_collector
from servers import free_port
from sysfs_trees import PowerAdvancer, Zone, powercap_tree
from test_pod_kinds import LAST, LATENCIES, STEPS, VllmServer, check, merged, truth
from test_pod_kinds import report as report_events
from waits import wait_until

from wattline import wire
from wattline.agent.holders.systemd.settings import SystemdSettings
from wattline.agent.holders.systemd.watch import UnitWatcher
from wattline.config import ConfigError
from wattline.served_scrape import ScrapeError
from wattline.stores.sqlite.store import SqliteStore

ZONE, WATTS = "intel-rapl:0", 40.0
UNIT, JOB = "vllm.service", "vllm-a"
UNIT_CORES, OTHER_CORES = 3.0, 1.0
SHARE = UNIT_CORES / (UNIT_CORES + OTHER_CORES)
POLL_S, INTERVAL_S, GRACE_S = 0.1, 0.25, 1.5
#: max over f of U f / (O + U f) - f U / (O + U): at f = (sqrt(1 + U/O) - 1) / (U/O)
_R = UNIT_CORES / OTHER_CORES
_F = ((1 + _R) ** 0.5 - 1) / _R
EDGE_SHARE = UNIT_CORES * _F / (OTHER_CORES + UNIT_CORES * _F) - _F * SHARE
FIXTURE = Path(__file__).parents[1] / "fixtures/cgroup_systemd/v2"


class Metrics:
    """The unit's server's /metrics: ``app_requests_total`` with its ``_created``; 503 while stopped."""

    def __init__(self) -> None:
        self.count, self.created_s, self.up = 0, time.time(), False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.exposition().encode()
                self.send_response(200 if outer.up else 503)
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(body if outer.up else b"stopped")

            def log_message(self, *_: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_port}/metrics"

    def exposition(self) -> str:
        return (
            "# TYPE app_requests counter\n"
            f'app_requests_total{{outcome="ok"}} {float(self.count)}\n'
            f'app_requests_total{{outcome="error"}} 7.0\n'
            f'app_requests_created{{outcome="ok"}} {self.created_s}\n'
            f'app_requests_created{{outcome="error"}} {self.created_s}\n'
        )


class Cgroups:
    """The host's cgroup v2 tree (copied from the fixture) and its CPU counters, advanced in wall
    time from a thread: the root at OTHER_CORES always plus the unit's, the unit at UNIT_CORES
    while it runs; the unit's cgroup made anew (its counter from 0) at each start."""

    def __init__(self, root: Path) -> None:
        self.base = root / "sys/fs/cgroup"
        shutil.copytree(FIXTURE / "sys/fs/cgroup", self.base)
        self.unit_dir = self.base / "system.slice" / UNIT
        shutil.rmtree(self.unit_dir)  # the unit is not started yet
        self.t0 = time.monotonic()
        self.unit_ns, self.ran_s, self.since = 0.0, 0.0, None  # the unit's counter; its seconds run
        self.host_before = 0.0  #: the unit's CPU time of its ended runs (the root keeps it)
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.tick()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.wait(0.005):
            self.tick()

    def tick(self) -> None:
        with self.lock:
            now = time.monotonic()
            unit = UNIT_CORES * (now - self.since) * 1e9 if self.since is not None else 0.0
            host = OTHER_CORES * (now - self.t0) * 1e9 + self.host_before + unit
            write(self.base / "cpu.stat", host)
            if self.since is not None:
                write(self.unit_dir / "cpu.stat", unit)

    def start(self) -> None:
        with self.lock:
            shutil.copytree(FIXTURE / "sys/fs/cgroup/system.slice" / UNIT, self.unit_dir)
            self.since = time.monotonic()
        self.tick()

    def stop_unit(self) -> None:
        """The unit's processes exit: its cgroup empty, its counter frozen."""
        with self.lock:
            assert self.since is not None
            ran = time.monotonic() - self.since
            self.ran_s += ran
            self.host_before += UNIT_CORES * ran * 1e9
            write(self.unit_dir / "cpu.stat", UNIT_CORES * ran * 1e9)
            self.since = None
            (self.unit_dir / "cgroup.procs").write_text("")
            (self.unit_dir / "cgroup.events").write_text("populated 0\nfrozen 0\n")

    def remove_unit(self) -> None:
        """systemd removes the stopped unit's cgroup."""
        with self.lock:
            shutil.rmtree(self.unit_dir)


def write(path: Path, cpu_ns: float) -> None:
    temporary = path.with_suffix(".new")  # replaced whole: a reader never sees half a file
    temporary.write_text(f"usage_usec {int(cpu_ns / 1000)}\nuser_usec 0\nsystem_usec 0\n")
    temporary.replace(path)


def config(path: Path, metrics: str, grace_s: float = GRACE_S) -> Path:
    path.write_text(
        f"[systemd]\npoll_interval = {POLL_S}\ngrace = {grace_s}\n\n[[systemd.services]]\n"
        f'unit = "{UNIT}"\njob = "{JOB}"\nmetrics = "{metrics}"\nkind = "inference"\n'
        "count = 'requests=app_requests_total{outcome=\"ok\"}'\n"
    )
    return path


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    d = tmp_path_factory.mktemp("collector")
    port, db = free_port(), d / "w.db"
    proc = start_collector(port, ["--store", f"sqlite:///{db}"], d / "collector.log")
    yield port, db
    proc.terminate()


def start_agent(root: Path, port: int, cfg: Path, log: Path) -> Proc:
    args = ["agent", "--config", str(cfg), "--host-id", "unit-host", "--sysfs-root", str(root), "--source", "rapl",
            "--interval", str(INTERVAL_S), "--batch-interval", "0.5", f"--collector=127.0.0.1:{port}",
            "--outbox-dir", str(root.parent / "outbox"), "--edge-socket", "off", "--spool-dir", "memory"]  # fmt: skip
    return Proc(args, log)


def closed(db: Path, job_id: str) -> bool:
    return any(e.event == "close" for e in SqliteStore(db).job_events(job_id))


def report(db: Path, job_id: str) -> dict[str, Any]:
    done = subprocess.run(
        [*CLI, "report", job_id, "--json", "--store", f"sqlite:///{db}", "--since", "1m"],
        capture_output=True, text=True, timeout=60, env=clean_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_unit_restarted_in_the_middle_is_one_service_job(tmp_path: Path, collector: tuple[int, Path]) -> None:
    port, db = collector
    root = powercap_tree(tmp_path / "host", [Zone(ZONE, "package-0")])
    advancer = PowerAdvancer(root, {ZONE: WATTS}, period_s=0.005)
    cgroups, metrics = Cgroups(root), Metrics()
    agent = start_agent(root, port, config(tmp_path / "agent.toml", metrics.url), tmp_path / "agent.log")
    served = 0
    try:
        wait_until(lambda: "unit watcher" in agent.log() or "sampling" in agent.log(), agent.log, timeout_s=30)
        time.sleep(3 * POLL_S)  # the agent's first looks see the unit stopped: it counts from its start
        cgroups.start()
        metrics.up = True
        for _ in range(10):  # the first run: 10 x 13 requests
            time.sleep(0.15)
            metrics.count += 13
            served += 13
        time.sleep(3 * POLL_S)  # scraped before the unit stops (what it serves after its last scrape is lost)
        cgroups.stop_unit()
        metrics.up = False
        time.sleep(2 * POLL_S)
        cgroups.remove_unit()
        time.sleep(GRACE_S / 2)  # a restart: back within the grace
        # The server restarts from 0 with a new _created and, before any scrape, has counted more
        # than before its restart: only _created tells the reset.
        metrics.created_s, metrics.count = time.time(), 200
        served += 200
        cgroups.start()
        metrics.up = True
        for _ in range(8):
            time.sleep(0.15)
            metrics.count += 11
            served += 11
        time.sleep(3 * POLL_S)
        cgroups.stop_unit()  # the unit is stopped for good: its cgroup goes (after a look saw it empty)
        metrics.up = False
        time.sleep(2 * POLL_S)
        cgroups.remove_unit()
        wait_until(lambda: closed(db, JOB), lambda: agent.log()[-3000:], timeout_s=30)
        time.sleep(2 * INTERVAL_S)
    finally:
        agent.terminate()
        advancer.close()
        cgroups.stop.set()
        metrics.http.shutdown()
    assert agent.process.returncode == 0, agent.log()[-3000:]
    r = report(db, JOB)
    whole = r["whole_run"]
    truth_j = WATTS * SHARE * cgroups.ran_s
    over_j = 4 * EDGE_SHARE * WATTS * 2 * POLL_S  # the four edges' stretches, at most
    under_j = 0.002 * truth_j  # the counters' 5 ms steps
    print(
        f"unit ran {cgroups.ran_s:.3f} s, served {served}; report {whole['units']} requests, "
        f"{whole['energy_j']:.3f} J ± {whole['energy_bound_j']:.3f} (truth {truth_j:.3f}, -{under_j:.3f}/+{over_j:.3f}), "
        f"{whole['j_per_unit']:.5f} J/request (truth {truth_j / served:.5f})"
    )
    assert r["job"]["service"] is True and r["job"]["status"] == "closed" and r["job"]["unit"] == "requests"
    assert whole["units"] == served  # none lost or doubled by the restart
    assert truth_j - under_j <= whole["energy_j"] <= truth_j + over_j
    # the bound holds the truth, and is no wider than the four edges' periods could make it
    bound_j = whole["energy_bound_j"]
    assert whole["energy_j"] - bound_j <= truth_j <= whole["energy_j"] + bound_j
    assert bound_j <= 4 * SHARE * WATTS * 2 * POLL_S + under_j
    assert (truth_j - under_j) / served <= whole["j_per_unit"] <= (truth_j + over_j) / served
    # one job across the restart, no second life
    assert SqliteStore(db).job_events(f"{JOB}@") == []


def test_bad_service_entries_stop_the_agent_with_one_line(tmp_path: Path) -> None:
    good = {"unit": UNIT, "metrics": "http://127.0.0.1:9/metrics", "count": "requests=x"}
    bad = [
        ({"unit": "vllm"}, "expected a system unit's name"),
        ({"unit": "../etc/x.service"}, "expected a system unit's name"),
        ({"preset": "vllm"}, "both given"),
        ({"count": "requests=x{"}, "unit spec"),
        ({"metrics": "file:///etc/passwd"}, "http(s) URL"),
        ({"kind": "batch"}, "kind 'batch'"),
        ({"colour": "red"}, "unknown key"),
    ]
    for change, said in bad:
        entry = {**good, **change}
        cfg = tmp_path / "bad.toml"
        cfg.write_text("[[systemd.services]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in entry.items()))
        done = subprocess.run(
            [*CLI, "agent", "--config", str(cfg), "--sysfs-root", str(tmp_path), "--source", "rapl",
             "--outbox-dir", str(tmp_path / "ob"), "--edge-socket", "off", "--spool-dir", "memory"],
            capture_output=True, text=True, timeout=60, env=clean_env(),
        )  # fmt: skip
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and said in lines[0], (change, done.stderr[-2000:])
    no_units = {k: v for k, v in good.items() if k != "count"}
    for services, said in [
        ([no_units], "neither given"),
        ([{**no_units, "preset": "nope"}], "no preset"),
        ([good, {**good, "job": "other"}], "the same unit"),
        ([good, {**good, "unit": "b.service", "job": f"systemd:{UNIT}"}], "the same job"),
    ]:
        with pytest.raises(ConfigError, match=said):
            SystemdSettings(services=services).validate()
    with pytest.raises(ConfigError, match="poll_interval"):
        SystemdSettings(poll_interval=0).validate()


def test_a_unit_running_before_the_agent_counts_from_its_first_look_and_reopens_as_a_new_job(tmp_path: Path) -> None:
    """The watcher driven look by look (times and counters the test's): a unit already running
    when the agent starts is counted from its first scrape on, its past a baseline; a restarted
    agent goes on with its job and its open as sent; stopped past the grace the job closes at
    its stop; started again, it is a new job."""
    base = tmp_path / "sys/fs/cgroup"
    shutil.copytree(FIXTURE / "sys/fs/cgroup", base)
    count = {"n": 500}
    sent: list[Any] = []
    settings = SystemdSettings(services=[{"unit": UNIT, "job": JOB, "metrics": "http://127.0.0.1:9/m",
                                          "count": 'requests=app_requests_total{outcome="ok"}'}],
                               poll_interval=1.0, grace=3.0).validate()  # fmt: skip
    metrics = Metrics()
    metrics.created_s = 0.0  # long before the agent

    def fetch(_url: str, _timeout: float) -> str:
        if not (base / "system.slice" / UNIT).exists():
            raise ScrapeError("connection refused")  # the server stopped with its unit
        metrics.count = count["n"]
        return metrics.exposition()

    def agent() -> UnitWatcher:
        return UnitWatcher(settings, wire.Host(host_id="h"), tmp_path, lambda _h, ev: sent.extend(ev), fetch, state)

    state = tmp_path / "outbox/units"
    watcher = agent()
    t0 = 1_767_225_600 * 10**9
    for t in range(8):
        if t == 2:  # the agent restarts: what the unit served since its last scrape is not counted
            watcher = agent()
        write(base / "cpu.stat", 2e9 * t)
        if t < 4:
            write(base / "system.slice" / UNIT / "cpu.stat", 1e9 * t)
        elif t == 4:  # stopped, its cgroup removed
            shutil.rmtree(base / "system.slice" / UNIT)
        watcher.look(t0 + t * 10**9)
        count["n"] += 10
    opens = [e for e in sent if e.kind == wire.pb.JobEvent.KIND_OPEN]
    units = [e.units for e in sent if e.kind == wire.pb.JobEvent.KIND_UNITS]
    # the first agent's running total; none from the restarted one (its total would start again at 0)
    totals = [
        e.units_total if e.HasField("units_total") else None for e in sent if e.kind == wire.pb.JobEvent.KIND_UNITS
    ]
    assert totals == [0.0, 10.0, None, None]
    uses = [e for e in sent if e.kind == wire.pb.JobEvent.KIND_USE]
    [close] = [e for e in sent if e.kind == wire.pb.JobEvent.KIND_CLOSE]
    # the restarted agent's open is the first one's, the same event
    assert [(e.job_id, e.time_ns, e.event_seq) for e in opens] == [(JOB, t0, opens[0].event_seq)] * 2
    assert close.job_id == JOB and close.time_ns == t0 + 4 * 10**9
    assert units == [0.0, 10.0, 0.0, 10.0]  # each agent's first scrape a baseline; nothing once it stopped
    # its CPU time from each agent's second look, half the host's; unknown over the look where its
    # cgroup went (4); none while it is gone
    use = {(e.time_ns - t0) // 10**9: (e.job_use, e.device_use) for e in uses}
    assert sorted(use) == [1, 3, 5, 6, 7] and len(uses) == 5
    assert all(use[t][0] > 0 and use[t][0] * 2 == pytest.approx(use[t][1]) for t in (1, 3))
    assert all(use[t][0] == 0 < use[t][1] for t in (5, 6, 7))
    watcher = agent()  # restarted after the close: the closed job's id is not taken again
    watcher.look(t0 + 8 * 10**9)
    shutil.copytree(FIXTURE / "sys/fs/cgroup/system.slice" / UNIT, base / "system.slice" / UNIT)
    watcher.look(t0 + 9 * 10**9)
    again = [e for e in sent if e.kind == wire.pb.JobEvent.KIND_OPEN][2:]
    assert [(e.job_id, e.time_ns) for e in again] == [
        (f"{JOB}@{t0 // 10**9 + 9}", t0 + 8 * 10**9)
    ]  # from the look before


def test_a_unit_stopped_while_no_agent_watched_closes_its_job_after_the_grace(tmp_path: Path) -> None:
    base = tmp_path / "sys/fs/cgroup"
    shutil.copytree(FIXTURE / "sys/fs/cgroup", base)
    settings = SystemdSettings(services=[{"unit": UNIT, "job": JOB, "metrics": "http://127.0.0.1:9/m",
                                          "count": "requests=app_requests_total"}], poll_interval=1.0, grace=2.0)  # fmt: skip
    sent: list[Any] = []

    def refused(_url: str, _timeout: float) -> str:
        raise ScrapeError("connection refused")

    def agent() -> UnitWatcher:
        host = wire.Host(host_id="h")
        return UnitWatcher(settings, host, tmp_path, lambda _h, ev: sent.extend(ev), refused, tmp_path / "state")

    t0 = 1_767_225_600 * 10**9
    agent().look(t0)
    shutil.rmtree(base / "system.slice" / UNIT)  # stopped while the agent was down
    watcher = agent()
    for t in range(1, 5):
        watcher.look(t0 + t * 10**9)
    edges = (wire.pb.JobEvent.KIND_OPEN, wire.pb.JobEvent.KIND_CLOSE)
    kinds = [(e.kind, e.job_id, e.time_ns) for e in sent if e.kind in edges]
    assert kinds == [(wire.pb.JobEvent.KIND_OPEN, JOB, t0)] * 2 + [(wire.pb.JobEvent.KIND_CLOSE, JOB, t0 + 10**9)]


def test_a_vllm_unit_counts_each_model_s_tokens_and_latency_and_says_its_last_scrape_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``preset = "vllm"`` unit started while the agent watched, driven look by look: each
    model's tokens and the e2e latency histogram are counted as the pod and wrapper holders
    count them (tests/unit/test_pod_kinds.py's truths); what it served after its last good scrape
    is lost with its server, and that last scrape's failure is one line, the close going on."""
    base = tmp_path / "sys/fs/cgroup"
    shutil.copytree(FIXTURE / "sys/fs/cgroup", base)
    shutil.rmtree(base / "system.slice" / UNIT)
    server = VllmServer()  # its exposition only: the watcher's fetch reads it
    server.server_close()
    settings = SystemdSettings(services=[{"unit": UNIT, "job": JOB, "metrics": "http://127.0.0.1:9/m",
                                          "preset": "vllm"}], poll_interval=1.0, grace=2.0).validate()  # fmt: skip

    def fetch(_url: str, _timeout: float) -> str:
        if not (base / "system.slice" / UNIT).exists():
            raise ScrapeError("connection refused")  # the server stopped with its unit
        return server.text()

    sent: list[Any] = []
    watcher = UnitWatcher(settings, wire.Host(host_id="h"), tmp_path, lambda _h, ev: sent.extend(ev), fetch)
    t0 = 1_767_225_600 * 10**9
    watcher.look(t0)
    shutil.copytree(FIXTURE / "sys/fs/cgroup/system.slice" / UNIT, base / "system.slice" / UNIT)
    for i, (step, latencies) in enumerate(zip(STEPS, LATENCIES, strict=True), start=1):
        server.step(step)
        server.observe(latencies)
        watcher.look(t0 + i * 10**9)
    server.step(LAST)  # served after the last good scrape: gone with the server
    shutil.rmtree(base / "system.slice" / UNIT)
    for t in (4, 5, 6):
        watcher.look(t0 + t * 10**9)

    [close] = [e for e in sent if e.kind == wire.pb.JobEvent.KIND_CLOSE]
    assert close.time_ns == t0 + 4 * 10**9
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "last scrape failed" in lines[0], lines
    requests, tokens = truth(STEPS)
    r = report_events(sent, tmp_path / "w.db", JOB, "h")
    assert r["job"]["unit"] == "requests" and r["units"]["total"] == requests
    assert {(k["name"], k["labels"]["model_name"]): k["units"] for k in r["unit_kinds"]} == tokens
    check(r["latency"], merged(*LATENCIES), "unit's whole run")
