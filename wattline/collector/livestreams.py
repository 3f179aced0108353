"""Two live agent streams under one host id: noticed, logged once, exported as a metric.

A host id is meant to have one agent. When two send samples at once (a second agent
started by mistake, a DaemonSet beside a systemd unit, a container restart whose old and
new agents overlap), their streams cover the same time; reports count that time once
(:mod:`wattline.accounting.streams`), and the operator should hear of it. A plain restart
(the old stream stops, a new one starts after it) is not a duplicate: the streams'
sample times follow each other.

Per host, the streams that sent samples in the last ``timeout_s`` are kept with the span
of sample time they sent (first start to last end, from each batch's first and last
sample: no per-sample work). A host is flagged when two of its live streams' spans
overlap: one warning log line, ``wattline_collector_duplicate_streams{host}`` set to the
number of such streams and ``wattline_collector_hosts_with_duplicate_streams`` counting
it. It is cleared (series removed, one info line) once only one of them is still live.
Memory: at most ``per_host`` streams per host (the least recently heard is forgotten
first), hosts without a live stream are dropped by :meth:`LiveStreams.sweep`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge

from wattline import wire

log = logging.getLogger(__name__)


@dataclass
class _Span:
    """Sample time one stream sent, and when it was last heard (monotonic seconds)."""

    start_ns: int
    end_ns: int
    heard: float


def batch_span(batch: wire.pb.Batch) -> tuple[int, int] | None:
    """The sample time a batch covers, from its first and last sample; None without samples
    (job events only: `wattline run --collector`, the Job API: not a sampler)."""
    if not batch.samples:
        return None
    first, last = batch.samples[0], batch.samples[-1]
    return min(first.start_ns, last.start_ns), max(first.end_ns, last.end_ns)


def duplicate_gauges(registry: CollectorRegistry) -> tuple[Gauge, Gauge]:
    """The two gauges a :class:`LiveStreams` sets: streams per flagged host, flagged hosts."""
    per_host = Gauge(
        "wattline_collector_duplicate_streams",
        "Live agent streams of one host id sending samples of the same time (only hosts that have them).",
        ["host"],
        registry=registry,
    )
    hosts = Gauge(
        "wattline_collector_hosts_with_duplicate_streams",
        "Host ids with more than one live agent stream sending samples of the same time.",
        registry=registry,
    )
    return per_host, hosts


class StreamWatch(Protocol):
    """What ingest tells about the streams it hears: :class:`LiveStreams`, or a relay to it."""

    def seen(self, batch: wire.pb.Batch, now: float) -> None: ...

    def sweep(self, now: float) -> None: ...


def _overlapping(spans: dict[str, _Span]) -> int:
    """How many of ``spans`` overlap at least one other."""
    items = list(spans.values())
    return sum(any(o is not s and s.start_ns < o.end_ns and o.start_ns < s.end_ns for o in items) for s in items)


class LiveStreams:
    """Notices hosts with more than one live stream sending overlapping sample times."""

    def __init__(self, per_host: Gauge, hosts: Gauge, *, timeout_s: float, max_streams: int = 4) -> None:
        self.per_host = per_host
        self.hosts = hosts
        self.timeout_s = timeout_s
        self.max_streams = max_streams
        self._spans: dict[str, dict[str, _Span]] = {}
        self._flagged: dict[str, int] = {}
        self._lock = threading.Lock()

    def seen(self, batch: wire.pb.Batch, now: float) -> None:
        """Account one batch (O(streams of its host)); batches without samples are ignored."""
        span = batch_span(batch)
        if span is not None:
            self.span(batch.host.host_id, batch.stream_id, span[0], span[1], now)

    def span(self, host: str, stream_id: str, start: int, end: int, now: float) -> None:
        """Account sample time ``start..end`` (ns) sent by ``stream_id`` of ``host``."""
        with self._lock:
            spans = self._spans.setdefault(host, {})
            span = spans.get(stream_id)
            if span is None:
                spans[stream_id] = _Span(start, end, now)
                while len(spans) > self.max_streams:
                    del spans[min(spans, key=lambda k: spans[k].heard)]
            else:
                span.start_ns, span.end_ns, span.heard = min(span.start_ns, start), max(span.end_ns, end), now
            count = 0
            if len(spans) > 1:  # the common case, one stream per host, stops here
                self._expire(spans, now)
                count = _overlapping(spans)
            newly = count > 1 and host not in self._flagged
            if count > 1 and self._flagged.get(host) != count:
                self._flagged[host] = count
                self.per_host.labels(host).set(count)
                self.hosts.set(len(self._flagged))
        if newly:
            log.warning(
                "host %r: %d agent streams send samples of the same time (a second agent under this host id?); "
                "reports count that time once",
                host[:100],
                count,
            )

    def sweep(self, now: float) -> None:
        """Forget streams not heard for ``timeout_s`` and hosts without one; clear hosts no longer flagged."""
        cleared: list[str] = []
        with self._lock:
            for host in list(self._spans):
                spans = self._spans[host]
                self._expire(spans, now)
                if not spans:
                    del self._spans[host]
                if host in self._flagged and _overlapping(spans) < 2:
                    del self._flagged[host]
                    self.per_host.remove(host)
                    cleared.append(host)
            if cleared:
                self.hosts.set(len(self._flagged))
        for host in cleared:
            log.info("host %r: one agent stream again", host[:100])

    def _expire(self, spans: dict[str, _Span], now: float) -> None:
        for stream in [k for k, s in spans.items() if now - s.heard > self.timeout_s]:
            del spans[stream]
