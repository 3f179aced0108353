"""What a store's acknowledgement guarantees when the store is killed (issue #43, first bullet),
found by SIGKILLing each engine installed here while wattline's own store classes write to it;
docs/delivery.md, "What acknowledged means, per store", states the findings and their sources.

A run writes a batch every :data:`PERIOD_S` through ``store.write`` (one host, :data:`CHANNELS`
GPU samples stamped at the present time, and one job event: an open, then units), noting when
each write returned: its acknowledgement. At a known moment it SIGKILLs the engine (an instance
of its own, never a session server), starts it again on the same data directory and port, and
reads back through the store's readers which batches are whole (every sample and the event).
A batch's *age* is how long before the kill it was acknowledged. Then it writes every
acknowledged batch again, as the collector's replay log will, and counts the copies.

- SQLite: a child process writes and is SIGKILLed; every batch it reported is in the file.
- InfluxDB 1.6 and Prometheus 2.42: every acknowledged batch is kept, the kill landing while
  writes are in flight.
- VictoriaMetrics 1.79 acknowledges rows it holds in memory. From its flush intervals
  (``lib/storage/partition.go`` of that version; no flag sets them before v1.85's
  ``-inmemoryDataFlushInterval``): rows wait up to :data:`VM_RAW_FLUSH_S` in a buffer, then
  become an in-memory part, which a flusher running every :data:`VM_PARTS_FLUSH_S` writes to
  disk once it is that old by a clock that counts whole seconds. So a batch reaches the disk
  no sooner than :data:`VM_LOST_S` after it was acknowledged and no later than
  :data:`VM_KEPT_S`; the tests pin both sides. (Merging in-memory parts, which a heavier load
  than this test's sets off, writes them sooner: it can only shorten the window.)
- Restarts: each engine's start time changes across the kill, and not without one;
  VictoriaMetrics gives it in whole seconds, so a write acknowledged in the second of a
  restart cannot be told before or after it.
- Rewrites after the restart leave one copy: VictoriaMetrics only with
  ``-dedup.minScrapeInterval=1ms`` (its defaults keep both), InfluxDB by point identity,
  Prometheus by series and millisecond (an older sample written again is refused without an
  out-of-order window; the store reads it back, stored), SQLite by its unique keys.

``pytest -s`` prints each run's figures.
"""

from __future__ import annotations

import abc
import datetime as dt
import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
from influxd_peer import influxd_config
from servers import (
    PROMETHEUS_OOO_WINDOW_S,
    Daemon,
    Influxd,
    VictoriaMetrics,
    find_binary,
    free_port,
    http,
    searchable,
    start_prometheus,
)
from victoria_peer import victoria_argv, victoria_default_argv
from waits import wait_until

from wattline import wire
from wattline.stores.base import Store, StoreUnavailable
from wattline.stores.influxdb.http import HttpClient
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.prometheus.remote_write import HEADERS as REMOTE_WRITE_HEADERS
from wattline.stores.prometheus.remote_write import point_samples, write_request
from wattline.stores.prometheus.store import PrometheusStore
from wattline.stores.reader import Reader
from wattline.stores.series.points import batch_points
from wattline.stores.sqlite.store import SqliteStore
from wattline.stores.victoria.store import VictoriaStore

PERIOD_S = 0.1
STEP_NS = 100_000_000  # a batch's samples end PERIOD_S after the previous batch's
CHANNELS = 4
HOST = "durable-host"
JOB = "durable-job"
MS = 10**6
#: A store's timeout: a reader's look past a window that ends early (a lost batch) is a 31-day
#: subquery on Prometheus, slow on a busy machine.
READ_TIMEOUT_S = 60.0

#: VictoriaMetrics 1.79: rows are buffered up to a second, in-memory parts flushed every 5 s
#: once 5 s old, parts aged by a clock that advances a whole second at a time.
VM_RAW_FLUSH_S = 1.0
VM_PARTS_FLUSH_S = 5.0
VM_CLOCK_S = 1.0
#: Acknowledged less than this before a kill: never yet on disk (a part is written once its
#: clock has advanced VM_PARTS_FLUSH_S whole seconds, so more than this after it was made).
VM_LOST_S = VM_PARTS_FLUSH_S - VM_CLOCK_S
#: Acknowledged more than this before a kill: on disk (buffer, then a part that missed one
#: flush by the clock's second, then the next flush).
VM_KEPT_S = VM_RAW_FLUSH_S + VM_CLOCK_S + 2 * VM_PARTS_FLUSH_S


