"""Several collector processes on one port (``collector.processes``), under one supervisor.

One Python process decodes, validates and encodes on one core (the GIL); a host with more
cores and an InfluxDB store runs ``processes`` of them. The supervisor (the process the
user started) reserves the listening port, then starts each collector process (spawned:
a fresh interpreter), which binds the same port with ``SO_REUSEPORT``: the kernel spreads
new connections over them (by a hash of each connection's addresses; an agent keeps its
connection, so its stream stays in one process). The supervisor serves no gRPC itself.

What each invariant becomes:

- **Acks after the write**: unchanged, each process acknowledges what its own store
  connection wrote. SIGTERM (or SIGINT) to the supervisor is passed on to every process,
  which drains its in-flight batches as one collector does; the supervisor exits after
  them (non-zero if one of them did not stop cleanly).
- **Never half-alive**: a process that dies is started again and its agents reconnect
  (their unacknowledged batches are resent; writes are idempotent); more than
  ``MAX_RESTARTS`` deaths within ``RESTART_WINDOW_S``, or one before it served, stop the
  collector with a non-zero exit and the dead process's last error. A supervisor that
  dies takes its processes with it (each watches its pipe to the supervisor).
- **SQLite**: one writer per file, so more than one process is refused by the settings.
- **Duplicate agent streams**: two agents under one host id may land in different
  processes, so each process relays the sample-time span of every stream it hears
  (at most once a second) to the supervisor, whose one :class:`LiveStreams` warns.
- **/metrics**: served by the supervisor, the sum over its processes (each asked over its
  pipe at scrape time) and its own series (duplicate streams, processes, restarts).
- Per process, not per collector: the per-host rate limit (a host on two connections in two
  processes may push up to twice ``host_rate``), the clock-skew log, and the job summary
  writer (a job whose events reach two processes is summarised by both: the same point,
  computed from the store).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from wattline import wire
from wattline.collector.listen import check_free
from wattline.collector.livestreams import LiveStreams, batch_span, duplicate_gauges
from wattline.collector.settings import CollectorSettings
from wattline.signals import set_on_signals

log = logging.getLogger(__name__)

#: Deaths within RESTART_WINDOW_S beyond which the collector gives up (exits non-zero).
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
#: How long a process may take to start serving, and to drain on SIGTERM (beyond its 10 s grace).
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
#: How long a scrape waits for one process's metrics.
SCRAPE_TIMEOUT_S = 2.0
#: How often a process relays the stream spans it heard to the supervisor (seconds).
RELAY_EVERY_S = 1.0
AGENT_TIMEOUT_S = 120.0
#: Variables a process must not inherit: only the supervisor talks to systemd.
SUPERVISOR_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")

#: The body of one collector process: serve ``settings`` (``listen`` is the reserved
#: port) until ``link.stop`` is set. A module-level function (it is pickled by name).
ProcessMain = Callable[[CollectorSettings, "ProcessLink"], None]


# -- in a collector process -------------------------------------------------------------------


class ProcessLink:
    """A collector process's end of its pipe: ready, errors, metrics, stream spans."""

    def __init__(self, conn: Connection, index: int) -> None:
        self.conn = conn
        self.index = index
        self.stop = threading.Event()
        self.registry: CollectorRegistry | None = None
        self._send_lock = threading.Lock()
        self._spans: dict[tuple[str, str], tuple[int, int]] = {}
        self._spans_lock = threading.Lock()

    def send(self, *message: Any) -> None:
        with self._send_lock:
            try:
                self.conn.send(message)
            except (OSError, ValueError):  # the supervisor is gone: stop
                self.stop.set()

    def ready(self, registry: CollectorRegistry, port: int) -> None:
        """The gRPC server listens: answer scrapes from now on, then tell the supervisor."""
        self.registry = registry
        threading.Thread(target=self._serve, name="supervisor-link", daemon=True).start()
        threading.Thread(target=self._relay, name="span-relay", daemon=True).start()
        self.send("ready", port)

    def _serve(self) -> None:
        while True:
            try:
                request = self.conn.recv()
            except (EOFError, OSError):  # the supervisor died: drain and exit
                self.stop.set()
                return
            if request[0] == "metrics" and self.registry is not None:
                self.send("metrics", request[1], list(self.registry.collect()))

    def seen(self, batch: wire.pb.Batch, now: float) -> None:
        """A :class:`StreamWatch`: note the batch's stream span (relayed by :meth:`_relay`)."""
        span = batch_span(batch)
        if span is None:
            return
        key = (batch.host.host_id, batch.stream_id)
        with self._spans_lock:
            old = self._spans.get(key)
            self._spans[key] = span if old is None else (min(old[0], span[0]), max(old[1], span[1]))

    def _relay(self) -> None:
        """Every RELAY_EVERY_S, the spans noted since (merged per stream) to the supervisor's
        :class:`LiveStreams`, which warns of two live streams of one host."""
        while not self.stop.wait(RELAY_EVERY_S):
            with self._spans_lock:
                spans, self._spans = self._spans, {}
            if spans:
                self.send("spans", [(h, s, a, b) for (h, s), (a, b) in spans.items()])

    def sweep(self, now: float) -> None:
        """Nothing here: the supervisor sweeps its :class:`LiveStreams`."""


