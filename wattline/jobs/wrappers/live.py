"""The live line: one status line on a terminal, refreshed every second while a job runs.

``wattline run`` shows it on stderr when stderr is a terminal (not with ``--quiet``)::

    demo  00:12  8.95 W (estimate)  103.4 J  4,211 documents/s  saturated at 5 s

Power and energy come from this process's own sampling (embedded mode: the host's
components as the report counts them; ``(estimate)`` when part of it is a model); with a
collector the host agent samples, so the line says ``power: at the agent``. Throughput is
over the last 5 s. Saturation is the workload's mark, ``--saturated-after``, or the same
detection the report runs (:func:`wattline.accounting.saturation.detect_saturation`) on the units so far;
``warming up`` until then. The line is erased when the job ends.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from wattline import wire
from wattline.accounting.saturation import detect_saturation
from wattline.reports.channels import EXCLUDED_COMPONENTS

#: Seconds over which "units/s" is measured.
RATE_WINDOW_S = 5


class PowerMeter:
    """Power and energy of this host's samples as the sampler hands them over (wrap the
    sampler's output with :meth:`wrap`); components left out of a report's totals are left out."""

    def __init__(self) -> None:
        self.energy_j = 0.0
        self.model_j = 0.0
        self.power_w: float | None = None
        self._lock = threading.Lock()

    def wrap(self, emit: Callable[[Sequence[wire.pb.Sample]], None]) -> Callable[[Sequence[wire.pb.Sample]], None]:
        def record(samples: Sequence[wire.pb.Sample]) -> None:
            self.record(samples)
            emit(samples)

        return record

    def record(self, samples: Sequence[wire.pb.Sample]) -> None:
        counted = [s for s in samples if s.component not in EXCLUDED_COMPONENTS]
        if not counted:
            return
        with self._lock:
            self.energy_j += math.fsum(s.energy_j for s in counted)
            self.model_j += math.fsum(s.energy_j for s in counted if s.quality == wire.QUALITY_MODEL)
            self.power_w = math.fsum(s.power_w for s in counted)


class LiveLine:
    """A thread that rewrites one line of ``out`` every ``period_s``; :meth:`stop` erases it."""

    def __init__(
        self,
        name: str,
        unit: str,
        units_total: Callable[[], float],
        saturated_at_s: Callable[[], float | None],
        meter: PowerMeter | None,
        out: IO[str],
        period_s: float = 1.0,
    ) -> None:
        self.name, self.unit = name, unit
        self.units_total = units_total
        self.saturated_at_s = saturated_at_s
        self.meter = meter
        self.out = out
        self.period_s = period_s
        self.start_ns = time.time_ns()
        self._units: collections.deque[tuple[int, float]] = collections.deque()
        self._events: list[tuple[int, float]] = []  # (time_ns, units since the previous point)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wattline-live", daemon=True)
        self._width = 0

    def start(self) -> LiveLine:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop refreshing and erase the line."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._write(" " * self._width + "\r")

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._write(self.text(time.time_ns()) + "\r")

    def _write(self, text: str) -> None:
        try:
            self.out.write("\r" + text)
            self.out.flush()
        except (OSError, ValueError):  # the terminal went away: the job goes on
            self._stop.set()

    def text(self, now_ns: int) -> str:
        """The status line at ``now_ns``."""
        total = self.units_total()
        last = self._units[-1][1] if self._units else 0.0
        if total > last:
            self._events.append((now_ns, total - last))
        self._units.append((now_ns, total))
        while len(self._units) > 1 and self._units[0][0] < now_ns - RATE_WINDOW_S * 10**9:
            self._units.popleft()
        t0, u0 = self._units[0]
        rate = (total - u0) / ((now_ns - t0) / 1e9) if now_ns > t0 else 0.0
        elapsed = int((now_ns - self.start_ns) / 1e9)
        parts = [self.name, f"{elapsed // 60:02d}:{elapsed % 60:02d}", self._power(), f"{rate:,.0f} {self.unit}/s"]
        parts.append(self._saturation(now_ns))
        line = "  ".join(parts)
        self._width = max(self._width, len(line))
        return line.ljust(self._width)

    def _power(self) -> str:
        meter = self.meter
        if meter is None:
            return "power: at the agent"
        if meter.power_w is None:
            return "power: first sample pending"
        estimate = " (estimate)" if meter.model_j > 0 else ""
        return f"{meter.power_w:,.2f} W{estimate}  {meter.energy_j:,.1f} J"

    def _saturation(self, now_ns: int) -> str:
        at_s = self.saturated_at_s()
        if at_s is None and self._events:
            found = detect_saturation(self.start_ns, now_ns, unit_events=self._events)
            at_s = (found.at_ns - self.start_ns) / 1e9 if found.saturated and found.at_ns is not None else None
        if at_s is None or at_s > (now_ns - self.start_ns) / 1e9:
            return "warming up"
        return f"saturated at {at_s:.0f} s"