def stream_batch(k: int, base_ns: int) -> wire.Batch:
    """Batch ``k`` of a run: CHANNELS samples ending at ``base_ns + (k + 1) * STEP_NS`` and one
    job event (``event_seq`` k + 1: the open, then units)."""
    end = base_ns + (k + 1) * STEP_NS
    batch = wire.Batch(stream_id="durable-stream", seq=k + 1, sent_ns=end)
    batch.host.host_id = HOST
    batch.host.agent_version = "0.1.0"
    batch.host.labels["cluster"] = "c1"
    for c in range(CHANNELS):
        batch.samples.add(
            source="nvml", component="gpu", device=f"GPU-{c}", start_ns=end - STEP_NS, end_ns=end,
            energy_j=25.0, power_w=250.0, cumulative_j=25.0 * (k + 1), quality=wire.QUALITY_COUNTER, healthy=True,
        )  # fmt: skip
    kinds = wire.pb.JobEvent
    if k == 0:
        batch.job_events.add(job_id=JOB, kind=kinds.KIND_OPEN, time_ns=end, event_seq=1, name="durability")
    else:
        batch.job_events.add(job_id=JOB, kind=kinds.KIND_UNITS, time_ns=end, event_seq=k + 1, units=1.0)
    return batch


def whole(reader: Reader, base_ns: int, count: int) -> dict[int, int]:
    """Per batch of the first ``count`` of a run held whole by ``reader``: its samples read back
    (CHANNELS, or more for extra copies)."""
    per_end: dict[int, int] = {}
    for s in reader.samples(HOST, base_ns, base_ns + (count + 1) * STEP_NS):
        per_end[s.end_ns] = per_end.get(s.end_ns, 0) + 1
    events = {e.event_seq for e in reader.job_events(JOB)}
    out = {}
    for k in range(count):
        n = per_end.get(base_ns + (k + 1) * STEP_NS, 0)
        if n >= CHANNELS and k + 1 in events:
            out[k] = n
    return out


# -- engines of the test's own, killed and started again on the same data and port ----------


