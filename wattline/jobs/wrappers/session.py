"""Where a job's events (and, when embedded, its samples) go.

- :class:`EmbeddedSession`: no collector. Samples this host in-process with the same
  sources as the agent and writes samples and job events to a local store (SQLite by
  default). This is what ``wattline run`` does on a fresh machine.
- :class:`CollectorSink`: a host agent samples; job events go to the collector over the
  same wire, in batches acknowledged like samples, kept in the host's outbox on disk
  until then (never lost when no collector answers, never holding the command's exit).
- :class:`ParentSink`: inside a process started by ``wattline run``: events go to the
  parent through the events file, so the job is joined, not opened twice.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from wattline import __version__, wire
from wattline.agent.assembly import assemble, make_uplink, uplink_security
from wattline.agent.edge import ask_edge_tick, socket_places
from wattline.agent.holders import registry as holders
from wattline.agent.settings import AgentSettings
from wattline.agent.spool.base import Spool
from wattline.agent.spool.format import SpoolError
from wattline.agent.spool.memory import MemorySpool
from wattline.agent.spool.outbox import OutboxDrainer, open_outbox, outbox_root, remove
from wattline.agent.uplink import Uplink
from wattline.jobs.events import append_event_line
from wattline.jobs.wrappers.live import PowerMeter
from wattline.stores.base import Store, StoreUnavailable
from wattline.text import one_line

log = logging.getLogger(__name__)

#: Seconds ``CollectorSink.close`` waits for a collector: the command's exit status is
#: returned at most this long (plus a push) after it ended, whatever the collector does.
FLUSH_S = 3.0


class EventSink(Protocol):
    """Receives job events; ``close`` delivers what is left."""

    host_id: str

    def send(self, events: list[wire.pb.JobEvent]) -> None: ...

    def edge_tick(self) -> int | None:
        """The time stamp (ns) of a reading of every channel taken now, for a job's open or
        close event; None when none can be taken (the event then takes the clock's time)."""
        ...

    def close(self) -> None: ...


class EmbeddedSession:
    """In-process sampling + local store: an agent and a collector in one process."""

    def __init__(self, store: Store, settings: AgentSettings, doc: Mapping[str, Any] | None = None) -> None:
        self.store = store
        self.settings = settings
        self.meter = PowerMeter()  # power now and energy so far, for the live line
        parts = assemble(settings, doc, memory=True, tap=self.meter.wrap)
        self.discovery, self.spool, self.sampler = parts.discovery, parts.spool, parts.sampler
        self.host_id = parts.host.host_id
        self.host = parts.host
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.write_errors = 0
        self.holders_root = _holders_root(settings)
        self.holder_sink = store_key(store)
        self.ended: list[holders.HolderRecord] = []
        self._holdings: list[holders.Holding] = []

    def start(self) -> None:
        if self.holder_sink:  # before our own job opens: a dead run's job must not share this one
            self.ended = holders.end_dead(self.holders_root, self._same_store, self._write_events)
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

    def renew(self, holding: holders.Holding) -> None:
        """Renew ``holding`` as samples reach the store: were this process killed, the job it
        holds would end where its stored samples end (the samples it held in memory die with it)."""
        self._holdings.append(holding)

    def deliver(self) -> None:
        """Write every sealed batch to the store; keep it on failure (retried later)."""
        self.spool.seal()
        stored_to = 0
        while (batch := self.spool.peek()) is not None:
            try:
                self.store.write(batch)
            except StoreUnavailable as exc:
                self.write_errors += 1
                log.warning("local store write failed, will retry: %s", exc)
                break
            self.spool.ack(batch.seq)
            stored_to = max([stored_to, *(s.end_ns for s in batch.samples)])
        if stored_to:
            for holding in self._holdings:
                holding.alive_at(stored_to)

    def _same_store(self, record: holders.HolderRecord) -> bool:
        return record.sink == self.holder_sink

    def _write_events(self, host: wire.pb.Host, events: list[wire.pb.JobEvent]) -> None:
        result = self.store.write(wire.Batch(host=host, job_events=events))
        if result.rejected:
            raise ValueError("; ".join(result.reasons) or "refused by the store")

    def send(self, events: list[wire.pb.JobEvent]) -> None:
        self.spool.add_job_events(events)

    def edge_tick(self) -> int:
        """This process samples: it ticks now, beside its sampling thread."""
        return self.sampler.edge_tick()

    def close(self) -> None:
        """Take the last partial interval, write everything, release sources."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self.sampler.tick(final=True)
        self.deliver()
        self.discovery.close()


class CollectorSink:
    """Job events to a collector (the host's agent sends the samples), through the host's outbox.

    ``settings`` gives the collector addresses, the host identity (it must match the
    host agent's), the same TLS / token settings as the agent, and ``outbox_dir``. Every
    event is written to this process's outbox directory (:mod:`wattline.agent.spool.outbox`)
    before it is sent, and deleted only once a collector acknowledged it. Once a
    collector answers, what dead processes left in the outbox is delivered too.
    :meth:`close` waits at most ``flush_s``; undelivered events stay in the outbox and
    ``kept`` (also passed to ``on_kept``) is the one line that says where.
    """

    def __init__(
        self, settings: AgentSettings, flush_s: float = FLUSH_S, on_kept: Callable[[str], None] | None = None
    ) -> None:
        security = uplink_security(settings)
        self.host_id = settings.host_id or socket.gethostname()
        self.edge_sockets = [place.path for place in socket_places(settings.edge_socket, settings.sysfs_root)]
        self.flush_s = flush_s
        self.on_kept = on_kept
        self.kept: str | None = None
        host = self.host = wire.Host(host_id=self.host_id, labels=dict(settings.labels), agent_version=__version__)

        def uplink_for(spool: Spool) -> Uplink:
            return make_uplink(
                spool,
                settings,
                security,
                timeout_s=min(settings.push_timeout, max(flush_s, 1.0)),
                batch_interval_s=0.5,
                quiet=True,  # close() says it in one line
            )

        self.directory: Path | None = None
        self.outbox_error = ""
        self.holders_root: Path | None = None
        self.holder_sink = "collector"
        self.ended: list[holders.HolderRecord] = []
        drainer = None
        try:
            root = outbox_root(settings.outbox_dir)
            self.holders_root = root
            outbox = open_outbox(root, host)
            self.spool: Spool = outbox
            self.directory = outbox.directory
            drainer = OutboxDrainer(root, host, uplink_for, own=self.directory)
        except SpoolError as exc:
            self.outbox_error = str(exc)
            log.warning("job events kept in memory only (lost if not delivered): %s", exc)
            self.spool = MemorySpool(host)
        self.uplink = uplink_for(self.spool)
        # Before our own job opens: a dead run's job must not share this one. Its close goes
        # through our outbox, delivered with our events.
        self.ended = holders.end_dead(self.holders_root, self._this_host, lambda _host, events: self.send(events))
        self._stop = threading.Event()
        self._drain_stop = threading.Event()
        self._thread = threading.Thread(target=self.uplink.run, args=(self._stop,), daemon=True)
        self._thread.start()
        self._drainer: threading.Thread | None = None
        if drainer is not None:
            self._drainer = threading.Thread(target=self._deliver_leftovers, args=(drainer,), daemon=True)
            self._drainer.start()

    def _deliver_leftovers(self, drainer: OutboxDrainer) -> None:
        """Once a collector acknowledged one of our batches: one pass over what dead processes left."""
        while not self._drain_stop.wait(0.1):
            if self.uplink.connected:
                drainer.drain_once(self._drain_stop)
                return

    def _this_host(self, record: holders.HolderRecord) -> bool:
        return record.sink == self.holder_sink and record.host_id == self.host_id

    def send(self, events: list[wire.pb.JobEvent]) -> None:
        self.spool.add_job_events(events)

    def edge_tick(self) -> int | None:
        """The host agent samples: it is asked to tick now (a few ms at most; None without one)."""
        return ask_edge_tick(self.edge_sockets)

    def close(self) -> None:
        """Deliver what is left within ``flush_s``, then leftovers of dead processes in the rest of it."""
        end = time.monotonic() + self.flush_s
        self._stop.set()
        self._thread.join(timeout=self.flush_s)
        delivered = False
        if not self._thread.is_alive():
            self.uplink.timeout_s = max(0.2, min(self.uplink.timeout_s, end - time.monotonic()))
            delivered = self.uplink.flush(max(0.0, end - time.monotonic()))
        if self._drainer is not None:
            if delivered:
                self._drainer.join(timeout=max(0.0, end - time.monotonic()))
            self._drain_stop.set()
            self._drainer.join(timeout=max(0.1, end - time.monotonic()))
        self.uplink.close()
        self.spool.close()
        if delivered:
            if self.directory is not None:
                remove(self.directory)
            return
        why = one_line(self.uplink.last_error) or f"no acknowledgement within {self.flush_s:g} s"
        if self.directory is not None:
            self.kept = (
                f"collector unreachable ({why}); job events kept in {self.directory}, "
                "delivered by the next wattline process that reaches a collector"
            )
        else:
            self.kept = f"collector unreachable ({why}); job events lost: no outbox ({one_line(self.outbox_error)})"
        if self.on_kept is not None:
            self.on_kept(self.kept)
        else:
            log.warning("wattline: %s", self.kept)


def _holders_root(settings: AgentSettings) -> Path | None:
    try:
        return outbox_root(settings.outbox_dir)
    except SpoolError:
        return None


def store_key(store: Store) -> str:
    """What a holder record says of an embedded job's store, so that only a process writing the
    same store ends it: its kind and file (or URL); empty when the store names neither."""
    where = str(getattr(store, "path", "") or getattr(store, "url", ""))
    if not where or where == ":memory:":
        return ""
    if store.kind == "sqlite":
        where = os.path.realpath(where)
    return f"store:{store.kind}:{where}"


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

    def edge_tick(self) -> None:
        """The parent ``wattline run`` holds the job's edges."""
        return None

    def close(self) -> None:
        return None
