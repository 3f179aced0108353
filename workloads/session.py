"""Where a job's events (and, when embedded, its samples) go.

- :class:`EmbeddedSession`: no collector. Samples this host in-process with the same
  sources as the agent and writes samples and job events to a local store (SQLite by
  default). This is what ``wattline run`` does on a fresh machine.
- :class:`CollectorSink`: a host agent samples; job events go to the collector over the
  same wire, in batches acknowledged like samples.
- :class:`ParentSink`: inside a process started by ``wattline run``: events go to the
  parent through the events file, so the job is joined, not opened twice.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from wattline import __version__, wire
from wattline.agent import registry
from wattline.agent.daemon import host_identity, uplink_security
from wattline.agent.sampler import Sampler
from wattline.agent.settings import AgentSettings
from wattline.agent.spool import Spool
from wattline.agent.uplink import Uplink
from wattline.collector.stores.base import Store, StoreUnavailable
from wattline.workloads.events import append_event_line

log = logging.getLogger(__name__)


class EventSink(Protocol):
    """Receives job events; ``close`` delivers what is left."""

    host_id: str

    def send(self, events: list[wire.pb.JobEvent]) -> None: ...

    def close(self) -> None: ...


class EmbeddedSession:
    """In-process sampling + local store: an agent and a collector in one process."""

    def __init__(self, store: Store, settings: AgentSettings, doc: Mapping[str, Any] | None = None) -> None:
        self.store = store
        self.settings = settings
        self.discovery = registry.Discovery(
            settings.sources,
            settings.sysfs_root,
            doc,
            interval_s=settings.interval,
            every_s=settings.rediscover_interval,
        )
        host = host_identity(settings, self.discovery.statuses)
        self.host_id = host.host_id
        self.spool = Spool(host, max_batch_samples=settings.batch_max_samples, max_batches=settings.spool_max_batches)
        self.sampler = Sampler(self.discovery.sources, self.spool.add_samples)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.write_errors = 0

    def start(self) -> None:
        self.sampler.tick()
        for name, target in (("sampler", self._sample), ("writer", self._write_loop)):
            thread = threading.Thread(target=target, name=f"wattline-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _sample(self) -> None:
        self.sampler.run(self.settings.interval, self._stop, self.discovery)

    def _write_loop(self) -> None:
        while not self._stop.wait(self.settings.batch_interval):
            self.deliver()

    def deliver(self) -> None:
        """Write every sealed batch to the store; keep it on failure (retried later)."""
        self.spool.seal()
        while (batch := self.spool.peek()) is not None:
            try:
                self.store.write(batch)
            except StoreUnavailable as exc:
                self.write_errors += 1
                log.warning("local store write failed, will retry: %s", exc)
                return
            self.spool.ack(batch.seq)

    def send(self, events: list[wire.pb.JobEvent]) -> None:
        self.spool.add_job_events(events)

    def close(self) -> None:
        """Take the last partial interval, write everything, release sources."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self.sampler.tick(final=True)
        self.deliver()
        self.discovery.close()


class CollectorSink:
    """Job events to a collector (the host's agent sends the samples).

    ``settings`` gives the collector addresses, the host identity (it must match the
    host agent's) and the same TLS / token settings as the agent.
    """

    def __init__(self, settings: AgentSettings) -> None:
        security = uplink_security(settings)
        self.host_id = settings.host_id or socket.gethostname()
        host = wire.Host(host_id=self.host_id, labels=dict(settings.labels), agent_version=__version__)
        self.spool = Spool(host)
        self.uplink = Uplink(
            self.spool,
            settings.collectors,
            batch_interval_s=0.5,
            credentials=security.credentials,
            token=security.token,
            server_name=security.server_name,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.uplink.run, args=(self._stop,), daemon=True)
        self._thread.start()

    def send(self, events: list[wire.pb.JobEvent]) -> None:
        self.spool.add_job_events(events)

    def close(self, deadline_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if not self.uplink.flush(deadline_s):
            raise ConnectionError(
                f"job events not acknowledged by {', '.join(self.uplink.addresses)}: {self.uplink.last_error}"
            )
        self.uplink.close()


class ParentSink:
    """Inside ``wattline run``: report through the parent's events file."""

    def __init__(self, path: Path, host_id: str = "") -> None:
        self.path = path
        self.host_id = host_id or socket.gethostname()

    def send(self, events: list[wire.pb.JobEvent]) -> None:
        for event in events:
            stamp = f" {event.time_ns / 1e9:.6f}"
            if event.kind == wire.pb.JobEvent.KIND_UNITS:
                append_event_line(f"units {event.units!r}{stamp}", str(self.path))
            elif event.kind == wire.pb.JobEvent.KIND_PHASE:
                append_event_line(f"phase {event.phase}{stamp}", str(self.path))

    def close(self) -> None:
        return None