class Engine(abc.ABC):
    """A server process with its data in ``root``; :meth:`kill` SIGKILLs it, :meth:`start` starts it
    again on the same data and port."""

    name = ""
    ready_path = "/"
    #: The resolution of :meth:`started` (s).
    resolution_s = 1e-6

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.starts = 0
        self.daemon: Daemon | None = None

    @abc.abstractmethod
    def argv(self) -> list[str]:
        """The server's command line."""

    def start(self) -> None:
        """Start it; the first time on another free port if its port was taken meanwhile, later
        always on the same one."""
        for attempt in range(3 if self.daemon is None else 1):
            if attempt:
                self.move(free_port())
            self.starts += 1
            self.daemon = Daemon(self.argv(), self.root / f"{self.name}-{self.starts}.log", self.url)
            if self.daemon.wait_ready(self.ready_path):
                return
            self.daemon.stop()
        pytest.fail(f"{self.name} did not start:\n{self.daemon.log_tail()}", pytrace=False)

    def move(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def kill(self) -> None:
        assert self.daemon is not None
        os.kill(self.daemon.process.pid, signal.SIGKILL)
        self.daemon.process.wait(timeout=10)

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()

    @abc.abstractmethod
    def store(self) -> Store:
        """wattline's store writing to it."""

    @abc.abstractmethod
    def started(self) -> float:
        """When the running process started (Unix seconds), as the engine tells it."""

    def refresh(self) -> None:  # noqa: B027 (a hook: only VictoriaMetrics needs it)
        """Make what was acknowledged searchable (VictoriaMetrics buffers it a second or so)."""


class Victoria(Engine):
    name = "victoriametrics"
    ready_path = "/health"
    resolution_s = 1.0

    def __init__(self, root: Path, defaults: bool = False) -> None:
        super().__init__(root)
        self.defaults = defaults

    def argv(self) -> list[str]:
        binary = find_binary("VICTORIA_METRICS", "victoria-metrics", "victoria-metrics")
        if self.defaults:  # as an operator starts it (-retentionPeriod: the default month holds "now")
            return victoria_default_argv(binary, self.root / "data", self.port)
        return victoria_argv(binary, self.root / "data", self.port)

    def store(self) -> Store:
        return VictoriaStore(self.url, timeout_s=READ_TIMEOUT_S)

    def metrics(self) -> dict[str, float]:
        """The unlabelled series of its ``/metrics``."""
        status, body = http("GET", self.url + "/metrics")
        assert status == 200, body[:300]
        return {name: float(value) for name, value in re.findall(r"^(\w+) (\S+)$", body.decode(), re.M)}

    def started(self) -> float:
        metrics = self.metrics()  # the process's creation is a moment before its start; both whole seconds
        assert 0 <= metrics["vm_app_start_timestamp"] - metrics["process_start_time_seconds"] <= 1, metrics
        return metrics["vm_app_start_timestamp"]

    def refresh(self) -> None:
        searchable(self.url)

    def values(self) -> tuple[int, int]:
        """(values, distinct series and time stamps) of the run's samples in the raw export, as
        VictoriaMetrics gives them (its own deduplication, if any, applied)."""
        self.refresh()
        assert self.daemon is not None
        values = distinct = 0
        for series in VictoriaMetrics(self.daemon).export(f'{{__name__=~"energy_.+",host="{HOST}"}}'):
            values += len(series["timestamps"])
            distinct += len(set(series["timestamps"]))
        return values, distinct


class Prometheus(Engine):
    name = "prometheus"
    ready_path = "/-/ready"

    def __init__(self, root: Path, window_s: int = PROMETHEUS_OOO_WINDOW_S) -> None:
        super().__init__(root)
        self.window_s = window_s

    def start(self) -> None:
        if self.daemon is None:  # the suite's own start: config, flags, a free port
            self.starts += 1
            self.daemon = start_prometheus(self.root, self.window_s)
            self.url = self.daemon.url
            return
        argv = self.argv()
        self.starts += 1
        self.daemon = Daemon(argv, self.root / f"prometheus-{self.starts}.log", self.url)
        if not self.daemon.wait_ready(self.ready_path):
            pytest.fail(f"prometheus did not start again:\n{self.daemon.log_tail()}", pytrace=False)

    def argv(self) -> list[str]:
        """A restart's: the first start's command line (its config, flags and port)."""
        assert self.daemon is not None
        return [str(a) for a in self.daemon.process.args]

    def store(self) -> Store:
        return PrometheusStore(self.url, timeout_s=READ_TIMEOUT_S)

    def started(self) -> float:
        status, body = http("GET", self.url + "/api/v1/status/runtimeinfo")
        assert status == 200, body[:300]
        return rfc3339(json.loads(body)["data"]["startTime"])


class Influx(Engine):
    name = "influxdb"
    ready_path = "/ping"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.config = root / "influxdb.conf"
        self.move(self.port)

    def move(self, port: int) -> None:
        super().move(port)
        self.config.write_text(influxd_config(self.root, port, free_port()))

    def argv(self) -> list[str]:
        return [find_binary("INFLUXD", "influxd", "influxdb"), "-config", str(self.config)]

    def store(self) -> Store:
        return InfluxV1Store(self.url, "durable", timeout_s=READ_TIMEOUT_S)

    def started(self) -> float:
        status, body = http("GET", self.url + "/debug/vars")
        assert status == 200, body[:300]
        return rfc3339(json.loads(body)["system"]["started"])

    def energy_points(self, base_ns: int, count: int) -> int:
        """Points stored of the first ``count`` batches of a run."""
        assert self.daemon is not None
        where = f"host = '{HOST}' AND time > {base_ns} AND time <= {base_ns + count * STEP_NS}"
        rows = Influxd(self.daemon).query(f"SELECT count(energy_j) FROM energy WHERE {where}", "durable")
        return int(rows[0]["count"]) if rows else 0


def rfc3339(stamp: str) -> float:
    """Unix seconds of an RFC 3339 time with up to nanoseconds (Go's RFC3339Nano)."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return dt.datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac or "0"))


# -- one run: write, SIGKILL at a known moment, start again, count ---------------------------


@dataclass
class Run:
    """What a run acknowledged and what came back."""

    label: str
    base_ns: int = 0
    acked: dict[int, float] = field(default_factory=dict)  #: batch -> monotonic time of its acknowledgement
    kill_at: float = 0.0  #: monotonic
    kill_wall: float = 0.0
    kept: dict[int, int] = field(default_factory=dict)
    started: tuple[float, float, float] = (0.0, 0.0, 0.0)  #: at start, before the kill, after the restart
    replay_copies: int = -1

    def age(self, k: int) -> float:
        return self.kill_at - self.acked[k]

    @property
    def lost_ages(self) -> list[float]:
        return sorted(self.age(k) for k in self.acked if k not in self.kept)

    def summary(self) -> str:
        lost = self.lost_ages
        span = f"{lost[0]:.1f}-{lost[-1]:.1f} s old" if lost else "none"
        kept = [self.age(k) for k in self.kept]
        youngest = f", youngest kept {min(kept):.1f} s old" if kept else ""
        return f"{self.label}: {len(self.acked)} acknowledged, lost {len(lost)} ({span}){youngest}"


def kill_run(
    engine: Engine, label: str, write_s: float, idle_s: float | None = None, period_s: float = PERIOD_S
) -> Run:
    """Start ``engine`` and write a batch every ``period_s`` (0: back to back). With ``idle_s``:
    stop writing once ``write_s`` is over and SIGKILL it ``idle_s`` after the last acknowledgement;
    without: SIGKILL it at ``write_s`` with the writes going on. Start it again, read back, write
    every acknowledged batch again and count the copies."""
    run = Run(label, base_ns=time.time_ns() // MS * MS)
    engine.start()
    first = engine.started()
    store = engine.store()
    stop = threading.Event()
    deadline = time.monotonic() + write_s

    def writer() -> None:
        k = 0
        while not stop.is_set():
            try:
                assert store.write(stream_batch(k, run.base_ns)).rejected == 0
            except StoreUnavailable:
                return  # the kill: not acknowledged
            run.acked[k] = acked = time.monotonic()
            k += 1
            if idle_s is not None and acked + period_s >= deadline:
                return
            time.sleep(max(0.0, acked + period_s - time.monotonic()))

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    if idle_s is None:
        time.sleep(max(0.0, deadline - time.monotonic()))
    else:
        thread.join()
        time.sleep(max(0.0, run.acked[max(run.acked)] + idle_s - time.monotonic()))
    before = engine.started()
    run.kill_wall, run.kill_at = time.time(), time.monotonic()
    engine.kill()
    stop.set()
    thread.join(timeout=30)
    store.close()
    try:
        engine.start()
        run.started = (first, before, engine.started())
        with engine.store() as again:
            assert isinstance(again, Reader)
            run.kept = whole(again, run.base_ns, len(run.acked))
            results = [again.write(stream_batch(k, run.base_ns)) for k in sorted(run.acked)]
            assert sum(r.rejected for r in results) == 0, [r.reasons for r in results]
            replayed = wait_until(
                lambda: restored(engine, again, run), lambda: f"{label}: every batch written again, searchable"
            )
            run.replay_copies = sum(n - CHANNELS for n in replayed.values())
            if isinstance(engine, Victoria):
                values, distinct = engine.values()
                run.replay_copies += values - distinct
            elif isinstance(engine, Influx):
                run.replay_copies += engine.energy_points(run.base_ns, len(run.acked)) - CHANNELS * len(run.acked)
    finally:
        engine.stop()
    print(run.summary())
    return run


def restored(engine: Engine, reader: Reader, run: Run) -> dict[int, int]:
    """:func:`whole` of ``run`` once every batch it acknowledged reads back (else empty)."""
    engine.refresh()
    found = whole(reader, run.base_ns, len(run.acked))
    return found if sorted(found) == sorted(run.acked) else {}


def label(write_s: float, idle_s: float | None, period_s: float) -> str:
    pace = "back to back" if not period_s else f"every {period_s} s"
    return f"writes {pace} for {write_s} s, " + (
        "killed while writing" if idle_s is None else f"killed {idle_s} s after"
    )


def in_parallel(runs: list[Callable[[], Run]]) -> list[Run]:
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        return list(pool.map(lambda f: f(), runs))


def check_restart_told(engine: Engine, run: Run) -> None:
    """The start time read before the kill is the one read at start (no restart: no change); after
    the restart it is no earlier than the kill, to the engine's resolution, and later than the
    first unless both fall in one such step."""
    first, before, after = run.started
    assert before == first, f"{run.label}: start time moved without a restart"
    step = engine.resolution_s
    assert after >= math.floor(run.kill_wall / step) * step, (run.label, run.kill_wall, after)
    if math.floor(run.kill_wall / step) > math.floor(first / step):
        assert after > first, (run.label, first, after)
    if step == 1.0:
        assert after == int(after), f"{run.label}: start time {after} is not whole seconds"


# -- the findings --------------------------------------------------------------------------


@pytest.mark.servers
def test_victoria_metrics_loses_what_it_acknowledged_seconds_before_a_kill(tmp_path: Path) -> None:
    """Killed with writes going on, at three points of its flusher's cycle: every batch
    acknowledged less than VM_LOST_S before the kill is gone, every one acknowledged more than
    VM_KEPT_S before is there, and what is lost is the newest (whole batches); written again
    after the restart, each is there once."""
    durations = (13.5, 15.0, 16.5)  # past VM_KEPT_S, and a third of the 5 s cycle apart
    engines = [Victoria(tmp_path / f"vm-{d}") for d in durations]
    runs = in_parallel(
        [
            partial(kill_run, e, f"victoriametrics, {label(d, None, PERIOD_S)}", d)
            for e, d in zip(engines, durations, strict=True)
        ]
    )
    for engine, run in zip(engines, runs, strict=True):
        ages = {k: run.age(k) for k in run.acked}
        assert min(ages.values()) < VM_LOST_S < VM_KEPT_S < max(ages.values()), run.summary()
        assert not [a for k, a in ages.items() if a < VM_LOST_S and k in run.kept], run.summary()
        assert not [a for k, a in ages.items() if a > VM_KEPT_S and k not in run.kept], run.summary()
        assert max(run.lost_ages) < min(ages[k] for k in run.kept), f"lost is not the newest: {run.summary()}"
        assert run.replay_copies == 0, f"{run.label}: {run.replay_copies} extra copies after the rewrite"
        check_restart_told(engine, run)


@pytest.mark.servers
def test_victoria_metrics_after_a_quiet_spell(tmp_path: Path) -> None:
    """A burst of batches, then nothing, then SIGKILL at known moments after the last
    acknowledgement: within VM_LOST_S all is lost, past VM_KEPT_S all is kept (between, either)."""
    delays = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0)
    engines = [Victoria(tmp_path / f"vm-idle-{d}") for d in delays]
    runs = in_parallel(
        [
            partial(kill_run, e, f"victoriametrics, {label(0.5, d, PERIOD_S)}", 0.5, d)
            for e, d in zip(engines, delays, strict=True)
        ]
    )
    for engine, run, delay in zip(engines, runs, delays, strict=True):
        if delay < VM_LOST_S:
            assert not run.kept, run.summary()
        if delay > VM_KEPT_S:
            assert len(run.kept) == len(run.acked), run.summary()
        assert run.replay_copies == 0, run.summary()
        check_restart_told(engine, run)


@pytest.mark.servers
def test_victoria_metrics_defaults_keep_both_copies_of_a_rewrite(tmp_path: Path) -> None:
    """Without ``-dedup.minScrapeInterval`` a point written again after a restart is stored twice
    (the readers show one): the replay log relies on the flag the docs ask for."""
    engine = Victoria(tmp_path / "vm-defaults", defaults=True)
    engine.start()
    base = time.time_ns() // MS * MS
    try:
        with engine.store() as store:
            for k in range(10):
                store.write(stream_batch(k, base))
        engine.stop()  # SIGTERM: everything on disk
        engine.start()
        with engine.store() as store:
            run = Run("victoriametrics defaults", base, acked={k: 0.0 for k in range(10)})
            for k in run.acked:
                store.write(stream_batch(k, base))
            assert isinstance(store, Reader)
            shown = wait_until(lambda: restored(engine, store, run), "the batches written again, searchable")
            assert set(shown.values()) == {CHANNELS}  # the readers show one
        values, distinct = engine.values()
        assert values == 2 * distinct > 0, (values, distinct)
    finally:
        engine.stop()


@pytest.mark.servers
@pytest.mark.parametrize("make", [Influx, Prometheus], ids=["influxdb-1.6", "prometheus-2.42"])
def test_acknowledged_means_kept(tmp_path: Path, make: Callable[[Path], Engine]) -> None:
    """InfluxDB 1.6 (``wal-fsync-delay`` 0 s, its default) and Prometheus 2.42 keep every batch
    they acknowledged, the kill landing while writes are in flight, and after a quiet spell of 0 s;
    written again, each is there once."""
    specs = [(1.5, None, 0.0), (3.0, None, PERIOD_S), (1.0, 0.0, PERIOD_S)]  # write_s, idle_s, period_s
    engines = [make(tmp_path / f"{i}") for i in range(len(specs))]
    runs = [kill_run(e, f"{e.name}, {label(*spec)}", *spec) for e, spec in zip(engines, specs, strict=True)]
    for engine, run in zip(engines, runs, strict=True):
        assert run.acked and len(run.kept) == len(run.acked), run.summary()
        assert run.replay_copies == 0, run.summary()
        check_restart_told(engine, run)


def remote_write(url: str, batch: wire.Batch) -> tuple[int, str]:
    """Status and answer of a bare remote write of ``batch``'s points (no store around it)."""
    points, refused = batch_points(batch, point_samples)
    assert not refused
    client = HttpClient(url + "/api/v1/write", READ_TIMEOUT_S, headers=REMOTE_WRITE_HEADERS)
    try:
        status, _, body = client.request("POST", "", write_request(s for samples in points for s in samples))
    finally:
        client.close()
    return status, body.decode(errors="replace")


@pytest.mark.servers
@pytest.mark.parametrize("window_s", [3 * 86400, 0], ids=["out-of-order-window", "no-window"])
def test_prometheus_takes_the_same_samples_again_after_a_restart(tmp_path: Path, window_s: int) -> None:
    """After a SIGKILL and a restart, the newest samples written again are taken as they are
    (same series, millisecond and value); older ones only within ``out_of_order_time_window``,
    else refused as out of order. Through PrometheusStore either way nothing is rejected (it
    reads refused points back and finds them stored) and each sample is there once."""
    engine = Prometheus(tmp_path, window_s)
    engine.start()
    base = time.time_ns() // MS * MS
    try:
        with engine.store() as store:
            for k in range(5):
                assert store.write(stream_batch(k, base)).rejected == 0
        engine.kill()
        engine.start()
        newest = remote_write(engine.url, stream_batch(4, base))
        oldest = remote_write(engine.url, stream_batch(0, base))
        assert newest[0] == 204, newest
        if window_s:
            assert oldest[0] == 204, oldest
        else:
            assert oldest[0] == 400 and "out of order sample" in oldest[1], oldest
        with engine.store() as store:
            assert isinstance(store, Reader)
            results = [store.write(stream_batch(k, base)) for k in range(5)]
            assert [r.rejected for r in results] == [0] * 5, [r.reasons for r in results]
            assert whole(store, base, 5) == dict.fromkeys(range(5), CHANNELS)
    finally:
        engine.stop()


# -- SQLite: the writer is the process that dies ---------------------------------------------

_CHILD = """
import sys, time
sys.path[:0] = sys.argv[3:]
from test_store_durability import stream_batch
from wattline.stores.sqlite.store import SqliteStore
base = int(sys.argv[2])
with SqliteStore(sys.argv[1]) as store:
    k = 0
    while True:
        store.write(stream_batch(k, base))
        print(k, flush=True)
        k += 1
"""


def sqlite_writer(path: Path, base_ns: int) -> subprocess.Popen[str]:
    here = str(Path(__file__).parent)
    helpers = str(Path(__file__).parents[1] / "helpers")
    root = str(Path(__file__).parents[2])
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(base_ns), here, helpers, root], stdout=subprocess.PIPE, text=True)  # fmt: skip


