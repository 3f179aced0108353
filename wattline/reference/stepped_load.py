"""Open-loop load at stepped rates against an HTTP inference service, and the service's capacity
(``wattline workload load``).

:func:`run_steps` sends ``POST URL`` with ``{"documents": N}`` at each step's target rate
(Poisson or evenly spaced arrivals, seeded) for the step's seconds, from a pool of keep-alive
connections, whatever the answers' latency: open loop, as users arrive. Between steps it waits
until every request sent has its answer or error, then calls ``on_edge``: nothing is in flight
there, so a window's requests are sent and answered inside it, and a scrape of the service's
counters at each edge splits them exactly as the client counted them.

:func:`measure_capacity` finds the rate a service sustains: closed-loop clients (the inference
workload's :func:`~.loadgen.run_level`), their number doubling until throughput gains less
than ``min_gain`` (:func:`~.loadgen.knee`). A step of ``25%`` is a quarter of that.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, urlsplit

from wattline.config import ConfigError
from wattline.reference.common import latency_summary
from wattline.reference.loadgen import Config, doubling, knee, run_level
from wattline.text import clip
from wattline.units import parse_duration

ARRIVALS = ("poisson", "fixed")
LOAD_SCHEMA = "wattline.load/1"


@dataclass(frozen=True)
class Step:
    """A target rate (requests/s; 0 sends nothing) held for ``seconds``."""

    rate_rps: float
    seconds: float


@dataclass(frozen=True)
class StepSpec:
    """A step as written: requests/s, or a percentage of the capacity (``percent``)."""

    value: float
    percent: bool
    seconds: float

    def resolve(self, capacity_rps: float | None) -> Step:
        if not self.percent:
            return Step(self.value, self.seconds)
        if capacity_rps is None:
            raise ValueError("a step in % needs the capacity")
        return Step(capacity_rps * self.value / 100, self.seconds)


def parse_steps(text: str, option: str = "--steps") -> list[StepSpec]:
    """``RATE:DURATION,...``; RATE is requests/s (``40``) or a fraction of capacity (``25%``),
    DURATION as ``30s``, ``2m``. ConfigError naming ``option`` otherwise."""
    specs: list[StepSpec] = []
    for part in text.split(","):
        rate, sep, duration = part.strip().partition(":")
        percent = rate.endswith("%")
        try:
            value = float(rate.removesuffix("%"))
        except ValueError:
            value = float("nan")
        if not sep or not value >= 0 or value == float("inf"):
            raise ConfigError(f"option {option}: {clip(part.strip())} is not RATE:DURATION (e.g. 25%:30s or 40:10s)")
        seconds = parse_duration(duration, option)
        if seconds <= 0:
            raise ConfigError(f"option {option}: {clip(part.strip())} lasts no time")
        specs.append(StepSpec(value, percent, seconds))
    return specs


def arrival_offsets(step: Step, arrivals: str, rng: random.Random) -> list[float]:
    """Send times within the step, seconds from its start: a Poisson process (exponential gaps)
    or evenly spaced, at ``step.rate_rps``."""
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals: {arrivals!r} is not one of {', '.join(ARRIVALS)}")
    if step.rate_rps <= 0:
        return []
    if arrivals == "fixed":
        return [i / step.rate_rps for i in range(math.ceil(step.seconds * step.rate_rps - 1e-9))]
    out, t = [], rng.expovariate(step.rate_rps)
    while t < step.seconds:
        out.append(t)
        t += rng.expovariate(step.rate_rps)
    return out


def check_url(url: str) -> SplitResult:
    """``url``'s parts; ConfigError unless it is an http:// or https:// URL with a host."""
    parts = urlsplit(url)
    try:
        good = parts.scheme in {"http", "https"} and bool(parts.hostname) and (parts.port or 0) >= 0
    except ValueError:  # a port out of range or not a number
        good = False
    if not good:
        raise ConfigError(f"option --url: {clip(url)} is not an http:// or https:// URL")
    return parts


class Client:
    """``POST url`` with ``{"documents": N}``; one keep-alive connection per thread."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        parts = check_url(url)
        self.url, self.timeout_s = url, timeout_s
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._local = threading.local()

    def post(self, documents: int) -> int:
        """The answer's HTTP status; OSError / HTTPException when there was none."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = self._local.conn = kind(self._host, self._port, timeout=self.timeout_s)
        body = json.dumps({"documents": documents})
        try:
            conn.request("POST", self._path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()  # the whole answer, so the connection can carry the next request
        except BaseException:
            conn.close()  # a broken connection is not reused
            self._local.conn = None
            raise
        return response.status

    def post_ok(self, documents: int, _index: int = 0) -> None:
        """:meth:`post`, raising unless answered 200 (a closed loop's request)."""
        status = self.post(documents)
        if status != 200:
            raise RuntimeError(f"{self.url}: answered HTTP {status}")


@dataclass
class Window:
    """What one step's requests got. Wall-clock edges: ``start_ns`` as the first could be sent,
    ``end_ns`` once the last was answered (or failed)."""

    index: int
    rate_rps: float
    seconds: float
    start_ns: int = 0
    end_ns: int = 0
    sent: int = 0
    answered: int = 0  #: answered 200
    documents: int = 0  #: in answered requests
    errors: Counter[str] = field(default_factory=Counter)  #: HTTP status or exception name -> count
    latencies_s: list[float] = field(default_factory=list)  #: answered requests
    max_lag_s: float = 0.0  #: latest send behind its arrival time (the load generator falling behind)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def achieved_rps(self) -> float:
        span = (self.end_ns - self.start_ns) / 1e9
        return self.answered / span if span > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "rate_rps": self.rate_rps,
            "seconds": self.seconds,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "sent": self.sent,
            "answered": self.answered,
            "documents": self.documents,
            "errors": dict(self.errors),
            "achieved_rps": self.achieved_rps,
            "latency_ms": latency_summary(self.latencies_s),
            "max_lag_ms": self.max_lag_s * 1000,
        }


