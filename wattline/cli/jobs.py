"""``wattline run``, ``report``, ``jobs`` and ``compare``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from wattline.agent.settings import AgentSettings
from wattline.cli.agent_entry import agent_settings, read_config
from wattline.cli.daemons import (
    INFLUX_API,
    INFLUX_BUCKET,
    INFLUX_DATABASE,
    INFLUX_ORG,
    INFLUX_TOKEN_FILE,
)
from wattline.collector.daemon import store_from_settings
from wattline.collector.lineprotocol import clip
from wattline.collector.settings import CollectorSettings
from wattline.collector.stores.base import Store, StoreUnavailable
from wattline.collector.stores.influx_v1 import InfluxV1Store, QueryError
from wattline.collector.stores.reader import OpenReader, Reader
from wattline.config import ConfigError, build, parse_pairs
from wattline.units import parse_duration
from wattline.workloads import economics
from wattline.workloads.carbon import IntensitySeries, parse_intensity
from wattline.workloads.embedded import default_store_url
from wattline.workloads.events import JobSpec, check_storable
from wattline.workloads.job import default_job_id
from wattline.workloads.jobs_view import AmbiguousJob, JobNotFound, all_views, resolve_job
from wattline.workloads.render import (
    comparison_json,
    estimate_share,
    print_comparison,
    print_jobs,
    print_report,
    report_json,
)
from wattline.workloads.report import Report, ReportSettings, build_complete_report, build_report, report_wait_s
from wattline.workloads.run import (
    RunRequest,
    check_command,
    devices_from_env,
    parse_devices,
    resolve_gpu_claims,
    run_job,
    units_pattern,
)

STORE_HELP = (
    "Store to read/write: sqlite:///PATH or http://influxdb:8086 (default: $WATTLINE_STORE or the local SQLite file)."
)
CONFIG_HELP = "TOML config file ([agent], [collector], [sources.NAME] tables)."


@dataclass
class StoreChoice:
    """The store a command reads (``run``: also writes): ``--store``, then the
    ``--influx-*`` flags over ``WATTLINE_COLLECTOR_*`` over the ``[collector]`` table of
    ``--config``, as for the collector."""

    store: str | None
    config: Path | None
    influx: dict[str, Any] = field(default_factory=dict)

    def settings(self) -> CollectorSettings:
        flags = {"store": self.store or default_store_url(), **self.influx}
        settings = build(CollectorSettings, "collector", read_config(self.config), flags=flags)
        if settings.influx_api not in {"auto", "v1", "v2"}:
            raise ConfigError(f"option --influx-api: {settings.influx_api[:100]!r} is not auto, v1 or v2")
        return settings

    def open(self) -> Store:
        """The store, for writing (created when it is a new SQLite file)."""
        return store_from_settings(self.settings())


def store_choice(
    store: str | None,
    config: Path | None,
    influx_api: str | None,
    influx_database: str | None,
    influx_org: str | None,
    influx_bucket: str | None,
    influx_token_file: Path | None,
) -> StoreChoice:
    """A :class:`StoreChoice` from the command's options."""
    influx = dict(
        influx_api=influx_api,
        influx_database=influx_database,
        influx_org=influx_org,
        influx_bucket=influx_bucket,
        influx_token_file=influx_token_file,
    )
    return StoreChoice(store, config, influx)


def open_reader(choice: StoreChoice) -> OpenReader:
    """Open the store a report reads, read-only: a SQLite file must already be a wattline
    store (nothing is created), an InfluxDB database must exist (ConfigError, exit 2)."""
    settings = choice.settings()
    opened = store_from_settings(settings, read_only=True)
    try:
        if not isinstance(opened, OpenReader):
            raise ConfigError(
                f"store {settings.store}: reports cannot read from a {opened.kind} store "
                "(use the InfluxDB 1.x API, --influx-api v1, or SQLite)"
            )
        if isinstance(opened, InfluxV1Store):
            _check_database(opened)
    except BaseException:
        opened.close()
        raise
    return opened


def _check_database(store: InfluxV1Store) -> None:
    """ConfigError when the database a report would read does not exist (its queries would
    just find nothing), or the server answers no InfluxQL (VictoriaMetrics)."""
    try:
        store.query("SELECT time_ns FROM job_events LIMIT 1")
    except QueryError as exc:
        if "database not found" in str(exc):
            raise ConfigError(
                f"InfluxDB {store.url} has no database {store.database[:100]!r} (--influx-database)"
            ) from None
        if "answers no InfluxQL" in str(exc):
            raise ConfigError(str(exc)) from None
        raise RuntimeError(f"InfluxDB {store.url}: {exc}") from None


