"""A collector process for the benchmarks: the real gRPC server over a null or timed store.

Usage: ``python -m wlbench.sink --listen 127.0.0.1:PORT --stats FILE [--store null|encode|URL]``

- ``null``: counts samples per host and discards them (agent-overhead runs: the collector
  should cost the machine as little as possible; the scale part's yardstick: the gRPC
  server and its admission path with no store behind them, delays to the acknowledgement).
- ``encode``: encodes every batch with the real :class:`LineEncoder`, then discards the lines
  (decode + encode through gRPC, per core).
- ``sqlite:PATH``, ``http://influxd:8086`` or ``http://victoria-metrics:8428``: the real store
  (with the collector's replay log where the store acknowledges before it is durable);
  after each write, the delay from every sample's interval end to the end of the write is
  recorded (committed for SQLite, acknowledged by ``/write`` for InfluxDB and VictoriaMetrics:
  visible in storage for the first two, searchable about a second later in the third).

On SIGTERM the server stops (in-flight batches finish) and FILE gets JSON: samples per host,
points written, delay percentiles and histogram (``--steady-after S``: also the histogram of
the samples stamped S seconds or more after the first one it saw). With ``--reuse-port`` several sinks share
the port as ``wattline collector --processes`` does (their FILEs are merged by the caller).
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from wattline import wire
from wattline.collector.replay import Replaying, ReplayLog, log_directory
from wattline.collector.server import CollectorServer
from wattline.stores.base import Store, WriteResult
from wattline.stores.factory import open_store
from wattline.stores.lineprotocol import LineEncoder


class BenchStore(Store):
    """Wraps a store (or none): counts samples per host, records sample-to-commit delays."""

    kind = "bench"

    def __init__(self, inner: Store | None, encode: bool, steady_after_s: float = 0.0) -> None:
        self.inner = inner
        self.max_concurrent_writes = inner.max_concurrent_writes if inner is not None else 0
        self.encoder = LineEncoder() if encode else None
        self.by_host: Counter[str] = Counter()
        self.points = 0
        self.batches = 0
        self.rejected = 0
        self.delays_ms: list[float] = []
        #: The delays of samples stamped ``steady_after_s`` or more after the first one seen.
        self.steady_ms: list[float] = []
        self.steady_after_ns = int(steady_after_s * 1e9)
        self.first_ns: int | None = None
        self.per_second: Counter[int] = Counter()  #: samples committed per wall-clock second
        self._lock = threading.Lock()

    def write(self, batch: wire.pb.Batch) -> WriteResult:
        return self.write_group([batch])[0]

    def write_group(self, batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
        if self.inner is not None:
            results = self.inner.write_group(batches)
        elif self.encoder is not None:
            encoded = [self.encoder.batch(b) for b in batches]
            results = [WriteResult(len(e.lines), len(e.rejected), e.rejected) for e in encoded]
        else:
            results = [WriteResult(len(b.samples) + len(b.job_events)) for b in batches]
        done_ns = time.time_ns()
        delays = [(done_ns - s.end_ns) / 1e6 for b in batches for s in b.samples] if self.encoder is None else []
        with self._lock:
            if self.steady_after_ns and delays:
                ends = [s.end_ns for b in batches for s in b.samples]
                self.first_ns = min(ends) if self.first_ns is None else min(self.first_ns, *ends)
                after = self.first_ns + self.steady_after_ns
                self.steady_ms += [d for d, end in zip(delays, ends, strict=True) if end >= after]
            for batch, result in zip(batches, results, strict=True):
                self.by_host[batch.host.host_id] += len(batch.samples)
                self.points += result.written
                self.batches += 1
                self.rejected += result.rejected
                self.per_second[done_ns // 10**9] += len(batch.samples)
            self.delays_ms += delays
        return results

    def stats(self) -> dict[str, object]:
        with self._lock:
            delays = sorted(self.delays_ms)

        def pct(p: float) -> float | None:
            return delays[min(len(delays) - 1, int(p / 100 * len(delays)))] if delays else None

        return {
            "by_host": dict(self.by_host),
            "points": self.points,
            "batches": self.batches,
            "rejected": self.rejected,
            "delay_ms": {"count": len(delays), "p50": pct(50), "p99": pct(99), "max": delays[-1] if delays else None},
            "delay_hist_ms": histogram(delays),
            "steady_delay_hist_ms": histogram(self.steady_ms),
            "per_second": {str(k): v for k, v in sorted(self.per_second.items())},
        }

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def histogram(delays_ms: list[float]) -> dict[str, int]:
    """Whole milliseconds -> samples, so the delays of several sink processes merge."""
    return {str(k): v for k, v in sorted(Counter(int(d) for d in delays_ms).items())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--stats", required=True, type=Path)
    ap.add_argument("--store", default="null")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--reuse-port", action="store_true", help="share the port with other sinks (SO_REUSEPORT)")
    ap.add_argument("--steady-after", type=float, default=0.0, help="also the delays of samples this many s in")
    args = ap.parse_args()
    if args.store in ("null", "encode"):
        store = BenchStore(None, encode=args.store == "encode")
    else:  # a real store: sqlite:PATH, or an InfluxDB or VictoriaMetrics URL (told apart by its /ping)
        inner = open_store(args.store)
        if inner.durable_after_s > 0:  # as `wattline collector` keeps it: a replay log beside the stats
            log = ReplayLog(log_directory(args.stats.parent / "replay", args.store), inner.durable_after_s, 256 << 20)
            inner = Replaying(inner, log)
        store = BenchStore(inner, encode=False, steady_after_s=args.steady_after)
    server = CollectorServer(
        store, args.listen, workers=args.workers, max_message_bytes=64 << 20, reuse_port=args.reuse_port
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    gc.freeze()  # as the collector's daemon does after startup
    stop.wait()
    server.stop(5.0)
    args.stats.write_text(json.dumps(store.stats()))
    store.close()


if __name__ == "__main__":
    main()