def _send(client: Client, window: Window, documents: int, due: float) -> None:
    started = time.perf_counter()
    with window._lock:
        window.sent += 1
        window.max_lag_s = max(window.max_lag_s, started - due)
    try:
        status = client.post(documents)
    except (OSError, http.client.HTTPException) as exc:
        kind = type(exc).__name__
    else:
        kind = "" if status == 200 else str(status)
    elapsed = time.perf_counter() - started
    with window._lock:
        if kind:
            window.errors[kind] += 1
        else:
            window.answered += 1
            window.documents += documents
            window.latencies_s.append(elapsed)


def run_steps(
    url: str,
    steps: Sequence[Step],
    *,
    documents: int = 1,
    arrivals: str = "poisson",
    seed: int = 0,
    workers: int = 64,
    timeout_s: float = 30.0,
    on_edge: Callable[[int], None] | None = None,
) -> list[Window]:
    """Drive ``url`` through ``steps``, open loop; a :class:`Window` per step.

    ``on_edge(i)`` runs before step ``i`` and once after the last (``i == len(steps)``), with no
    request in flight. ``workers``: most requests in flight; beyond them arrivals wait (``max_lag_s``).
    """
    if documents < 1 or workers < 1:
        raise ValueError("documents and workers must be >= 1")
    client = Client(url, timeout_s)
    rng = random.Random(seed)
    windows: list[Window] = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="load") as pool:
        for index, step in enumerate(steps):
            if on_edge is not None:
                on_edge(index)
            offsets = arrival_offsets(step, arrivals, rng)
            window = Window(index, step.rate_rps, step.seconds, start_ns=time.time_ns())
            start = time.perf_counter()
            futures = []
            for offset in offsets:
                delay = start + offset - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                futures.append(pool.submit(_send, client, window, documents, start + offset))
            time.sleep(max(0.0, start + step.seconds - time.perf_counter()))
            wait(futures)
            for future in futures:
                future.result()  # a bug in _send, not an error answer, surfaces here
            window.end_ns = time.time_ns()
            windows.append(window)
        if on_edge is not None:
            on_edge(len(steps))
    return windows


@dataclass(frozen=True)
class Capacity:
    """The rate a service sustained (requests/s), at that many closed-loop clients; each level tried."""

    rps: float
    concurrency: int
    history: list[tuple[int, float]]

    def summary(self) -> dict[str, Any]:
        return {
            "rps": self.rps,
            "concurrency": self.concurrency,
            "levels": [{"concurrency": c, "rps": r} for c, r in self.history],
        }


def measure_capacity(
    url: str,
    *,
    documents: int = 1,
    max_concurrency: int = 64,
    step_seconds: float = 2.0,
    min_gain: float = 0.05,
    timeout_s: float = 30.0,
) -> Capacity:
    """Closed-loop clients 1, 2, 4, ... up to ``max_concurrency``, each level for ``step_seconds``,
    until throughput gains less than ``min_gain``: the best level's requests/s. Any request not
    answered 200 fails the measurement (RuntimeError, or the OSError of an unreachable URL)."""
    client = Client(url, timeout_s)
    history: list[tuple[int, float]] = []
    for concurrency in doubling(max_concurrency):
        level = run_level(client.post_ok, Config(concurrency, documents), step_seconds, lambda _n: None)
        history.append((concurrency, level.throughput / documents))
        if knee([r for _, r in history], min_gain)[1]:
            break
    best = knee([r for _, r in history], min_gain)[0]
    return Capacity(history[best][1], history[best][0], history)


def run_load(
    url: str,
    specs: Sequence[StepSpec],
    *,
    capacity_rps: float | None = None,
    documents: int = 1,
    arrivals: str = "poisson",
    seed: int = 0,
    workers: int = 64,
    max_concurrency: int = 64,
    capacity_seconds: float = 2.0,
) -> dict[str, Any]:
    """``wattline workload load``: the capacity where a step in % needs it and none is given
    (measured), then :func:`run_steps`; the result as JSON-ready data (:data:`LOAD_SCHEMA`)."""
    measured = None
    if capacity_rps is None and any(s.percent for s in specs):
        measured = measure_capacity(
            url, documents=documents, max_concurrency=max_concurrency, step_seconds=capacity_seconds
        )
        capacity_rps = measured.rps
    steps = [s.resolve(capacity_rps) for s in specs]
    windows = run_steps(url, steps, documents=documents, arrivals=arrivals, seed=seed, workers=workers)
    return {
        "schema": LOAD_SCHEMA,
        "url": url,
        "documents_per_request": documents,
        "arrivals": arrivals,
        "capacity_rps": capacity_rps,
        "capacity_measured": None if measured is None else measured.summary(),
        "windows": [
            {**w.summary(), "percent": s.value if s.percent else None} for w, s in zip(windows, specs, strict=True)
        ],
    }