@pytest.mark.parametrize("after_s", [0.3, 0.8, 1.5])
def test_sqlite_keeps_what_a_killed_writer_committed(tmp_path: Path, after_s: float) -> None:
    """A process writing through SqliteStore is SIGKILLed mid-write: every batch whose write
    returned is in the file (at most the one in flight besides), which opens clean; written
    again, each is there once."""
    path = tmp_path / "w.db"
    base = time.time_ns() // MS * MS
    child = sqlite_writer(path, base)
    assert child.stdout is not None
    reported = [int(child.stdout.readline())]  # the writer is up
    start = time.monotonic()
    reader = threading.Thread(target=lambda: reported.extend(int(line) for line in child.stdout or ()), daemon=True)
    reader.start()
    time.sleep(max(0.0, start + after_s - time.monotonic()))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    reader.join(timeout=10)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with SqliteStore(path) as store:
        kept = whole(store, base, len(reported) + 1)
        assert set(reported) <= set(kept) <= set(reported) | {len(reported)}, (len(reported), sorted(kept)[-3:])
        for k in sorted(kept):
            store.write(stream_batch(k, base))
        assert set(whole(store, base, len(kept)).values()) == {CHANNELS}
    print(f"sqlite, writer killed after {after_s} s: {len(reported)} reported, {len(kept)} in the file")
