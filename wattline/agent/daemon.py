"""The agent process: discover sources, sample, spool, ship, export; stop cleanly."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wattline import systemd, wire
from wattline.agent import registry
from wattline.agent.assembly import UplinkSecurity, assemble, make_uplink, uplink_security
from wattline.agent.edge import EdgeServer, serve_edges
from wattline.agent.exporter import AgentCollector, serve
from wattline.agent.holders import registry as holders
from wattline.agent.holders.kube.settings import pods_settings
from wattline.agent.holders.slurm.watch import SlurmWatcher, gpu_uuids
from wattline.agent.holders.systemd.settings import systemd_settings
from wattline.agent.settings import AgentSettings
from wattline.agent.sources.base import Source
from wattline.agent.spool.base import Spool
from wattline.agent.spool.format import SpoolError
from wattline.agent.spool.outbox import OutboxDrainer, open_outbox, outbox_root
from wattline.agent.tuning.records import restore_dead, restore_dir
from wattline.agent.uplink import Uplink
from wattline.agent.usage.process_use import use_sources
from wattline.signals import set_on_signals

if TYPE_CHECKING:
    from wattline.agent.holders.kube.watcher import PodWatcher
    from wattline.agent.holders.systemd.watch import UnitWatcher

log = logging.getLogger(__name__)

#: Seconds between two passes over the job-event outbox (while a collector answers).
OUTBOX_EVERY_S = 5.0


@dataclass
class Agent:
    """A running agent; :meth:`start` then :meth:`stop` (or :func:`run_agent`, which does both)."""

    settings: AgentSettings
    doc: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        security = uplink_security(self.settings)  # bad credentials fail before anything starts
        unit_services = systemd_settings(self.doc)  # and a bad [systemd] service
        parts = assemble(self.settings, self.doc, self.env)
        self.discovery, self.host, self.spool, self.sampler = parts.discovery, parts.host, parts.spool, parts.sampler
        self.uplink = self._uplink(self.spool, security)
        self.outbox: OutboxDrainer | None = None
        try:
            root = outbox_root(self.settings.outbox_dir, self.env)
            self.outbox = OutboxDrainer(root, self.host, lambda spool: self._uplink(spool, security, quiet=True))
        except SpoolError as exc:
            log.warning("job-event outbox not drained: %s", exc)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._outbox_due = 0.0  #: monotonic time of the next look at the outbox
        self._beaten: dict[str, int] = {}  #: heartbeats sent for holders that send none (holders.tend)
        self.prometheus_port: int | None = None
        self.edges: EdgeServer | None = None
        self._previous_sighup: Any = None
        self.pods: PodWatcher | None = None  # the pods' job events go through the outbox, as every holder's
        kube = pods_settings(self.doc) if self.outbox is not None else None
        if kube is not None:
            # an HTTP client and the pod-resources gRPC stubs: loaded only where pods are on
            from wattline.agent.holders.kube.watcher import PodWatcher

            self.pods = PodWatcher(
                kube, self.host, self.settings.sysfs_root, self._to_outbox, lambda: use_sources(self._sources())
            )
        self.units: UnitWatcher | None = None  # services held by systemd units ([systemd] services)
        if unit_services is not None and self.outbox is not None:
            from wattline.agent.holders.systemd.watch import UnitWatcher

            state = self.outbox.root / "units"  # each unit's open job, across the agent's restarts
            self.units = UnitWatcher(unit_services, self.host, self.settings.sysfs_root, self._to_outbox, state=state)
        self.slurm = (  # a Slurm job's lines and how it ended, between and after its hooks
            SlurmWatcher(
                self.outbox.root,
                Path(self.settings.slurm_dir),
                self.host,
                self._to_outbox,
                self.settings.sysfs_root,
                gpus=self._gpu_uuids,
                use_sources=lambda: use_sources(self.sources),
            )
            if self.outbox is not None
            else None
        )

    def _uplink(self, spool: Spool, security: UplinkSecurity, quiet: bool = False) -> Uplink:
        return make_uplink(spool, self.settings, security, quiet=quiet)

    @property
    def statuses(self) -> list[registry.SourceStatus]:
        """Each source's outcome of the latest discovery."""
        return self.discovery.statuses

    @property
    def sources(self) -> list[Source]:
        return self.discovery.sources

    def alive(self) -> bool:
        """True while the sampler keeps ticking (feeds the systemd watchdog only then)."""
        stale_after = max(5 * self.settings.interval, 10.0)
        return time.monotonic() - self.sampler.last_tick_monotonic < stale_after

    def source_up(self) -> dict[str, bool]:
        """Per source: present and its last read did not fail."""
        return {s.name: s.available and s.name not in self.sampler.source_errors for s in self.statuses}

    def start(self) -> None:
        """Put back what a dead sweep changed (``python -m wattline.agent`` runs no ``wattline``
        command that would), then start sampling, shipping and (if configured) the Prometheus
        endpoint."""
        if self.outbox is not None:
            restore_dead(restore_dir(self.outbox.root))
        if self.settings.prometheus_port is not None:
            collector = AgentCollector(self.sampler, self.spool, self.source_up, self.uplink, self.discovery)
            self.prometheus_port = serve(collector, self.settings.prometheus_port, self.settings.prometheus_addr)
            log.info("prometheus metrics on http://%s:%d/metrics", self.settings.prometheus_addr, self.prometheus_port)
        self.sampler.tick()  # baseline readings before the first interval
        self.edges = serve_edges(self.settings.edge_socket, self.sampler.edge_tick, self.settings.sysfs_root, self.env)
        if threading.current_thread() is threading.main_thread():  # SIGHUP: rediscover the sources now
            self._previous_sighup = signal.signal(signal.SIGHUP, lambda *_: self.discovery.request())
        for name, target in (
            ("sampler", lambda: self.sampler.run(self.settings.interval, self._stop, self.discovery)),
            ("uplink", lambda: self.uplink.run(self._stop, self._look_at_outbox)),
        ):
            self._spawn(name, target)
        if self.pods is not None:
            self._spawn("pods", lambda: self.pods.run(self._stop) if self.pods else None)
        if self.units is not None:
            self._spawn("units", lambda: self.units.run(self._stop) if self.units else None)
        if self.slurm is not None:
            self._spawn("slurm", lambda: self.slurm.run(self._stop) if self.slurm else None)
        if self.outbox is not None:
            log.info("delivering job events that runs left in the outbox %s", self.outbox.root)
        log.info(
            "agent %s (stream %s) sampling every %.3g s, shipping to %s%s; spool: %s",
            self.host.host_id,
            self.spool.stream_id,
            self.settings.interval,
            ", ".join(self.settings.collectors),
            " over TLS" if self.settings.uses_tls else "",
            self.spool.where,
        )

    def _spawn(self, name: str, target: Callable[[], object]) -> None:
        thread = threading.Thread(target=target, name=f"wattline-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _sources(self) -> list[Source]:
        return self.discovery.sources

    def _gpu_uuids(self) -> dict[int, str]:
        """This node's GPUs by NVML index, from the discovered channels."""
        return gpu_uuids(ch for status in self.statuses for ch in status.channels)

    def _look_at_outbox(self) -> None:
        """Between the uplink's pushes (a collector answers): every OUTBOX_EVERY_S, end the jobs
        of this host whose holder is gone (:mod:`.holders`), heartbeat those whose live holder
        sends none (a Slurm job's slurmd), then a pass over the job events that
        ended or killed runs (``wattline run``) left on this host, on a thread of its own while
        it lasts."""
        now = time.monotonic()
        if self.outbox is None or now < self._outbox_due:
            return
        self._outbox_due = now + OUTBOX_EVERY_S
        try:
            holders.end_dead(self.outbox.root, self._held_here, self._to_outbox)
            restore_dead(restore_dir(self.outbox.root))  # a sweep killed while the agent runs
            holders.tend(self.outbox.root, self._held_here, self._to_outbox, self._beaten)
            self.outbox.start_pass(self._stop)
        except Exception:  # a bug here must not end the agent's own delivery
            log.exception("outbox: pass over %s failed", self.outbox.root)

    def _held_here(self, record: holders.HolderRecord) -> bool:
        return record.sink == "collector" and record.host_id == self.host.host_id

    def _to_outbox(self, host: wire.pb.Host, events: list[wire.pb.JobEvent]) -> None:
        """Keep ``events`` in an outbox directory of their own: the pass that follows delivers them."""
        assert self.outbox is not None
        spool = open_outbox(self.outbox.root, host)
        try:
            spool.add_job_events(events)
        finally:
            spool.close()

    def stop(self, flush_s: float = 5.0) -> bool:
        """Stop sampling, deliver what is left (up to ``flush_s``), close sources."""
        self._stop.set()
        if self._previous_sighup is not None:
            signal.signal(signal.SIGHUP, self._previous_sighup)
            self._previous_sighup = None
        if self.edges is not None:
            self.edges.close()
        for thread in self._threads:
            thread.join(timeout=10)
        if self.outbox is not None:
            self.outbox.join(10)
        self.sampler.tick(final=True)  # the last partial interval
        delivered = self.uplink.flush(flush_s)
        left = self.spool.backlog()
        if not delivered:
            fate = "lost (in-memory spool)" if self.spool.where == "memory" else f"kept in {self.spool.where}"
            log.warning("%d batches not acknowledged at shutdown: %s", left, fate)
        log.info(
            "agent stopped: %d samples produced, %d acknowledged, %d dropped, %d batches left",
            self.sampler.samples_emitted,
            self.spool.acked_samples,
            self.spool.dropped_samples,
            left,
        )
        self.uplink.close()
        self.spool.close()
        self._close_sources()
        return delivered

    def _close_sources(self) -> None:
        self.discovery.close()

    def wait(
        self, stop: threading.Event, on_tick: Callable[[], object] | None = None, every_s: float | None = 1.0
    ) -> None:
        """Block until ``stop`` is set, calling ``on_tick`` (e.g. the systemd watchdog) every ``every_s``.

        ``every_s`` None: no call and no wake-up at all (a wake-up a second is a visible part
        of a 1 Hz agent's CPU, spent for nothing when no one needs the call); signal handlers
        still run, the wait is interrupted for them.
        """
        if every_s is None:
            stop.wait()
            return
        while not stop.wait(every_s):
            if on_tick is not None:
                on_tick()


def run_agent(settings: AgentSettings, doc: Mapping[str, Any] | None = None) -> None:
    """The agent process: start, tell systemd, run until SIGTERM or SIGINT, deliver what is left, stop.

    ``wattline agent`` and ``python -m wattline.agent`` both end here."""
    stop = threading.Event()
    set_on_signals(stop)
    agent = Agent(settings, doc or {})
    agent.start()
    found = sum(1 for s in agent.statuses if s.available)
    systemd.ready(f"sampling {found} sources every {settings.interval:g} s")
    agent.wait(stop, on_tick=lambda: agent.alive() and systemd.watchdog(), every_s=systemd.watchdog_interval())
    systemd.stopping()
    agent.stop()