def job_spec(job_id: str, name: str, kind: str, units: str, labels: dict[str, str], devices: list[str]) -> JobSpec:
    """The job's spec; a job id no store can hold is a ConfigError (one line, exit 2), raised
    before the command starts."""
    try:
        return JobSpec(job_id, name, kind, units, labels, devices)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_host(spec: JobSpec, settings: AgentSettings) -> None:
    """ConfigError (one line, exit 2) before the command starts when the job's events from
    this host (id, labels, job labels) are points no store would keep."""
    try:
        check_storable(spec, settings.host_id or socket.gethostname(), settings.labels)
    except ValueError as exc:
        raise ConfigError(f"job events from this host cannot be stored: {exc}") from None


def report_settings(
    price: float | None, carbon_intensity: str | None, pue: float, idle: str, share_rule: str
) -> ReportSettings:
    """The report's settings; ``carbon_intensity`` is a number or a CSV file (:mod:`.carbon`)."""
    if idle not in {"none", "subtract"}:
        raise ConfigError(f"option --idle: {idle!r} is not none or subtract")
    if share_rule not in {"equal", "device-share", "exclusive"}:
        raise ConfigError(f"option --share-rule: {share_rule!r} is not equal, device-share or exclusive")
    if pue < 1.0:
        raise ConfigError(f"option --pue: {pue} is below 1")
    if price is not None and price < 0:
        raise ConfigError(f"option --price: {price} is negative")
    carbon = parse_intensity(carbon_intensity)
    if isinstance(carbon, IntensitySeries):
        return ReportSettings(price, None, pue, idle, share_rule=share_rule, carbon_series=carbon)
    return ReportSettings(price, carbon, pue, idle, share_rule=share_rule)


VERBOSE = typer.Option(False, "--verbose", "-v", help="Log each source's discovery, not one summary line.")
PRICE = typer.Option(None, "--price", help="Instance price, USD per instance-hour (cost figures).")
CARBON = typer.Option(
    None,
    "--carbon-intensity",
    help="Grid carbon intensity: gCO2 per kWh, or a CSV file time,gco2_per_kwh applied interval by interval.",
)
PUE = typer.Option(1.0, "--pue", help="Power usage effectiveness applied to CO2 (>= 1).")
IDLE = typer.Option("none", "--idle", help="Idle policy: none (total energy) or subtract (above the pre-job baseline).")
SHARE = typer.Option(
    "equal", "--share-rule", help="Split of host-wide energy between concurrent jobs: equal, device-share, exclusive."
)


def _emit_report(report: Report, as_json: bool, report_json_path: Path | None) -> None:
    data = report_json(report)
    if report_json_path is not None:
        report_json_path.write_text(json.dumps(data, indent=2) + "\n")
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        print_report(report, Console(file=sys.stdout))


