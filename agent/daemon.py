"""The agent process: discover sources, sample, spool, ship, export; stop cleanly."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from wattline import __version__, wire
from wattline.agent import registry
from wattline.agent.exporter import AgentCollector, serve
from wattline.agent.sampler import Sampler
from wattline.agent.settings import AgentSettings
from wattline.agent.spool import Spool
from wattline.agent.uplink import Uplink

log = logging.getLogger(__name__)


def host_identity(settings: AgentSettings, statuses: list[registry.SourceStatus]) -> wire.pb.Host:
    """Host id (configured or hostname) and labels (sources' discoveries, then config)."""
    labels: dict[str, str] = {}
    for status in statuses:
        host_labels = getattr(status.source, "host_labels", None)
        if callable(host_labels):
            labels.update(host_labels())
    labels.update(settings.labels)
    return wire.Host(host_id=settings.host_id or socket.gethostname(), labels=labels, agent_version=__version__)


def log_statuses(statuses: list[registry.SourceStatus]) -> None:
    """One line per source: what it measures, or why it is absent."""
    for status in statuses:
        if status.available:
            qualities = sorted({ch.quality.value for ch in status.channels})
            log.info("source %s: %d channels (%s)", status.name, len(status.channels), ", ".join(qualities))
        else:
            log.info("source %s: absent: %s", status.name, status.reason)
        for note in status.notes:
            log.log(
                logging.WARNING if note.level == "warning" else logging.INFO, "source %s: %s", status.name, note.text
            )


@dataclass
class Agent:
    """A running agent; :meth:`start` then :meth:`stop` (or :func:`run_agent`)."""

    settings: AgentSettings
    doc: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        self.statuses = registry.discover(self.settings.sources, self.settings.sysfs_root, self.doc, self.env)
        log_statuses(self.statuses)
        self.sources = [s.source for s in self.statuses if s.source is not None]
        self.host = host_identity(self.settings, self.statuses)
        self.spool = Spool(
            self.host,
            max_batch_samples=self.settings.batch_max_samples,
            max_batches=self.settings.spool_max_batches,
        )
        self.sampler = Sampler(self.sources, self.spool.add_samples)
        self.uplink = Uplink(
            self.spool,
            self.settings.collectors,
            timeout_s=self.settings.push_timeout,
            batch_interval_s=self.settings.batch_interval,
        )
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.prometheus_port: int | None = None

    def alive(self) -> bool:
        """True while the sampler keeps ticking (feeds the systemd watchdog only then)."""
        stale_after = max(5 * self.settings.interval, 10.0)
        return time.monotonic() - self.sampler.last_tick_monotonic < stale_after

    def source_up(self) -> dict[str, bool]:
        """Per source: present and its last read did not fail."""
        return {s.name: s.available and s.name not in self.sampler.source_errors for s in self.statuses}

    def start(self) -> None:
        """Start sampling, shipping and (if configured) the Prometheus endpoint."""
        if self.settings.prometheus_port is not None:
            collector = AgentCollector(self.sampler, self.spool, self.source_up)
            self.prometheus_port = serve(collector, self.settings.prometheus_port, self.settings.prometheus_addr)
            log.info("prometheus metrics on http://%s:%d/metrics", self.settings.prometheus_addr, self.prometheus_port)
        self.sampler.tick()  # baseline readings before the first interval
        for name, target in (
            ("sampler", lambda: self.sampler.run(self.settings.interval, self._stop)),
            ("uplink", lambda: self.uplink.run(self._stop)),
        ):
            thread = threading.Thread(target=target, name=f"wattline-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info(
            "agent %s sampling every %.3g s, shipping to %s",
            self.host.host_id,
            self.settings.interval,
            ", ".join(self.settings.collectors),
        )

    def stop(self, flush_s: float = 5.0) -> bool:
        """Stop sampling, deliver what is left (up to ``flush_s``), close sources."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self.sampler.tick()  # the last partial interval
        delivered = self.uplink.flush(flush_s)
        if not delivered:
            log.warning("%d batches not acknowledged at shutdown", self.spool.backlog())
        self.uplink.close()
        for source in self.sources:
            source.close()
        return delivered

    def wait(self, stop: threading.Event, on_tick: Callable[[], object] | None = None, every_s: float = 1.0) -> None:
        """Block until ``stop`` is set, calling ``on_tick`` (e.g. the systemd watchdog)."""
        while not stop.wait(every_s):
            if on_tick is not None:
                on_tick()
