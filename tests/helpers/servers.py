"""Real database servers for the tests: ``influxd`` 1.x, ``victoria-metrics`` and ``prometheus``.

Each is started once per test session on a free 127.0.0.1 port with its data in a temp
dir, and stopped by PID (SIGTERM, then SIGKILL). A missing binary FAILS the tests that
need it (CI installs the Debian packages ``influxdb``, ``victoria-metrics`` and ``prometheus``);
the ``INFLUXD`` / ``VICTORIA_METRICS`` / ``PROMETHEUS`` environment variables override the
binary paths.

Fixtures: ``influxd`` (:class:`Influxd`: ``.url``, ``.new_database()``, ``.query()``),
``victoria_metrics`` (:class:`VictoriaMetrics`: ``.url``, ``.export()``; run with the flags
wattline's docs ask for), ``victoria_metrics_defaults`` (the same, as an operator starts it),
``prometheus``
(:class:`Daemon`: ``.url``; a remote-write receiver), and ``store`` (SQLite, then InfluxDB 1.x
on ``influxd``) for the modules that import it.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from influxd_peer import influxd_config, query_rows
from victoria_peer import victoria_argv, victoria_default_argv
from waits import wait_until

from wattline import wire
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.sqlite.store import SqliteStore

START_TIMEOUT_S = 30.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_binary(env: str, name: str, package: str) -> str:
    """The binary's path, or a test FAILURE saying how to get it."""
    path = os.environ.get(env) or shutil.which(name) or f"/usr/bin/{name}"
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{name} not found ({path}): install the Debian package {package!r} (apt-get install {package}) "
            f"or point {env} at the binary",
            pytrace=False,
        )
    return path


def http(method: str, url: str, body: bytes | None = None, timeout_s: float = 10.0) -> tuple[int, bytes]:
    """Status and body of one request (no exception for HTTP error statuses)."""
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Daemon:
    """A server process started by hand; stopped by PID."""

    def __init__(self, argv: list[str], log_path: Path, url: str) -> None:
        self.url = url
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_ready(self, path: str) -> bool:
        """True once ``GET path`` answers 2xx; False if the process died first."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                if 200 <= http("GET", self.url + path, timeout_s=1.0)[0] < 300:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start(make: Callable[[int], Daemon], ready_path: str, name: str) -> Daemon:
    """Start a daemon on a free port (three tries: the port may be taken meanwhile)."""
    for _ in range(3):
        daemon = make(free_port())
        if daemon.wait_ready(ready_path):
            return daemon
        daemon.stop()
    pytest.fail(f"{name} did not start:\n{daemon.log_tail()}", pytrace=False)


class Influxd:
    """A running ``influxd`` 1.x."""

    _names = itertools.count(1)

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.url = daemon.url

    def new_database(self) -> str:
        """A fresh, not yet created database name (the store under test creates it)."""
        return f"test_{next(self._names)}_{os.getpid()}"

    def query(self, influxql: str, database: str | None = None) -> list[dict[str, Any]]:
        """Rows of every series (tags merged in, times in ns)."""
        params = {"q": influxql, "epoch": "ns", **({"db": database} if database else {})}
        status, body = http("POST", self.url + "/query", urllib.parse.urlencode(params).encode())
        assert status == 200, body
        return query_rows(body)


@pytest.fixture(scope="session")
def influxd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Influxd]:
    binary = find_binary("INFLUXD", "influxd", "influxdb")
    root = tmp_path_factory.mktemp("influxd")

    def make(port: int) -> Daemon:
        config = root / "influxdb.conf"
        config.write_text(influxd_config(root, port, free_port()))
        return Daemon([binary, "-config", str(config)], root / "influxd.log", f"http://127.0.0.1:{port}")

    daemon = start(make, "/ping", "influxd")
    try:
        yield Influxd(daemon)
    finally:
        daemon.stop()


@pytest.fixture(name="store", params=["sqlite", "influxdb1"])
def sqlite_or_influxdb1_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqliteStore | InfluxV1Store]:
    """``store``: each test once on SQLite, once on a fresh database of the session's influxd
    (import it into the test module to use it)."""
    if request.param == "sqlite":
        with SqliteStore(tmp_path / "w.db") as sqlite:
            yield sqlite
    else:
        influxd: Influxd = request.getfixturevalue("influxd")
        with InfluxV1Store(influxd.url, influxd.new_database()) as influx:
            yield influx


def searchable(url: str) -> None:
    """VictoriaMetrics at ``url`` makes what it took searchable now (it buffers rows a second or so)."""
    http("GET", url + "/internal/force_flush")


class VictoriaMetrics:
    """A running single-node ``victoria-metrics``."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.url = daemon.url

    def export(self, match: str, expect: int = 1) -> list[dict[str, Any]]:
        """``/api/v1/export`` series for the selector ``match``, once at least ``expect`` (1 or
        more) are there; the test fails if they never are.

        Ingestion is asynchronous (rows sit in buffers for up to a second or so), so this
        forces a flush and polls.
        """
        query = urllib.parse.urlencode({"match[]": match})

        def found() -> list[dict[str, Any]]:
            searchable(self.url)
            status, body = http("GET", f"{self.url}/api/v1/export?{query}")
            assert status == 200, body
            series = [json.loads(line) for line in body.splitlines() if line.strip()]
            return series if len(series) >= expect else []

        return wait_until(found, f"{expect} series of {match} in VictoriaMetrics")