def run(
    command: list[str] = typer.Argument(..., help="The command to run, after --."),
    job: str | None = typer.Option(None, "--job", help="Job name (default: the command's name)."),
    job_id: str | None = typer.Option(
        None, "--job-id", help="Job id shared by every host (default: $SLURM_JOB_ID, $TORCHELASTIC_RUN_ID, or new)."
    ),
    kind: str = typer.Option("other", "--kind", help="inference, training or other."),
    units: str = typer.Option("units", "--units", help="Name of the work unit (inferences, sequences, tokens)."),
    labels: list[str] | None = typer.Option(None, "--label", "-l", help="Job label KEY=VALUE (repeat)."),
    devices: str | None = typer.Option(
        None,
        "--devices",
        help="Devices charged in full: 0,1 or gpu:UUID or neuroncore:0-3 "
        "(default: CUDA_VISIBLE_DEVICES / NEURON_RT_VISIBLE_CORES).",
    ),
    collectors: list[str] | None = typer.Option(
        None,
        "--collector",
        help="Send job events to this collector (a host agent samples); repeat for fail-over. "
        "Default: embedded sampling into the local store.",
    ),
    saturated_after: str | None = typer.Option(
        None,
        "--saturated-after",
        help="Treat the job as saturated this long after start (e.g. 30s), overriding detection.",
    ),
    units_from_stdout: str | None = typer.Option(
        None,
        "--units-from-stdout",
        help="Regex on the command's stdout lines; group 1 is the unit count (else 1 per match).",
    ),
    report_json_path: Path | None = typer.Option(
        None, "--report-json", help="Also write the report as JSON to this file."
    ),
    store: str | None = typer.Option(None, "--store", help=STORE_HELP),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    interval: float | None = typer.Option(None, "--interval", "-i", help="Embedded sampling interval, seconds."),
    sysfs_root: Path | None = typer.Option(None, "--sysfs-root", help="Root for /sys and /proc (embedded sampling)."),
    sources: list[str] | None = typer.Option(
        None, "--source", help="Sources for embedded sampling (repeat; default all)."
    ),
    host_id: str | None = typer.Option(
        None, "--host-id", help="Host identity (must match the host agent's; default hostname)."
    ),
    no_report: bool = typer.Option(False, "--no-report", help="Do not print the report at the end."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live status line on a terminal's stderr."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    price: float | None = PRICE,
    carbon_intensity: str | None = CARBON,
    pue: float = PUE,
    idle: str = IDLE,
    share_rule: str = SHARE,
    influx_api: str | None = INFLUX_API,
    influx_database: str | None = INFLUX_DATABASE,
    influx_org: str | None = INFLUX_ORG,
    influx_bucket: str | None = INFLUX_BUCKET,
    influx_token_file: Path | None = INFLUX_TOKEN_FILE,
    verbose: bool = VERBOSE,
) -> None:
    """Run COMMAND inside a job window: count its units, attribute energy, print the report.

    Exits with COMMAND's exit status (127: not found, 126: not executable, as a shell;
    nothing is recorded then). With --json, COMMAND's stdout goes to stderr.
    """
    if kind not in {"inference", "training", "other"}:
        raise ConfigError(f"option --kind: {kind!r} is not inference, training or other")
    rsettings = report_settings(price, carbon_intensity, pue, idle, share_rule)
    after = parse_duration(saturated_after, "--saturated-after") if saturated_after else None
    units_pattern(units_from_stdout)
    name = job or Path(command[0]).name
    claims = resolve_gpu_claims(parse_devices(devices) if devices else devices_from_env(os.environ))
    spec = job_spec(job_id or default_job_id(name), name, kind, units, parse_pairs(labels or [], "--label"), claims)
    settings, doc = agent_settings(
        config, interval=interval, sysfs_root=sysfs_root, host_id=host_id, sources=sources, collectors=collectors
    )
    check_host(spec, settings)
    choice = store_choice(store, config, influx_api, influx_database, influx_org, influx_bucket, influx_token_file)
    check_command(command)
    request = RunRequest(list(command), spec, after, units_from_stdout, stdout_to_stderr=as_json)
    kept: list[str] = []
    live_out = sys.stderr if not quiet and sys.stderr.isatty() else None
    with sources_line(verbose) as on_sources:
        status = run_job(
            request,
            settings,
            doc,
            collectors,
            on_kept=kept.append,
            open_store=choice.open,
            on_sources=on_sources,
            live_out=live_out,
        )
    if kept:  # no collector acknowledged the events: they wait in the outbox (no report yet)
        typer.echo(f"wattline: {kept[0]}", err=True)
    elif collectors and store is None:
        typer.echo(
            f"job {spec.job_id} recorded; report: wattline report {spec.job_id} --store <the collector's store>",
            err=True,
        )
    elif not no_report or report_json_path:
        with after_the_command(status):
            with open_reader(choice) as reader:
                report = build_complete_report(reader, spec.job_id, rsettings, report_wait_s(settings.batch_interval))
            if no_report:
                report_json_path.write_text(json.dumps(report_json(report), indent=2) + "\n")  # type: ignore[union-attr]
            else:
                _emit_report(report, as_json, report_json_path)
    raise typer.Exit(status)


@contextlib.contextmanager
def sources_line(verbose: bool) -> Iterator[Callable[[str], None]]:
    """Quiets the log lines of the first discovery (unless ``verbose``) and yields what prints
    the one summary line instead."""
    logger = logging.getLogger("wattline.agent.registry")
    level = logger.level
    if not verbose:
        logger.setLevel(logging.ERROR)

    def show(line: str) -> None:
        logger.setLevel(level)
        typer.echo(f"wattline: {line}", err=True)

    try:
        yield show
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def after_the_command(status: int) -> Iterator[None]:
    """Once the command has run, a failed report is one line and the exit status stays the
    command's (1 if the command succeeded)."""
    try:
        yield
    except (ConfigError, OSError, RuntimeError, ValueError, StoreUnavailable, QueryError, sqlite3.Error) as exc:
        typer.echo(f"wattline: error: report: {' '.join(str(exc).split()) or type(exc).__name__}", err=True)
        raise typer.Exit(status or 1) from None


JOB_HELP = "an id, a unique id prefix, a job name (its latest run) or latest (see `wattline jobs`)"


def report(
    job_id: str = typer.Argument(..., metavar="JOB", help=f"Job: {JOB_HELP}."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (documented, stable shape)."),
    store: str | None = typer.Option(None, "--store", help=STORE_HELP),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    price: float | None = PRICE,
    carbon_intensity: str | None = CARBON,
    pue: float = PUE,
    idle: str = IDLE,
    share_rule: str = SHARE,
    influx_api: str | None = INFLUX_API,
    influx_database: str | None = INFLUX_DATABASE,
    influx_org: str | None = INFLUX_ORG,
    influx_bucket: str | None = INFLUX_BUCKET,
    influx_token_file: Path | None = INFLUX_TOKEN_FILE,
    plot: Path | None = typer.Option(None, "--plot", help="Also draw power over time to FILE.png or FILE.svg."),
    by_host: bool = typer.Option(False, "--by-host", help="With --plot/--html: one line per host, not stacked."),
    html: Path | None = typer.Option(None, "--html", help="Also write a self-contained HTML page to FILE.html."),
) -> None:
    """Energy, throughput, J per unit, cost and CO2 of one job: the measured window (from
    saturation to end) beside the whole run, and how the job ended."""
    from wattline.cli import outputs

    rsettings = report_settings(price, carbon_intensity, pue, idle, share_rule)
    outputs.check_report_outputs(plot, html)
    with open_reader(
        store_choice(store, config, influx_api, influx_database, influx_org, influx_bucket, influx_token_file)
    ) as reader:
        result = report_or_exit(reader, job_id, rsettings)
        outputs.write_report_outputs(reader, result, plot, html, by_host)
    _emit_report(result, as_json, None)


def report_or_exit(reader: Reader, ref: str, settings: ReportSettings) -> Report:
    """The report of the job ``ref`` names (:func:`resolve_job`); one line and exit 2 when it
    names none or several."""
    try:
        return build_complete_report(reader, resolve_job(reader, ref), settings)
    except (JobNotFound, AmbiguousJob) as exc:
        raise ConfigError(str(exc)) from None


def jobs(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    store: str | None = typer.Option(None, "--store", help=STORE_HELP),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    energy: bool = typer.Option(True, "--energy/--no-energy", help="Compute each job's energy (a report per job)."),
    influx_api: str | None = INFLUX_API,
    influx_database: str | None = INFLUX_DATABASE,
    influx_org: str | None = INFLUX_ORG,
    influx_bucket: str | None = INFLUX_BUCKET,
    influx_token_file: Path | None = INFLUX_TOKEN_FILE,
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV: one row per job with its report's figures."),
    price: float | None = PRICE,
    carbon_intensity: str | None = CARBON,
) -> None:
    """List jobs: id, name, status (exit code, running, abandoned), start, duration, hosts,
    units and, unless --no-energy, the whole run's energy and the measured J per unit.

    A job whose stored events are bad is listed with its ``error``; it never stops the listing.
    """
    choice = store_choice(store, config, influx_api, influx_database, influx_org, influx_bucket, influx_token_file)
    if as_csv:
        from wattline.cli import outputs

        with open_reader(choice) as reader:
            outputs.jobs_csv(reader, report_settings(price, carbon_intensity, 1.0, "none", "equal"))
        return
    rows: list[dict[str, Any]] = []
    now_ns = time.time_ns()
    with open_reader(choice) as reader:
        for view in all_views(reader):
            row: dict[str, Any] = {
                "id": view.job_id,
                "name": view.name,
                "kind": view.kind,
                "hosts": sorted(view.hosts),
                "start_ns": view.start_ns,
                "closed": view.closed,
                "status": view.state(now_ns),  # closed | running | abandoned
                "last_heard_ns": None if view.closed else view.last_heard_ns(),
                "exit_code": view.exit_code,
                "duration_s": (view.end_ns(now_ns) - view.start_ns) / 1e9,
                "units": view.units_total,
                "unit": view.unit_name,
            }
            try:
                view.check()
                if energy:
                    r = build_report(reader, view.job_id, now_ns=now_ns)
                    row.update(
                        saturated=r.saturated,
                        energy_data=r.energy_data,
                        measured_energy_j=r.measured.energy_j,
                        total_energy_j=r.measured.energy_j + r.warmup.energy_j,
                        j_per_unit=r.figures.j_per_unit,
                        estimate_share=estimate_share(r.measured, r.warmup),
                    )
            except ValueError as exc:  # BadJob, or figures that cannot be computed
                row.update(units=None, error=" ".join(str(exc).split()))
            rows.append(row)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        print_jobs(rows, Console(file=sys.stdout), energy)


def compare(
    job_a: str = typer.Argument(..., metavar="A", help=f"Baseline job (A): {JOB_HELP}."),
    job_b: str = typer.Argument(..., metavar="B", help="Candidate job (B), named the same ways."),
    sla: float | None = typer.Option(
        None, "--sla", help="Target throughput, units per hour: instances needed each way."
    ),
    work: float | None = typer.Option(None, "--work", help="Units of work to process (time, energy, cost each way)."),
    instances: int | None = typer.Option(
        None, "--instances", help="Instances each way for --work (default: the job's host count)."
    ),
    price_a: float | None = typer.Option(None, "--price-a", help="A's price, USD per instance-hour."),
    price_b: float | None = typer.Option(None, "--price-b", help="B's price, USD per instance-hour."),
    carbon_intensity: str | None = CARBON,
    carbon_a: str | None = typer.Option(None, "--carbon-intensity-a", help="A's carbon intensity (number or CSV)."),
    carbon_b: str | None = typer.Option(None, "--carbon-intensity-b", help="B's carbon intensity (number or CSV)."),
    pue: float = PUE,
    idle: str = IDLE,
    allow_different_units: bool = typer.Option(
        False, "--allow-different-units", help="Compare jobs that count different units (tokens vs documents)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    store: str | None = typer.Option(None, "--store", help=STORE_HELP),
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    influx_api: str | None = INFLUX_API,
    influx_database: str | None = INFLUX_DATABASE,
    influx_org: str | None = INFLUX_ORG,
    influx_bucket: str | None = INFLUX_BUCKET,
    influx_token_file: Path | None = INFLUX_TOKEN_FILE,
    plot: Path | None = typer.Option(None, "--plot", help="Also draw the study's bars to FILE.png or FILE.svg."),
) -> None:
    """The study's table for two measured jobs: throughput, instances for an SLA, energy, cost, CO2."""
    from wattline.cli import outputs

    settings_a = report_settings(None, carbon_a or carbon_intensity, pue, idle, "equal")
    settings_b = report_settings(None, carbon_b or carbon_intensity, pue, idle, "equal")
    _check_compare(sla, work, instances, price_a, price_b)
    outputs.check_report_outputs(plot, None)
    with open_reader(
        store_choice(store, config, influx_api, influx_database, influx_org, influx_bucket, influx_token_file)
    ) as reader:
        a = report_or_exit(reader, job_a, settings_a)
        b = report_or_exit(reader, job_b, settings_b)
    if a.job.unit_name != b.job.unit_name and not allow_different_units:
        raise ConfigError(
            f"A counts {clip(a.job.unit_name, 40)} and B counts {clip(b.job.unit_name, 40)}: "
            "per-unit figures would not compare; pass --allow-different-units to compare anyway"
        )
    cmp = economics.compare(
        a.figures.measured,
        b.figures.measured,
        sla_units_per_hour=sla,
        work_units=work,
        instances=instances,
        price_a=price_a,
        price_b=price_b,
        carbon_intensity=a.settings.carbon_intensity,  # a CSV's energy-weighted value (workloads/carbon.py)
        carbon_intensity_b=b.settings.carbon_intensity,
        pue=pue,
    )
    if plot is not None:
        outputs.write_compare_plot(comparison_json(a, b, cmp), a, b, plot)
    if as_json:
        typer.echo(json.dumps(comparison_json(a, b, cmp), indent=2))
    else:
        print_comparison(a, b, cmp, Console(file=sys.stdout))


def _check_compare(
    sla: float | None, work: float | None, instances: int | None, price_a: float | None, price_b: float | None
) -> None:
    """ConfigError (one line, exit 2) for a value no comparison can use."""
    if sla is not None and not sla > 0:
        raise ConfigError(f"option --sla: {sla} is not a positive throughput (units per hour)")
    if work is not None and not work >= 0:
        raise ConfigError(f"option --work: {work} is negative")
    if instances is not None and instances < 1:
        raise ConfigError(f"option --instances: {instances} is below 1")
    for name, value in (("--price-a", price_a), ("--price-b", price_b)):
        if value is not None and not value >= 0:
            raise ConfigError(f"option {name}: {value} is negative")


def register(app: typer.Typer) -> None:
    """Add these commands to ``app``."""
    app.command(context_settings={"allow_interspersed_args": False})(run)
    app.command()(report)
    app.command()(jobs)
    app.command()(compare)


__all__ = ["AgentSettings", "register"]
