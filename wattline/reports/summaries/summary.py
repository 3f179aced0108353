"""Per-job summaries in the store: the figures of ``wattline report``, one point per job.

:func:`summary_of` turns a :class:`~wattline.reports.build.Report` into a
:class:`~wattline.stores.base.JobSummary` through :func:`report_json`, so a
summary holds exactly what ``wattline report --json`` prints for the job (saturated window
and whole run energy, energy by component, units, J per unit, kWh per million units,
throughput, mean power, measured fraction (counter and integrated; also under its
deprecated name measured_share), saturation, durations, exit status, cost and CO2 when
priced) and the policy it was computed under. Stores write it as measurement
``job_summary`` (+ ``job_summary_host``, each host's energy), keyed by the job id and the
job's start: recomputing rewrites the same point (on VictoriaMetrics and Prometheus a newer
sample of the job's one series, docs/storage.md).

Who writes it: :class:`SummaryWriter` in a collector (a job's close arrives: computed once
the job's samples cover its window, or the wait is over, and again as each host of a
multi-host job closes; a running job about every ``running_every_s``), and
:func:`record_summary` at the end of an embedded ``wattline run``. The writer runs on one
background thread fed by :meth:`SummaryWriter.job_events`, which never blocks ingest: it
only marks jobs due in a bounded table (a job is due once however many events arrive).
A failed computation or write is logged and retried with back-off; a job the full table
cannot take is logged by id (its next event brings it back).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from wattline.jobs.jobs_view import BadJob, JobNotFound
from wattline.reports.build import build_report, neighbours, report_wait_s, search_lag_s
from wattline.reports.model import Report, ReportSettings
from wattline.reports.report_json import report_json
from wattline.reports.summaries.due_worker import DueAt
from wattline.reports.summaries.store import default_store_url
from wattline.stores.base import JobSummary, Store, StoreUnavailable, SummaryValue, WriteResult
from wattline.stores.factory import open_store
from wattline.stores.reader import Reader, SummaryStore

log = logging.getLogger(__name__)

SCHEMA = "wattline.job_summary/1"
#: Most seconds an embedded run spends rewriting other jobs' summaries after its own.
NEIGHBOURS_S = 1.0
#: A job summary sink: a store's ``write_summary``.
Sink = Callable[[JobSummary], WriteResult]


def summary_of(report: Report, computed_ns: int | None = None) -> JobSummary:
    """The summary point of ``report`` (figures taken from :func:`report_json`; absent = None)."""
    data = report_json(report)
    job, sat, warm = data["job"], data["saturated"], data["warmup"]
    cov = sat["coverage"]
    policy = data["policy"]
    fields: dict[str, Any] = {
        "schema": SCHEMA,
        "status": job["status"],
        "closed": job["closed"],
        "complete": data["complete"],
        "exit_code": job["exit_code"],
        "hosts": len(job["hosts"]),
        "start_ns": report.job.start_ns,
        "end_ns": report.end_ns,
        "saturated": report.saturated,
        "saturated_at_ns": report.saturation.at_ns,
        # Grafana reads times as ms: the warm-up region annotation ends here.
        "saturated_at_ms": None if report.saturation.at_ns is None else report.saturation.at_ns // 10**6,
        "saturation_method": report.saturation.method,
        "duration_s": data["durations_s"]["total"],
        "warmup_s": data["durations_s"]["warmup"],
        "saturated_s": data["durations_s"]["saturated"],
        "measured_s": data["durations_s"]["saturated"],  # deprecated name of saturated_s
        "units_total": data["units"]["total"],
        "units_warmup": data["units"]["warmup"],
        "units_saturated": data["units"]["saturated"],
        "units_measured": data["units"]["saturated"],  # deprecated name of units_saturated
        "energy_j": sat["energy_j"],
        "dynamic_energy_j": sat["dynamic_energy_j"],
        "energy_warmup_j": warm["energy_j"],
        "energy_total_j": sat["energy_j"] + warm["energy_j"],
        "mean_power_w": sat["mean_power_w"],
        "energy_bound_j": sat["energy_bound_j"],
        "energy_bound_rel": sat["energy_bound_rel"],
        "j_per_unit": sat["j_per_unit"],
        "kwh_per_million_units": sat["kwh_per_million_units"],
        "throughput_units_per_s": sat["throughput_units_per_s"],
        "throughput_units_per_h": sat["throughput_units_per_h"],
        "measured_fraction": cov["measured_fraction"],
        "measured_share": cov["measured_fraction"],  # deprecated name of measured_fraction
        "cost_usd_per_run": sat["cost_usd_per_run"],
        "cost_usd_per_million_units": sat["cost_usd_per_million_units"],
        "co2_g_per_run": sat["co2_g_per_run"],
        "co2_g_per_million_units": sat["co2_g_per_million_units"],
        "policy_idle": policy["idle"],
        "policy_share_rule": policy["share_rule"],
        "price_usd_per_instance_hour": policy["price_usd_per_instance_hour"],
        "carbon_intensity_g_per_kwh": policy["carbon_intensity_g_per_kwh"],
        "pue": policy["pue"],
        "notes": len(data["notes"]),
        "computed_ns": computed_ns if computed_ns is not None else time.time_ns(),
    }
    for comp in sat["by_component"]:
        fields[f"energy_{comp['component']}_j"] = comp["energy_j"]
    for quality, fraction in cov["fractions"].items():
        fields[f"fraction_{quality}"] = fraction
        fields[f"share_{quality}"] = fraction  # deprecated name of fraction_<quality>
    hosts: dict[str, float] = {h["host"]: h["energy_j"] for h in sat["by_host"]}
    for h in warm["by_host"]:
        hosts[h["host"]] = hosts.get(h["host"], 0.0) + h["energy_j"]
    for host in job["hosts"]:
        hosts.setdefault(host, 0.0)
    tags = {k: v for k, v in (("name", job["name"]), ("kind", job["kind"]), ("unit", job["unit"])) if v}
    return JobSummary(job["id"], report.job.start_ns, tags, _storable(fields), hosts)


def _storable(fields: dict[str, Any]) -> dict[str, SummaryValue]:
    """Fields a store can hold: absent (None) and non-finite figures are left out; ints of
    figures that may be fractional become floats, so a field keeps one type across rewrites."""
    out: dict[str, SummaryValue] = {}
    for key, value in fields.items():
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and not key.endswith(("_ns", "_ms")):
            value = value if key in ("exit_code", "hosts", "notes") else float(value)
        out[key] = value
    return out


def record_summary(reader: Reader, sink: Sink, job_id: str, settings: ReportSettings | None = None) -> Report:
    """Compute ``job_id``'s report and write its summary; returns the report.

    Raises what the report or the write raises; a refused point is a ValueError."""
    return _write(sink, build_report(reader, job_id, settings))


def _write(sink: Sink, report: Report) -> Report:
    result = sink(summary_of(report))
    if result.rejected:
        raise ValueError("; ".join(result.reasons) or "summary refused by the store")
    return report


def record_local_summary(
    store_url: str | None,
    job_id: str | None,
    opener: Callable[[], Store] | None = None,
    changed: Iterable[str] = (),
    settings: ReportSettings | None = None,
) -> None:
    """The embedded run's summary under ``settings`` (the report's), into its local store
    (``opener()``, else the store at ``store_url``); a failure is one warning, never the run's
    (the command's exit status stands).

    ``changed``: jobs whose window changed after the fact (ended here for a dead holder):
    their summaries and those of the jobs that shared a host with them are written again.
    So are, for at most :data:`NEIGHBOURS_S` (the run's exit waits for it), those of the
    jobs that shared the host with ``job_id`` (its CPU time and its use of a device, some sent
    after their summaries were written, change their part); one warning names what is left."""
    changed = list(changed)
    if job_id is None and not changed:
        return
    shown = (job_id or ",".join(changed))[:100]
    try:
        with opener() if opener is not None else open_store(store_url or default_store_url()) as store:
            if not isinstance(store, SummaryStore):
                log.warning("job %s: no summary written (a %s store is not read back)", shown, store.kind)
                return
            again: list[str] = []  # their figures counted a job as running that had ended
            shared: list[str] = []  # their part of a device split by use may change
            for jid in [*changed, *([job_id] if job_id else [])]:
                report = _record_or_warn(store, jid, settings)
                if report is not None and jid in changed:
                    again += neighbours(store, report.job, time.time_ns())
                elif report is not None and report.shared_with:
                    shared += neighbours(store, report.job, time.time_ns())
            done = {*changed, job_id}
            for jid in dict.fromkeys(j for j in again if j not in done):
                _record_or_warn(store, jid, settings)
                done.add(jid)
            left = [j for j in dict.fromkeys(shared) if j not in done]
            deadline = time.monotonic() + NEIGHBOURS_S
            while left and time.monotonic() < deadline:
                _record_or_warn(store, left.pop(0), settings, ended_only=True)
            if left:
                log.warning(
                    "job %s: %d summaries of jobs that shared its host not rewritten (`wattline report` "
                    "shows their figures now): %s",
                    shown,
                    len(left),
                    " ".join(j[:100] for j in left[:5]),
                )
    except Exception as exc:
        log.warning("job %s: summary not written: %s: %s", shown, type(exc).__name__, str(exc)[:300])


def _record_or_warn(
    store: SummaryStore, job_id: str, settings: ReportSettings | None, ended_only: bool = False
) -> Report | None:
    """Write ``job_id``'s summary (not while it runs when ``ended_only``: its own close will,
    and a figure computed before that must not overwrite it)."""
    try:
        report = build_report(store, job_id, settings)
        return report if ended_only and report.state == "running" else _write(store.write_summary, report)
    except Exception as exc:
        log.warning("job %s: summary not written: %s: %s", job_id[:100], type(exc).__name__, str(exc)[:300])
        return None


class SummaryWriter(DueAt):
    """Computes and writes job summaries on one background thread.

    :meth:`job_events` (called by the collector after each committed batch) marks jobs
    due: a job with a close at once, any other job at most every ``running_every_s``. A
    closed job whose report is not complete is looked at again every ``poll_s`` until
    ``wait_s`` after its end, then written as it is (``complete`` false, its notes say
    why) and computed again every ``running_every_s`` until it is complete (samples that an
    agent's spool delivers late) or ``recheck_s`` after its close. Events the store took but
    does not show yet (VictoriaMetrics makes rows searchable about a second after it took
    them): a job not found, or a close not seen, is looked at again every ``poll_s`` until
    ``wait_s`` after the events were noted. Failures are logged and retried, ``retry_s``
    doubling up to ``max_retry_s``. ``on_closed`` is given each closed job's report once its
    summary is written (Slurm's AdminComment: reports/summaries/slurm_comment.py).
    """

    def __init__(
        self,
        reader: Reader,
        sink: Sink,
        settings: ReportSettings | None = None,
        *,
        running_every_s: float = 60.0,
        wait_s: float = report_wait_s(1.5),
        poll_s: float = 1.0,
        retry_s: float = 2.0,
        max_retry_s: float = 60.0,
        max_jobs: int = 10_000,
        recheck_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        on_closed: Callable[[Report], None] | None = None,
    ) -> None:
        self.reader = reader
        self.sink = sink
        self.settings = settings or ReportSettings()
        self.running_every_s = running_every_s
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.max_jobs = max_jobs
        self.recheck_s = recheck_s
        #: Told each closed job's report once its summary is written (must not block).
        self.on_closed = on_closed
        super().__init__("job-summaries", clock)  # _due: job id -> when to compute it (clock time)
        #: jobs with a close since their last summary -> when the (first such) close was noted
        self._closing: dict[str, float] = {}
        #: jobs due -> when their latest events were noted (the store may not show them yet)
        self._noted: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._done: dict[str, float] = {}  #: job id -> when its last summary was written
        #: Counters (for tests and metrics): summaries written, failed attempts, jobs dropped.
        self.written = 0
        self.failed = 0
        self.dropped = 0

    def job_events(self, jobs: Iterable[tuple[str, bool]]) -> None:
        """Jobs with newly stored events: (job id, the events include a close). Never blocks."""
        now = self._clock()
        with self._cond:
            for job_id, closed in jobs:
                if job_id not in self._due:
                    if len(self._due) >= self.max_jobs:
                        self.dropped += 1
                        log.warning(
                            "job summaries: %d jobs already due; %s not summarised now (its next event or "
                            "`wattline report` has its figures)",
                            len(self._due),
                            job_id[:100],
                        )
                        continue
                    last = self._done.get(job_id, -math.inf)
                    self._due[job_id] = now if closed else max(now, last + self.running_every_s)
                elif closed:
                    self._due[job_id] = min(self._due[job_id], now)
                if closed:
                    self._closing.setdefault(job_id, now)
                self._noted[job_id] = now
            self._cond.notify()

    def _run(self) -> None:
        while (job_id := self._next()) is not None:
            self._summarise(job_id)

    def _summarise(self, job_id: str) -> None:
        with self._cond:
            closing_at = self._closing.get(job_id)
            noted_at = self._noted.get(job_id, -math.inf)
        try:
            report = build_report(self.reader, job_id, self.settings)
            # after a close: the agents may not have shipped the last samples yet, or the store
            # not show the close yet
            unsettled = not (report.complete and report.job.closed)
            # the close not shown yet is the store's lag (a new series on VictoriaMetrics: seconds)
            lag_s = None if report.job.closed else search_lag_s(self.reader)
            if closing_at is not None and unsettled and self._poll_again(job_id, closing_at, lag_s):
                return
            result = self.sink(summary_of(report))
        except JobNotFound as exc:
            if self._poll_again(job_id, noted_at, search_lag_s(self.reader)):  # its first events are not searchable yet
                return
            self._not_written(job_id, exc)
            return
        except BadJob as exc:
            self._not_written(job_id, exc)
            return
        except Exception as exc:  # store down, a bug: retried, never silently lost
            self.failed += 1
            tries = self._failures.get(job_id, 0) + 1
            self._failures[job_id] = tries
            delay = min(self.retry_s * 2 ** (tries - 1), self.max_retry_s)
            kind = "" if isinstance(exc, StoreUnavailable) else f"{type(exc).__name__}: "
            log.warning(
                "job summary of %s failed (attempt %d; again in %.0f s): %s%s",
                job_id[:100],
                tries,
                delay,
                kind,
                str(exc)[:300],
            )
            self._again(job_id, delay)
            return
        if result.rejected:
            log.warning("job summary of %s refused by the store: %s", job_id[:100], "; ".join(result.reasons)[:300])
        else:
            self.written += 1
            if closing_at is not None:  # after a close; running jobs' periodic summaries are not logged
                log.info(
                    "job summary of %s written (%s, %d host(s)%s)",
                    job_id[:100],
                    report.state,
                    len(report.job.hosts),
                    "" if report.complete or report.state == "running" else ", incomplete: see its notes",
                )
            late = not report.complete and report.state != "running"  # a running job lacks what is not shipped yet
            if closing_at is not None and late and self._clock() - closing_at < self.recheck_s:
                self._again(job_id, self.running_every_s)  # late samples may still come: look again
            self._converge(job_id, report, closing_at is not None)
            if self.on_closed is not None and report.job.closed:
                self.on_closed(report)
        self._forget(job_id)
        with self._cond:
            self._done[job_id] = self._clock()
            if len(self._done) > self.max_jobs:  # forget the oldest
                for old in sorted(self._done, key=self._done.__getitem__)[: len(self._done) - self.max_jobs]:
                    del self._done[old]

    def _poll_again(self, job_id: str, since: float, at_least_s: float | None = None) -> bool:
        """Look at ``job_id`` again in ``poll_s`` if ``wait_s`` (at least ``at_least_s``: for
        events the store does not show yet) has not passed ``since``."""
        left_s = max(self.wait_s, at_least_s or 0.0) - (self._clock() - since)
        if left_s > 0:
            self._again(job_id, min(self.poll_s, left_s))
        return left_s > 0

    def _not_written(self, job_id: str, exc: Exception) -> None:
        log.warning("job summary of %s not written: %s", job_id[:100], " ".join(str(exc).split())[:300])
        self._forget(job_id)

    def _converge(self, job_id: str, report: Report, closed_now: bool) -> None:
        """No stored summary stays wrong once the store knows better: a job's close (its own, or
        one made for its dead holder, possibly long after the fact) changes the figures of the
        jobs that shared its hosts, so they are computed again; a summary that counted another
        job as still running is computed again when that job's lease ends."""
        if closed_now:
            for other in neighbours(self.reader, report.job, time.time_ns()):
                self._again(other, 0.0)
        if report.depends_until_ns is not None and report.job.closed:
            delay_s = (report.depends_until_ns - time.time_ns()) / 1e9 + self.poll_s
            if 0 < delay_s < self.recheck_s:
                self._again(job_id, delay_s)

    def _forget(self, job_id: str) -> None:
        with self._cond:
            self._failures.pop(job_id, None)
            if job_id not in self._due:
                self._closing.pop(job_id, None)
                self._noted.pop(job_id, None)