def run_victoria(
    tmp_path_factory: pytest.TempPathFactory, argv: Callable[[str, Path, int], list[str]]
) -> Iterator[VictoriaMetrics]:
    """A single-node ``victoria-metrics`` started with ``argv(binary, data, port)``, stopped after."""
    binary = find_binary("VICTORIA_METRICS", "victoria-metrics", "victoria-metrics")
    root = tmp_path_factory.mktemp("victoria-metrics")

    def make(port: int) -> Daemon:
        return Daemon(argv(binary, root / "data", port), root / "victoria-metrics.log", f"http://127.0.0.1:{port}")

    daemon = start(make, "/health", "victoria-metrics")
    try:
        yield VictoriaMetrics(daemon)
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def victoria_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    yield from run_victoria(tmp_path_factory, victoria_argv)


@pytest.fixture(scope="session")
def victoria_metrics_defaults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    """``victoria-metrics`` with its defaults (:func:`victoria_default_argv`): data older than a
    month is out of its retention, so tests write at the present time."""
    yield from run_victoria(tmp_path_factory, victoria_default_argv)


#: The out-of-order window the ``prometheus`` fixture runs with (README: as long as agents
#: hold unacknowledged batches); samples older than it behind the newest are refused.
PROMETHEUS_OOO_WINDOW_S = 3 * 86400


def prometheus_argv(root: Path, port: int, ooo_window_s: int = PROMETHEUS_OOO_WINDOW_S, *flags: str) -> list[str]:
    """Prometheus taking remote write (``/api/v1/write``) on ``port`` with its data under
    ``root``, an out-of-order window of ``ooo_window_s`` (0: none, Prometheus' default) and ``flags``."""
    binary = find_binary("PROMETHEUS", "prometheus", "prometheus")
    config = root / "prometheus.yml"
    config.write_text(f"storage:\n  tsdb:\n    out_of_order_time_window: {ooo_window_s}s\n")
    return [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-remote-write-receiver",
        "--storage.tsdb.retention.time=100y",
        "--log.level=warn",
        *flags,
    ]


def start_prometheus(root: Path, ooo_window_s: int = PROMETHEUS_OOO_WINDOW_S, *flags: str) -> Daemon:
    """:func:`prometheus_argv` on a free port, serving once this returns."""

    def make(port: int) -> Daemon:
        argv = prometheus_argv(root, port, ooo_window_s, *flags)
        return Daemon(argv, root / "prometheus.log", f"http://127.0.0.1:{port}")

    return start(make, "/-/ready", "prometheus")


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = start_prometheus(tmp_path_factory.mktemp("prometheus"))
    try:
        yield daemon
    finally:
        daemon.stop()


# -- test data -------------------------------------------------------------------------

#: A fixed, recent base time (2026-05-28): inside VictoriaMetrics' retention, one shard.
T0 = 1_780_000_000_000_000_000


def make_batch(
    host: str = "node-1",
    labels: dict[str, str] | None = None,
    samples: int = 4,
    t0: int = T0,
    stream: str = "stream-a",
    seq: int = 1,
    job_id: str | None = None,
) -> wire.Batch:
    """A real Batch: ``samples`` GPU samples 1 s apart (values exact in binary and decimal),
    the last one unhealthy; with ``job_id``, one job event of each kind.
    """
    batch = wire.Batch(stream_id=stream, seq=seq, sent_ns=t0)
    batch.host.host_id = host
    batch.host.agent_version = "0.1.0"
    batch.host.labels.update(labels if labels is not None else {"cluster": "c1", "region": "eu-west-1"})
    for i in range(samples):
        sample = batch.samples.add(
            source="nvml",
            component="gpu",
            device=f"GPU-{i % 2}",
            start_ns=t0 + i * 1_000_000_000,
            end_ns=t0 + (i + 1) * 1_000_000_000,
            energy_j=250.125 + i,
            power_w=250.125 + i,
            cumulative_j=1000.5 + 250.125 * i,
            quality=wire.QUALITY_COUNTER,
            healthy=i < samples - 1,
        )
        if sample.healthy:
            sample.utilization = 0.5 + i / 8
            sample.energy_error_j = 0.25
            sample.gauges["memory_used_bytes"] = 1.5e10 + i
        else:
            sample.status = "GPU is lost"
    if job_id is not None:
        kinds = wire.pb.JobEvent
        events = batch.job_events
        events.add(job_id=job_id, kind=kinds.KIND_OPEN, time_ns=t0, event_seq=1, name="resnet 50, bs=64")
        events[-1].job_kind = "training"
        events[-1].unit_name = "images"
        events[-1].labels.update({"team": "vision", "owner": 'a "quoted" name'})
        events[-1].devices.extend(["gpu:0", "gpu:1"])
        events.add(job_id=job_id, kind=kinds.KIND_UNITS, time_ns=t0 + 1_500_000_000, event_seq=2, units=512.0)
        events.add(job_id=job_id, kind=kinds.KIND_PHASE, time_ns=t0 + 2_000_000_000, event_seq=3, phase="saturated")
        events.add(job_id=job_id, kind=kinds.KIND_CLOSE, time_ns=t0 + 3_000_000_000, event_seq=4, exit_code=137)
    return batch
