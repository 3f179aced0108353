"""``wattline run``'s body, shared with the reference workloads: check the job before the
command starts, run the command as a job (:func:`run_job`), then build and show its report.

The CLI parses options and calls these. Before the command starts a bad value is a
:class:`ConfigError` (one line, exit 2); once it has run, a report that cannot be built is
one line and the exit status stays the command's (:func:`after_the_command`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import socket
import sqlite3
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rich.console import Console

from wattline.agent.settings import AgentSettings
from wattline.config import ConfigError
from wattline.jobs.events import JobSpec, check_storable
from wattline.jobs.job_env import with_owner
from wattline.jobs.wrappers.claims import devices_from_env, parse_devices, resolve_gpu_claims
from wattline.jobs.wrappers.run import RunRequest, run_job
from wattline.reports.build import build_complete_report, report_wait_s
from wattline.reports.model import Report, ReportSettings
from wattline.reports.output.render import print_report
from wattline.reports.report_json import report_json
from wattline.stores.base import Store, StoreUnavailable
from wattline.stores.influxdb.influxql import QueryError
from wattline.stores.reader import OpenReader

#: Failures of a report once the command has run: one line, never the command's status lost.
REPORT_ERRORS = (
    ConfigError,
    OSError,
    RuntimeError,
    ValueError,
    LookupError,
    StoreUnavailable,
    QueryError,
    sqlite3.Error,
)


def say(line: str) -> None:
    """One line on stderr, as the CLI's other messages."""
    print(line, file=sys.stderr, flush=True)


@dataclass
class JobStore:
    """Where the job's events go (embedded sampling) and its report is read from."""

    open: Callable[[], Store]
    open_reader: Callable[[], OpenReader]
    named: bool  # --store given: a collector's store is then read here


@dataclass
class Job:
    """A job ready to run: its command, its host's settings and its store."""

    request: RunRequest
    settings: AgentSettings
    doc: Mapping[str, Any]
    collectors: list[str] | None
    store: JobStore
    verbose: bool = False
    live_out: IO[str] | None = None  # a terminal's stderr: the live line (wattline/jobs/wrappers/live.py)


def claimed_devices(devices: str | None) -> list[str]:
    """The devices the job is charged for in full: ``--devices``, else the environment's."""
    return resolve_gpu_claims(parse_devices(devices) if devices else devices_from_env(os.environ))


def job_spec(
    job_id: str, name: str, kind: str, units: str, labels: dict[str, str], devices: list[str], service: bool = False
) -> JobSpec:
    """The job's spec; a job id no store can hold is a ConfigError (one line, exit 2), raised
    before the command starts."""
    try:
        return JobSpec(job_id, name, kind, units, with_owner(labels), devices, service)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_host(spec: JobSpec, settings: AgentSettings) -> None:
    """ConfigError (one line, exit 2) before the command starts when the job's events from
    this host (id, labels, job labels) are points no store would keep."""
    try:
        check_storable(spec, settings.host_id or socket.gethostname(), settings.labels)
    except ValueError as exc:
        raise ConfigError(f"job events from this host cannot be stored: {exc}") from None


@contextlib.contextmanager
def sources_line(verbose: bool) -> Iterator[Callable[[str], None]]:
    """Quiets the log lines of the first discovery (unless ``verbose``) and yields what prints
    the one summary line instead. Also quiet unless ``verbose``: the note that an earlier job
    whose wrapper died was ended (``wattline jobs`` shows it abandoned)."""
    logger, holders = logging.getLogger("wattline.agent.registry"), logging.getLogger("wattline.agent.holders.registry")
    level, holders_level = logger.level, holders.level
    if not verbose:
        logger.setLevel(logging.ERROR)
        holders.setLevel(logging.WARNING)

    def show(line: str) -> None:
        logger.setLevel(level)
        say(f"wattline: {line}")

    try:
        yield show
    finally:
        logger.setLevel(level)
        holders.setLevel(holders_level)


def run_in_job(job: Job, settings: ReportSettings | None = None) -> tuple[int, bool]:
    """Run the job's command; (its exit status, whether its report is to be read elsewhere).
    ``settings``: the report's, also those of the summary an embedded run stores.

    Elsewhere, said in one line: no collector acknowledged the events (they wait in the
    outbox), or a collector recorded them in a store not named here."""
    kept: list[str] = []
    with sources_line(job.verbose) as on_sources:
        status = run_job(
            request=job.request,
            settings=job.settings,
            doc=job.doc,
            collectors=job.collectors,
            on_kept=kept.append,
            open_store=job.store.open,
            on_sources=on_sources,
            live_out=job.live_out,
            report_settings=settings,
        )
    spec = job.request.spec
    if kept:
        say(f"wattline: {kept[0]}")
    elif job.collectors and not job.store.named:
        # Quoted: the id is pasted into a shell, and ids may hold spaces and quotes.
        hint = f"wattline report {shlex.quote(spec.job_id)} --store <the collector's store>"
        say(f"job {spec.job_id} recorded; report: {hint}")
    else:
        return status, False
    return status, True


def after_the_command(status: int, then: Callable[[], None]) -> int:
    """Run ``then`` (the report) once the command has run: a failure is one line and the exit
    status stays the command's (1 if the command succeeded)."""
    try:
        then()
    except REPORT_ERRORS as exc:
        say(f"wattline: error: report: {' '.join(str(exc).split()) or type(exc).__name__}")
        return status or 1
    return status


def read_report(job: Job, settings: ReportSettings) -> Report:
    """The job's complete report, read once its command has ended."""
    with job.store.open_reader() as reader:
        return build_complete_report(
            reader, job.request.spec.job_id, settings, report_wait_s(job.settings.batch_interval), closed=True
        )


def emit_report(report: Report, as_json: bool, report_json_path: Path | None) -> None:
    """The report on stdout (a table, or JSON), and as JSON to ``report_json_path``."""
    data = report_json(report)
    if report_json_path is not None:
        report_json_path.write_text(json.dumps(data, indent=2) + "\n")
    if as_json:
        print(json.dumps(data, indent=2), flush=True)
    else:
        print_report(report, Console(file=sys.stdout))


def run_and_report(job: Job, settings: ReportSettings, show: bool, as_json: bool, report_json_path: Path | None) -> int:
    """``wattline run``: the command's exit status once it has run as a job and its report is
    shown (``show``) and written to ``report_json_path``."""
    status, elsewhere = run_in_job(job, settings)
    if elsewhere or not (show or report_json_path):
        return status

    def report() -> None:
        result = read_report(job, settings)
        if show:
            emit_report(result, as_json, report_json_path)
        else:
            report_json_path.write_text(json.dumps(report_json(result), indent=2) + "\n")  # type: ignore[union-attr]

    return after_the_command(status, report)
