"""The closed-loop load generator of the inference workload: the ramp's step
logic (pure: :func:`knee`, :func:`doubling`, :class:`Ramp`) and :func:`run_level`, which
holds one load level with parallel clients and measures what it achieved."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MIN_BATCHES_PER_STEP = 3


# --- the load generator's step logic (pure) ------------------------------------------


@dataclass(frozen=True)
class Config:
    """One load level: parallel clients, documents per request."""

    concurrency: int
    batch_size: int


def knee(throughputs: Sequence[float], min_gain: float = 0.05, patience: int = 1) -> tuple[int, bool]:
    """Index of the best step so far, and whether to stop raising the load.

    A step is an improvement when its throughput is at least ``1 + min_gain`` times the
    best so far; raising stops after ``patience`` steps in a row without one. The best
    step is the last improvement, so a step that gains less than ``min_gain`` (more
    latency for almost no throughput) is never chosen.
    """
    if min_gain < 0 or patience < 1:
        raise ValueError("min_gain must be >= 0 and patience >= 1")
    best, misses = 0, 0
    for i in range(1, len(throughputs)):
        if throughputs[i] >= throughputs[best] * (1 + min_gain):
            best, misses = i, 0
        else:
            misses += 1
            if misses >= patience:
                return best, True
    return best, False


def doubling(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit`` (and ``limit`` itself when it is not a power of two)."""
    if limit < 1:
        raise ValueError("limit must be >= 1")
    out = [1]
    while out[-1] * 2 <= limit:
        out.append(out[-1] * 2)
    if out[-1] != limit:
        out.append(limit)
    return out


@dataclass
class Ramp:
    """Raise batch size, then concurrency, until throughput stops rising (see :mod:`.layoutlm_inference`).

    Use: ``while (cfg := ramp.next()) is not None: ramp.record(measure(cfg))``; then
    ``ramp.plateau`` is the configuration to hold. With ``fixed``, the ramp is one step, that
    batch size at concurrency 1 (the warm-up), and the plateau that step.
    """

    max_batch: int
    max_concurrency: int = 1
    min_gain: float = 0.05
    patience: int = 1
    fixed: int | None = None
    history: list[tuple[Config, float]] = field(default_factory=list)
    plateau: Config | None = None
    _axis: str = "batch"
    _ladder: list[Config] = field(default_factory=list)
    _seen: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        self._ladder = [Config(1, b) for b in ([self.fixed] if self.fixed else doubling(self.max_batch))]

    def next(self) -> Config | None:
        """The next configuration to measure, or None when the plateau is found."""
        if self.plateau is not None:
            return None
        return self._ladder[len(self._seen)]

    def record(self, throughput: float) -> None:
        """The throughput (units/s) measured at the configuration :meth:`next` gave."""
        config = self.next()
        if config is None:
            raise RuntimeError("record() after the plateau was found")
        self.history.append((config, throughput))
        self._seen.append(throughput)
        best, stop = knee(self._seen, self.min_gain, self.patience)
        if not stop and len(self._seen) < len(self._ladder):
            return
        chosen = self._ladder[best]
        if self._axis == "batch" and self.max_concurrency > 1 and not self.fixed:
            self._axis = "concurrency"
            self._ladder = [Config(c, chosen.batch_size) for c in range(1, self.max_concurrency + 1)]
            self._seen = [self._seen[best]]  # concurrency 1 at that batch size is measured already
            if len(self._ladder) > 1:
                return
        self.plateau = chosen


# --- running it ----------------------------------------------------------------------


@dataclass
class StepResult:
    """What one load level achieved."""

    config: Config
    documents: int
    seconds: float
    latencies_s: list[float]

    @property
    def throughput(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            **asdict(self.config),
            "documents": self.documents,
            "seconds": self.seconds,
            "throughput_per_s": self.throughput,
            "batches": len(self.latencies_s),
        }


Infer = Callable[[int, int], None]  # (batch_size, batch index) -> None, returns when done


def run_level(
    infer: Infer,
    config: Config,
    seconds: float,
    on_batch: Callable[[int], None],
    min_batches: int = MIN_BATCHES_PER_STEP,
    worker_context: Callable[[], Any] | None = None,
    on_latency: Callable[[float], None] | None = None,
) -> StepResult:
    """Closed loop: ``config.concurrency`` clients send batches back to back for ``seconds``
    (and at least ``min_batches`` batches); every completed batch calls ``on_batch`` (and
    ``on_latency`` with its seconds)."""
    stop = threading.Event()
    lock = threading.Lock()
    latencies: list[float] = []
    done = [0]
    errors: list[BaseException] = []

    def client(index: int) -> None:
        try:
            with worker_context() if worker_context else contextlib.nullcontext():
                i = index
                while not stop.is_set():
                    t0 = time.perf_counter()
                    infer(config.batch_size, i)
                    elapsed = time.perf_counter() - t0
                    with lock:
                        latencies.append(elapsed)
                        done[0] += config.batch_size
                    on_batch(config.batch_size)
                    if on_latency is not None:
                        on_latency(elapsed)
                    i += config.concurrency
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(config.concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    while not stop.is_set():
        with lock:
            enough = len(latencies) >= min_batches
        if enough and time.perf_counter() - start >= seconds:
            break
        stop.wait(0.01)
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return StepResult(config, done[0], time.perf_counter() - start, latencies)
