"""What the Neuron source keeps of neuron-monitor's reports as they arrive on the monitor's
reader thread: the latest report and when it came, the instance and hardware it last named,
counts of reports, bad lines and report errors, and each runtime's NeuronCore use summed
between two ``process_use`` calls. The sampler's thread reads it under one lock, so a read
never waits for the child."""

from __future__ import annotations

import logging
import threading
import time
from typing import Final

from wattline.agent.sources.neuron_parse import ReportError, parse_report
from wattline.agent.sources.neuron_report import HardwareInfo, InstanceInfo, NeuronReport

log = logging.getLogger(__name__)

#: Least time between two "skipped a bad line" warnings; the lines between are counted.
_BAD_LINE_LOG_S: Final = 60.0


class ReportFeed:
    """neuron-monitor's reports, one line at a time (:meth:`on_line`), as the source reads them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first_report = threading.Event()
        self.latest: NeuronReport | None = None
        self.latest_t = 0.0  #: time.monotonic() of the latest report
        self.instance: InstanceInfo | None = None
        self.hardware: HardwareInfo | None = None
        self.reports = 0
        self.bad_lines = 0
        self.report_errors = 0
        self._bad_logged_t = -_BAD_LINE_LOG_S
        self._bad_suppressed = 0
        self._pending_errors: list[str] = []
        #: Per-runtime use since the last take_use(): (pid, core) -> summed percent; reports.
        self._use_sum: dict[tuple[int, int], float] = {}
        self._use_reports = 0

    def on_line(self, raw: bytes) -> None:
        """One line of the child's stdout: a report kept, or a bad line counted."""
        text = raw.strip()
        if not text:
            return
        try:
            report = parse_report(text)
        except ReportError as exc:
            self._bad_line(exc, text)
            return
        with self.lock:
            self.latest = report
            self.latest_t = time.monotonic()
            self.reports += 1
            self.instance = report.instance or self.instance
            self.hardware = report.hardware or self.hardware
            if report.counters_known:
                self._use_reports += 1
                for rt in report.runtimes:
                    for core, pct in (rt.core_utilization_pct or {}).items():
                        if rt.pid is not None:
                            self._use_sum[rt.pid, core] = self._use_sum.get((rt.pid, core), 0.0) + pct
            if report.errors:
                self.report_errors += 1
                self._pending_errors.extend(report.errors)
        self.first_report.set()

    def _bad_line(self, exc: ReportError, text: bytes) -> None:
        with self.lock:
            self.bad_lines += 1
            now = time.monotonic()
            if now - self._bad_logged_t < _BAD_LINE_LOG_S:
                self._bad_suppressed += 1
                return
            suppressed = self._bad_suppressed
            self._bad_suppressed = 0
            self._bad_logged_t = now
        more = f" ({suppressed} more since the last message)" if suppressed else ""
        log.warning("neuron-monitor: skipped a bad line, %s: %.80r%s", exc, text, more)

    def take(self) -> tuple[NeuronReport | None, float, list[str]]:
        """The latest report, its age (s) and the report errors since the previous call."""
        with self.lock:
            errors, self._pending_errors = self._pending_errors, []
            return self.latest, time.monotonic() - self.latest_t, errors

    def take_use(self) -> tuple[dict[tuple[int, int], float], int, NeuronReport | None]:
        """(pid, core) -> summed percent and the number of reports summed since the previous
        call (both start again), and the latest report."""
        with self.lock:
            sums, reports = self._use_sum, self._use_reports
            self._use_sum, self._use_reports = {}, 0
            return sums, reports, self.latest