def _process_entry(main: ProcessMain, settings: CollectorSettings, index: int, conn: Connection, level: int) -> None:
    """A spawned collector process: log like the supervisor, serve, report a failure's cause."""
    for name in SUPERVISOR_ONLY:
        os.environ.pop(name, None)
    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s %(name)s [process {index}]: %(message)s")
    link = ProcessLink(conn, index)
    set_on_signals(link.stop)  # SIGTERM from the supervisor, or Ctrl-C to the process group
    try:
        main(settings, link)
    except BaseException as exc:
        link.send("error", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        raise SystemExit(1) from None


# -- in the supervisor --------------------------------------------------------------------------


def reserve_port(listen: str) -> tuple[socket.socket, int]:
    """Check that nothing listens on ``listen`` and hold its port (port 0: a free one) with a
    bound, not listening, ``SO_REUSEPORT`` socket, so that only the collector's processes
    (same user, same option) can bind it while the collector runs."""
    family, kind, proto, address = check_free(listen)
    held = socket.socket(family, kind, proto)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        held.bind(address)
    except OSError as exc:
        held.close()
        raise OSError(f"cannot listen on {listen}: {exc.strerror}") from None
    return held, int(held.getsockname()[1])


class _Process:
    """One collector process as the supervisor sees it."""

    def __init__(self, index: int, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        context = multiprocessing.get_context("spawn")
        self.index = index
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=target, args=(*args[:2], index, child, *args[2:]), name=f"wattline-collector-{index}"
        )
        self.process.start()
        child.close()
        self.started = time.monotonic()
        self.ready = threading.Event()
        self.error = ""
        self.replies: queue.Queue[tuple[int, list[Metric]]] = queue.Queue()
        self.ask_lock = threading.Lock()

    def alive(self) -> bool:
        return self.process.is_alive()

    def outcome(self) -> str:
        code = self.process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
        return how + (f": {self.error}" if self.error else "")


class Supervisor:
    """Starts ``count`` collector processes, restarts the dead, stops them all, sums their metrics."""

    def __init__(self, settings: CollectorSettings, main: ProcessMain, count: int) -> None:
        self.settings = settings
        self.main = main
        self.count = count
        self.own = CollectorRegistry()
        self.live = LiveStreams(*duplicate_gauges(self.own), timeout_s=AGENT_TIMEOUT_S)
        self.up = Gauge("wattline_collector_processes", "Collector processes serving.", registry=self.own)
        self.restarts = Counter(
            "wattline_collector_process_restarts", "Collector processes started again after dying.", registry=self.own
        )
        self.registry = CollectorRegistry()
        self.registry.register(_Sum(self))
        self.processes: list[_Process] = []
        self._deaths: list[float] = []
        self._asks = itertools.count(1)
        self._lock = threading.Lock()

    def _start(self, index: int, listen: str) -> _Process:
        settings = replace(self.settings, listen=listen, prometheus_port=None)
        proc = _Process(index, _process_entry, (self.main, settings, logging.getLogger().level))
        threading.Thread(target=self._read, args=(proc,), name=f"process-{index}", daemon=True).start()
        return proc

    def _read(self, proc: _Process) -> None:
        """Messages of one process, until its pipe closes."""
        while True:
            try:
                message = proc.conn.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "ready":
                proc.ready.set()
            elif kind == "error":
                proc.error = message[1]
            elif kind == "metrics":
                proc.replies.put((message[1], message[2]))
            elif kind == "spans":
                now = time.monotonic()
                for host, stream, start_ns, end_ns in message[1]:
                    self.live.span(host, stream, start_ns, end_ns, now)

    def scrape(self) -> Iterator[list[Metric]]:
        """Each serving process's metric families (a process that does not answer in time is left out, logged)."""
        for proc in list(self.processes):
            if not proc.ready.is_set() or not proc.alive():
                continue
            with proc.ask_lock:
                ask = next(self._asks)
                try:
                    proc.conn.send(("metrics", ask))
                    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
                    while (left := deadline - time.monotonic()) > 0:
                        got, families = proc.replies.get(timeout=left)
                        if got == ask:
                            yield families
                            break
                except (OSError, ValueError, queue.Empty):
                    log.warning("collector process %d did not answer a metrics scrape", proc.index)

    def serve(
        self,
        stop: threading.Event,
        on_ready: Callable[[int], object] | None = None,
        on_tick: Callable[[], object] | None = None,
        on_stop: Callable[[], object] | None = None,
    ) -> None:
        """Run the processes until ``stop``; raises RuntimeError when one cannot be kept running."""
        self.settings.credentials()  # a bad key or token file: its own error, before any process
        held, port = reserve_port(self.settings.listen)
        host = self.settings.listen.rpartition(":")[0]
        listen = f"{host}:{port}"
        try:
            self.processes = [self._start(i, listen) for i in range(self.count)]
            self._wait_ready(self.processes, stop)
            if stop.is_set():
                return
            if self.settings.prometheus_port is not None:
                addr = self.settings.prometheus_addr
                start_http_server(self.settings.prometheus_port, addr=addr, registry=self.registry)
            self.up.set(self.count)
            log.info(
                "collector: %d processes on port %d (pids %s)",
                self.count,
                port,
                " ".join(str(p.process.pid) for p in self.processes),
            )
            if on_ready is not None:
                on_ready(port)
            while not stop.wait(1.0):
                if on_tick is not None:
                    on_tick()
                self.live.sweep(time.monotonic())
                self._restart_dead(listen)
        finally:
            if on_stop is not None:
                on_stop()
            failed = self._stop_all()
            held.close()
        if failed:
            raise RuntimeError(f"collector processes did not stop cleanly: {'; '.join(failed)[:300]}")

    def _wait_ready(self, procs: Iterable[_Process], stop: threading.Event) -> None:
        """Until every one of ``procs`` serves (or ``stop``); RuntimeError if one dies or is late."""
        for proc in procs:
            while not proc.ready.wait(0.1) and not stop.is_set():
                self._check_starting(proc)

    def _check_starting(self, proc: _Process) -> None:
        if not proc.alive():
            proc.process.join()
            time.sleep(0.1)  # its last message (the error) may still be in the pipe
            raise RuntimeError(f"collector process {proc.index} failed to start ({proc.outcome()})")
        if time.monotonic() - proc.started > START_TIMEOUT_S:
            raise RuntimeError(f"collector process {proc.index} not serving after {START_TIMEOUT_S:g} s")

    def _restart_dead(self, listen: str) -> None:
        """Start each dead process again (without waiting for it); RuntimeError on a crash loop
        or a process that does not come up."""
        for i, proc in enumerate(self.processes):
            if proc.alive():
                if not proc.ready.is_set():
                    self._check_starting(proc)
                continue
            proc.process.join()
            now = time.monotonic()
            self._deaths = [t for t in self._deaths if now - t < RESTART_WINDOW_S] + [now]
            if len(self._deaths) > MAX_RESTARTS:
                raise RuntimeError(
                    f"collector process {i} died ({proc.outcome()}), {len(self._deaths)} deaths within "
                    f"{RESTART_WINDOW_S:g} s: giving up"
                )
            pid = proc.process.pid
            log.warning("collector process %d (pid %d) died (%s); starting it again", i, pid, proc.outcome())
            self.processes[i] = self._start(i, listen)
            self.restarts.inc()
        self.up.set(sum(p.ready.is_set() and p.alive() for p in self.processes))

    def _stop_all(self) -> list[str]:
        """SIGTERM to every process, wait for each to drain; the ones that did not exit 0."""
        for proc in self.processes:
            if proc.alive():
                proc.process.terminate()
        failed = []
        for proc in self.processes:
            proc.process.join(STOP_TIMEOUT_S)
            if proc.alive():
                proc.process.kill()
                proc.process.join()
            if proc.process.exitcode != 0:
                failed.append(f"process {proc.index}: {proc.outcome()}")
            proc.conn.close()
        return failed


class _Sum:
    """The supervisor's /metrics: its own series plus every process's, summed by name and labels."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for families in itertools.chain([list(self.supervisor.own.collect())], self.supervisor.scrape()):
            for family in families:
                if family.name not in merged:
                    merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                    values[family.name] = {}
                sums = values[family.name]
                for sample in family.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    if sample.name.endswith("_created"):  # a creation time: the earliest
                        sums[key] = min(sums.get(key, sample.value), sample.value)
                    else:
                        sums[key] = sums.get(key, 0.0) + sample.value
        for name, family in merged.items():
            family.samples = [Sample(s, dict(labels), v) for (s, labels), v in values[name].items()]
            yield family
