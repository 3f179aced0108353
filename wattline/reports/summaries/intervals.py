"""Per-interval summaries of service jobs in the store (measurement ``service_interval``), so
dashboards read one point per interval instead of rescanning raw samples.

A service job (``job.service``: a ``wattline run --service``, an annotated pod) is cut into
intervals of ``every_s`` aligned to wall-clock multiples (a minute: 12:00:00 to 12:01:00);
the first and last are clipped to the job's run. Each interval's figures are those of
``wattline report SVC --from/--to`` over it (:func:`~wattline.reports.interval_reports.interval_of`,
the rule ``--every`` uses): energy under the report's idle policy with its bound and the fraction
that is a model estimate, units, J per unit, throughput, mean power, load.

Load is the interval's throughput over the highest interval throughput this writer has seen
of the job (the most it was seen to sustain so far, since the collector started);
``wattline report --every`` takes the highest among the intervals it is asked instead.
An interval is stamped at its start.

When: :class:`IntervalWriter` looks at a service job once an interval has ended. An interval
whose report is complete (its hosts' samples cover it) and whose hosts' events reach past its
end (a later event, or their close: its units are all stored) is final, written and never
computed again. One that is not is written once ``wait_s`` after its end as it is (``complete`` 0) on
a store where a rewrite replaces it (SQLite, InfluxDB), then computed again every
``recheck_every_s`` (the collector's ``summary_interval``) until it is complete (late samples)
or ``recheck_s`` after its end, and rewritten; on a store that cannot replace a sample
(VictoriaMetrics, Prometheus) it is written once, when complete or ``wait_s`` after its end.
Work is bounded: only intervals not yet final are computed, at most ``max_per_pass`` per pass,
none older than ``backfill_s`` (a collector that was down longer leaves the older ones to
``wattline report``); a running service is read about once an interval.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from wattline.jobs.jobs_view import BadJob, JobNotFound, inspect_view
from wattline.reports.build import build_report, report_wait_s
from wattline.reports.interval_reports import interval_of
from wattline.reports.intervals import Interval
from wattline.reports.model import Report, ReportSettings
from wattline.reports.stored_intervals import policy_fields, stored_fields
from wattline.reports.summaries.due_worker import DueAt
from wattline.reports.window_view import Window
from wattline.stores.base import IntervalSummary, StoreUnavailable, SummaryValue
from wattline.stores.reader import IntervalStore

log = logging.getLogger(__name__)

S = 10**9


def interval_summary(report: Report, interval: Interval, complete: bool, final: bool) -> list[IntervalSummary]:
    """The stored points of one interval (``report``: the report over it; absent figures left
    out): its figures, the policy they were computed under, its energy whole and whether it is
    ``final`` (never computed again), so that a report over a longer window can add it up
    (:mod:`~wattline.reports.stored_intervals`); then one point per latency histogram
    (and its labels) the server exposes."""
    job = report.job
    tags = {k: v for k, v in (("name", job.name), ("unit", job.unit_name)) if v}
    fields: dict[str, float | None] = {
        "seconds": interval.seconds,
        "energy_j": interval.energy_j,
        "energy_bound_j": interval.energy_bound_j,
        "estimate_fraction": interval.estimate_fraction,
        "estimate_share": interval.estimate_fraction,  # deprecated name of estimate_fraction
        "units": interval.units,
        "units_bound": interval.units_bound,
        "j_per_unit": interval.j_per_unit,
        "j_per_unit_bound": interval.j_per_unit_bound,
        "throughput_per_s": interval.throughput_per_s,
        "mean_power_w": interval.energy_j / interval.seconds if interval.seconds > 0 else None,
        "load": interval.load,
        "complete": 1.0 if complete else 0.0,
        "final": 1.0 if final else 0.0,
        **policy_fields(report.settings),
        **stored_fields(report.saturated_window),
    }
    out = [IntervalSummary(job.job_id, interval.window.from_ns, tags, _finite(fields))]
    for lat in interval.latency:
        # a latency point has none of the fields above: the dashboards' sums never count it
        figures: dict[str, float | None] = {
            "observations": lat.observations,
            "observations_bound": lat.observations_bound,
            "mean_s": lat.mean_s,
        }
        for q in lat.quantiles:
            name = f"p{q.q * 100:g}"
            figures |= {f"{name}_s": q.value, f"{name}_low_s": q.low, f"{name}_high_s": q.high}  # high None: +Inf
        series = {"latency": lat.name, **{f"latency_{k}": v for k, v in sorted(lat.labels.items())}}
        out.append(IntervalSummary(job.job_id, interval.window.from_ns, {**tags, **series}, _finite(figures)))
    return out


def _finite(fields: dict[str, float | None]) -> dict[str, SummaryValue]:
    return {k: float(v) for k, v in fields.items() if v is not None and math.isfinite(v)}


def edges(start_ns: int, end_ns: int, every_ns: int) -> list[Window]:
    """The intervals of [start_ns, end_ns) aligned to multiples of ``every_ns`` (the first and
    last clipped to it)."""
    first = start_ns - start_ns % every_ns
    cuts = [(max(a, start_ns), min(a + every_ns, end_ns)) for a in range(first, end_ns, every_ns)]
    return [Window(a, b) for a, b in cuts if b > a]


@dataclass
class _Service:
    """What the writer keeps of one service job."""

    done_to_ns: int  #: every interval ending at or before this is final
    peak_per_s: float = 0.0  #: highest interval throughput seen
    #: intervals written but not final (start ns -> its window)
    open: dict[int, Window] = field(default_factory=dict)
    ended: bool = False


class IntervalWriter(DueAt):
    """Computes and writes service jobs' interval summaries on one background thread.

    :meth:`job_events` (called by the collector after each committed batch, as for job
    summaries) marks each job due; a job that turns out not to be a service is remembered and
    skipped. A service job is then looked at again each ``poll_s`` while it has an interval not
    final or a new one ends."""

    def __init__(
        self,
        store: IntervalStore,
        settings: ReportSettings | None = None,
        *,
        every_s: float = 60.0,
        wait_s: float = report_wait_s(1.5),
        recheck_s: float = 3600.0,
        recheck_every_s: float = 60.0,
        backfill_s: float = 86400.0,
        poll_s: float = 1.0,
        max_per_pass: int = 60,
        max_jobs: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.store = store
        self.settings = settings or ReportSettings()
        self.every_ns = int(every_s * S)
        self.wait_ns = int(wait_s * S)
        self.recheck_ns = int(recheck_s * S)
        self.recheck_every_ns = int(recheck_every_s * S)
        self.backfill_ns = int(backfill_s * S)
        self.poll_s = poll_s
        self.max_per_pass = max_per_pass
        self.max_jobs = max_jobs
        self._wall_ns = wall_ns
        super().__init__("service-intervals", clock)  # _due: job id -> when to look at it (clock time)
        self._services: dict[str, _Service] = {}
        self._not_services: set[str] = set()
        self._checked_ns: dict[tuple[str, int], int] = {}  #: (job, start) -> when last computed (wall ns)
        #: Counters (for tests and metrics): intervals written, failed passes.
        self.written = 0
        self.failed = 0

    def job_events(self, jobs: Iterable[tuple[str, bool]]) -> None:
        """Jobs with newly stored events: (job id, the events include a close). Never blocks."""
        now = self._clock()
        with self._cond:
            for job_id, _closed in jobs:
                if job_id in self._not_services or (job_id not in self._due and len(self._due) >= self.max_jobs):
                    continue
                self._due[job_id] = min(self._due.get(job_id, now), now)
            self._cond.notify()

    def _run(self) -> None:
        while (job_id := self._next()) is not None:
            try:
                self.write_due(job_id)
            except Exception as exc:  # store down, a bug: looked at again, never silently lost
                self.failed += 1
                kind = "" if isinstance(exc, StoreUnavailable) else f"{type(exc).__name__}: "
                log.warning("service intervals of %s failed (again later): %s%s", job_id[:100], kind, str(exc)[:300])
                self._again(job_id, max(self.poll_s, self.recheck_every_ns / S))

    def write_due(self, job_id: str) -> int:
        """Compute and write ``job_id``'s intervals that are due now; returns how many were
        written (the thread's one step; tests call it directly)."""
        now_ns = self._wall_ns()
        try:
            view = inspect_view(job_id, self.store.job_events(job_id, every=False))
        except (JobNotFound, BadJob):
            return 0  # its events are not searchable yet: its next events bring it back
        if not view.service:
            with self._cond:
                self._not_services.add(job_id)
                if len(self._not_services) > self.max_jobs:
                    self._not_services.clear()  # forgetting costs one more look each
            return 0
        state = self._services.get(job_id)
        if state is None:
            back_ns = now_ns - self.backfill_ns
            # aligned: a clipped first interval would overlap one an earlier run of the collector wrote
            state = self._services[job_id] = _Service(max(view.start_ns, back_ns - back_ns % self.every_ns))
        end_ns = view.end_ns(now_ns)
        state.ended = view.closed or view.state(now_ns) == "abandoned"
        due = edges(state.done_to_ns, end_ns, self.every_ns)
        if not state.ended and due and due[-1].to_ns == end_ns and end_ns % self.every_ns:
            due.pop()  # the interval in progress (cut at now)
        due[:0] = [w for _, w in sorted(state.open.items()) if self._recheck(job_id, w, now_ns)]
        # a host's events reach the store in order: those before its latest (or its close) are all there
        heard_ns = min((math.inf if w.close_ns is not None else w.last_ns for w in view.hosts.values()), default=0)
        written = self._write(job_id, state, due[: self.max_per_pass], now_ns, heard_ns)
        if not (state.ended and not state.open and state.done_to_ns >= end_ns):
            self._again(job_id, self._next_look_s(state, due, now_ns))
        elif len(self._services) > self.max_jobs:  # all final: kept so that a late event recomputes nothing
            for old in [j for j, s in self._services.items() if s.ended][: len(self._services) - self.max_jobs]:
                del self._services[old]
        return written

    def _next_look_s(self, state: _Service, due: list[Window], now_ns: int) -> float:
        """Seconds to the next look: ``poll_s`` while an interval due waits for its samples or
        more are due than one pass takes; else the end of the interval in progress, or the next
        recheck of one written incomplete (a long-running service is read once an interval)."""
        waiting = any(w.to_ns > state.done_to_ns and w.from_ns not in state.open for w in due)
        if waiting or len(due) > self.max_per_pass:
            return self.poll_s
        next_ns = math.inf if state.ended else (now_ns // self.every_ns + 1) * self.every_ns
        if state.open:
            next_ns = min(next_ns, now_ns + self.recheck_every_ns)
        return max(self.poll_s, (next_ns - now_ns) / S)

    def _recheck(self, job_id: str, window: Window, now_ns: int) -> bool:
        last = self._checked_ns.get((job_id, window.from_ns), 0)
        return now_ns - last >= self.recheck_every_ns

    def _write(self, job_id: str, state: _Service, due: list[Window], now_ns: int, heard_ns: float) -> int:
        replaces = self.store.replaces_intervals
        out: list[IntervalSummary] = []
        intervals = 0
        final: list[Window] = []
        for window in due:
            report = build_report(self.store, job_id, replace(self.settings, window=window), now_ns=now_ns)
            complete = report.complete and heard_ns >= window.to_ns  # its samples and its events (units)
            late_ns = now_ns - window.to_ns
            if not complete and late_ns < self.wait_ns:
                break  # its samples or units may still come: wait (and for the intervals after it)
            interval = interval_of(report, window)
            state.peak_per_s = max(state.peak_per_s, interval.throughput_per_s)
            load = interval.throughput_per_s / state.peak_per_s if state.peak_per_s > 0 else None
            is_final = complete or late_ns >= self.recheck_ns or not replaces
            out += interval_summary(report, replace(interval, load=load), complete, is_final)
            intervals += 1
            self._checked_ns[(job_id, window.from_ns)] = now_ns
            if is_final:
                final.append(window)
            else:
                state.open[window.from_ns] = window
        if out:
            result = self.store.write_intervals(out)
            if result.rejected:
                log.warning("service intervals of %s refused: %s", job_id[:100], "; ".join(result.reasons)[:300])
            self.written += result.written
        for window in final:
            state.open.pop(window.from_ns, None)
            self._checked_ns.pop((job_id, window.from_ns), None)
        finished = {w.from_ns for w in final}
        for window in due:  # done up to the first interval neither final nor rechecked later
            if window.from_ns not in finished and window.from_ns not in state.open:
                break
            state.done_to_ns = max(state.done_to_ns, window.to_ns)
        return intervals
