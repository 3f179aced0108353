"""What ``wattline report``, ``jobs`` and ``compare`` read: the store opened read-only,
a job named the ways :func:`resolve_job` takes, the jobs' list and two jobs compared.

The CLI parses options and calls these; a bad value or a job that is not in the store is
a :class:`ConfigError` (one line, exit 2).

A store may show a write some seconds after it took it (VictoriaMetrics: a new series, such
as a job's open or close; ``search_lag_s``), and to one query before another: a job named
is looked for again until that time has passed, a job the list shows running says what the
store may not show yet, and one the list found that a read by its id does not find yet has
that as its row's ``error``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from wattline.collector.daemon import store_from_settings
from wattline.collector.settings import CollectorSettings
from wattline.config import ConfigError
from wattline.jobs.jobs_view import (
    AmbiguousJob,
    JobNotFound,
    JobView,
    all_views,
    resolve_job,
    shown_as_of,
)
from wattline.reports import economics
from wattline.reports.build import POLL_S, build_complete_report, build_report, search_lag_s
from wattline.reports.model import Report, ReportSettings
from wattline.reports.window_view import OutsideJob
from wattline.reports.windows import estimate_fraction
from wattline.stores.reader import CheckedReader, OpenReader, Reader
from wattline.text import clip


def open_reader(settings: CollectorSettings) -> OpenReader:
    """Open the store a report reads, read-only: a SQLite file must already be a wattline
    store (nothing is created), an InfluxDB database must exist (ConfigError, exit 2)."""
    opened = store_from_settings(settings, read_only=True)
    try:
        if not isinstance(opened, OpenReader):
            raise ConfigError(
                f"store {settings.store}: reports cannot read from a {opened.kind} store "
                "(use the InfluxDB 1.x API, --influx-api v1, VictoriaMetrics, Prometheus or SQLite)"
            )
        if isinstance(opened, CheckedReader):
            opened.check_readable()
    except BaseException:
        opened.close()
        raise
    return opened


class NotShownYet(ValueError):
    """A job the list of jobs shows that a read by its id does not find (yet)."""


def report_or_exit(reader: Reader, ref: str, settings: ReportSettings) -> Report:
    """The report of the job ``ref`` names (:func:`resolve_job`); one line and exit 2 when it
    names none or several. A job the store does not show is looked for again until the
    store's :func:`search_lag_s` has passed (it may have been written moments ago); ``latest``
    on such a store says that a job opened since may not be shown yet."""
    shown_by = time.monotonic() + search_lag_s(reader)
    while True:
        try:
            report = build_complete_report(reader, resolve_job(reader, ref), settings)
            if ref == "latest" and (shown := shown_as_of(reader, time.time_ns())):
                # the newest job the store shows: one opened since may not be shown yet
                report.notes.append(f"the latest job {shown}; a job opened since may not be shown yet")
            return report
        except JobNotFound as exc:
            if time.monotonic() >= shown_by:
                raise ConfigError(str(exc)) from None
        except (AmbiguousJob, OutsideJob) as exc:
            raise ConfigError(str(exc)) from None
        time.sleep(POLL_S)


def listed_report(
    reader: Reader, job_id: str, settings: ReportSettings | None = None, now_ns: int | None = None
) -> Report:
    """:func:`build_report` of a job the list of jobs shows; :class:`NotShownYet` (the row's
    error) when a read by its id does not find it: the store shows a new series to one query
    before another (VictoriaMetrics: seen for seconds after a job's open)."""
    try:
        return build_report(reader, job_id, settings, now_ns=now_ns)
    except JobNotFound:
        why = shown_as_of(reader, now_ns or time.time_ns()) or "the store answered two reads differently"
        raise NotShownYet(f"listed, but a read by its id finds no event yet ({why}): run again") from None


def job_rows(
    reader: Reader,
    energy: bool,
    labels: Mapping[str, str] | None = None,
    settings: ReportSettings | None = None,
    any_of: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``wattline jobs``: one row per job (the JSON shape) that has every one of ``labels`` and
    at least one of ``any_of`` where given (``--mine``: my user or my namespace); with
    ``energy``, each job's figures from its report under ``settings`` (those of ``wattline
    report`` by default), and its status as that report read it (a later read than the
    list's: the two agree). A job whose stored events are bad has its ``error``, never stops
    the list."""
    rows: list[dict[str, Any]] = []
    now_ns = time.time_ns()
    shown = shown_as_of(reader, now_ns)
    for view in labelled(all_views(reader), labels, any_of):
        figures: dict[str, Any] = {}
        try:
            view.check()
            if energy:
                r = listed_report(reader, view.job_id, settings, now_ns=now_ns)
                view = r.job
                figures = {
                    "saturated": r.saturated,
                    "energy_data": r.energy_data,
                    "saturated_energy_j": r.saturated_window.energy_j,
                    "measured_energy_j": r.saturated_window.energy_j,  # deprecated name of saturated_energy_j
                    "total_energy_j": r.saturated_window.energy_j + r.warmup.energy_j,
                    "j_per_unit": r.figures.j_per_unit,
                    "estimate_fraction": estimate_fraction(r.saturated_window, r.warmup),
                    "estimate_share": estimate_fraction(r.saturated_window, r.warmup),  # its deprecated name
                    "complete": r.complete,  # False: samples the store does not show yet (the report's notes)
                }
        except ValueError as exc:  # BadJob, NotShownYet, or figures that cannot be computed
            figures = {"units": None, "error": " ".join(str(exc).split())}
        row = _job_row(view, now_ns)
        if row["status"] == "running" and shown:
            row["status_note"] = shown  # its close may be written and not shown yet
        rows.append({**row, **figures})
    return rows


def _job_row(view: JobView, now_ns: int) -> dict[str, Any]:
    """What a ``wattline jobs`` row says of the job itself."""
    return {
        "id": view.job_id,
        "name": view.name,
        "kind": view.kind,
        "hosts": sorted(view.hosts),
        "start_ns": view.start_ns,
        "closed": view.closed,
        "status": view.state(now_ns),  # closed | running | abandoned
        "last_heard_ns": view.heard_at_ns,
        "end_reason": view.end_reason,
        "end_state": view.end_state,
        "exit_code": view.exit_code,
        "duration_s": (view.end_ns(now_ns) - view.start_ns) / 1e9,
        "units": view.units_total,
        "unit": view.unit_name,
        "missing_events": view.missing_events,  # host -> events not stored: its window starts at its evidence
        "labels": dict(view.labels),  # a pod-job's namespace, pod and owner (docs/operations/kubernetes.md)
    }


def labelled(
    views: list[JobView], labels: Mapping[str, str] | None, any_of: Mapping[str, str] | None = None
) -> list[JobView]:
    """The views that carry every one of ``labels`` (KEY=VALUE, ``jobs --label``) and, where
    ``any_of`` is given, at least one of its (``jobs --mine``)."""
    return [
        v
        for v in views
        if all(v.labels.get(k) == val for k, val in (labels or {}).items())
        and (not any_of or any(v.labels.get(k) == val for k, val in any_of.items()))
    ]


def compare_jobs(
    a: Report,
    b: Report,
    allow_different_units: bool,
    sla: float | None,
    work: float | None,
    instances: int | None,
    price_a: float | None,
    price_b: float | None,
    pue: float,
) -> economics.Comparison:
    """``wattline compare``: B's saturated-window figures against A's (:func:`economics.compare`); a
    ConfigError when they count different units, unless allowed."""
    if a.job.unit_name != b.job.unit_name and not allow_different_units:
        raise ConfigError(
            f"A counts {clip(a.job.unit_name, 40)} and B counts {clip(b.job.unit_name, 40)}: "
            "per-unit figures would not compare; pass --allow-different-units to compare anyway"
        )
    return economics.compare(
        a.figures.window,
        b.figures.window,
        sla_units_per_hour=sla,
        work_units=work,
        instances=instances,
        price_a=price_a,
        price_b=price_b,
        carbon_intensity=a.settings.carbon_intensity,  # a CSV's energy-weighted value (reports/carbon.py)
        carbon_intensity_b=b.settings.carbon_intensity,
        pue=pue,
    )
