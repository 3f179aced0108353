"""``wattline run``, ``report``, ``jobs`` and ``compare``: their options, parsed, and the call;
the work is on floor 4 (:mod:`wattline.jobs.wrappers.job_command`, :mod:`wattline.reports.summaries.reading`)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import typer

from wattline.cli import panels
from wattline.cli.agent_entry import agent_settings
from wattline.cli.options import (
    AS_JSON,
    CARBON,
    IDLE,
    JOB_HELP,
    MODEL_SPLIT,
    PRICE,
    PUE,
    SHARE,
    VERBOSE,
    StoreChoice,
    print_json,
    report_options,
    report_settings,
    store_options,
)
from wattline.cli.window_options import (
    CURVE,
    EVERY,
    FROM,
    RAW,
    SINCE,
    TO,
    last_window,
    parse_every,
    parse_window,
    positive_duration,
)
from wattline.config import ConfigError, parse_pairs
from wattline.jobs.mine import SERVICE_ACCOUNT_NAMESPACE, check_labels, find_mine
from wattline.reports.model import ReportSettings
from wattline.reports.model_split import check_applies, check_model_split
from wattline.units import parse_duration


@store_options
@report_options
def run(
    command: list[str] = typer.Argument(..., help="The command to run, after --."),
    job: str | None = typer.Option(
        None, "--job", help="Job name (default: the command's name).", rich_help_panel=panels.JOB
    ),
    job_id: str | None = typer.Option(
        None,
        "--job-id",
        help="Job id shared by every host (default: $SLURM_JOB_ID, $TORCHELASTIC_RUN_ID, or new).",
        rich_help_panel=panels.JOB,
    ),
    kind: str = typer.Option("other", "--kind", help="inference, training or other.", rich_help_panel=panels.JOB),
    units: str | None = typer.Option(
        None,
        "--units",
        help="Name of the work unit (inferences, sequences, tokens); default: units, or what --count/--preset counts.",
        rich_help_panel=panels.UNITS,
    ),
    labels: list[str] | None = typer.Option(
        None, "--label", "-l", help="Job label KEY=VALUE (repeat).", rich_help_panel=panels.JOB
    ),
    devices: str | None = typer.Option(
        None,
        "--devices",
        help="Devices charged in full: 0,1 or gpu:UUID or neuroncore:0-3 "
        "(default: CUDA_VISIBLE_DEVICES / NEURON_RT_VISIBLE_CORES).",
        rich_help_panel=panels.JOB,
    ),
    collectors: list[str] | None = typer.Option(
        None,
        "--collector",
        help="Send job events to this collector (a host agent samples); repeat for fail-over. "
        "Default: embedded sampling into the local store.",
        rich_help_panel=panels.STORE,
    ),
    saturated_after: str | None = typer.Option(
        None,
        "--saturated-after",
        help="Treat the job as saturated this long after start (e.g. 30s), overriding detection.",
        rich_help_panel=panels.UNITS,
    ),
    units_from_stdout: str | None = typer.Option(
        None,
        "--units-from-stdout",
        help="Regex on the command's stdout lines; group 1 is the unit count (else 1 per match).",
        rich_help_panel=panels.UNITS,
    ),
    metrics: str | None = typer.Option(
        None,
        "--metrics",
        help="COMMAND serves: count its units from its Prometheus endpoint at this URL.",
        rich_help_panel=panels.ENDPOINT,
    ),
    count: list[str] | None = typer.Option(
        None,
        "--count",
        help='What --metrics counts: NAME=METRIC{MATCHERS} [by LABELS] (e.g. requests=x_total{code="200"}); '
        "repeat: the first is the job's unit, the others extra unit kinds.",
        rich_help_panel=panels.ENDPOINT,
    ),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help="What --metrics counts, for a known server (vllm, triton, tgi, torchserve): all its units, "
        "--units picks the job's (default its first).",
        rich_help_panel=panels.ENDPOINT,
    ),
    latency: list[str] | None = typer.Option(
        None,
        "--latency",
        help="A latency histogram --metrics reads (p50/p99 in reports): NAME=HISTOGRAM [by LABELS] "
        "(repeat; a --preset reads its own).",
        rich_help_panel=panels.ENDPOINT,
    ),
    scrape_every: str | None = typer.Option(
        None, "--scrape-every", help="Time between scrapes of --metrics (default 1s).", rich_help_panel=panels.ENDPOINT
    ),
    service: bool = typer.Option(
        False, "--service", help="The job is a service: it serves until stopped.", rich_help_panel=panels.JOB
    ),
    report_json_path: Path | None = typer.Option(
        None, "--report-json", help="Also write the report as JSON to this file.", rich_help_panel=panels.OUTPUT
    ),
    interval: float | None = typer.Option(
        None, "--interval", "-i", help="Embedded sampling interval, seconds.", rich_help_panel=panels.HOST
    ),
    sysfs_root: Path | None = typer.Option(
        None,
        "--sysfs-root",
        help="Root for /sys and /proc (embedded sampling) and /run/wattline (the agent's edge socket).",
        rich_help_panel=panels.HOST,
    ),
    sources: list[str] | None = typer.Option(
        None, "--source", help="Sources for embedded sampling (repeat; default all).", rich_help_panel=panels.HOST
    ),
    host_id: str | None = typer.Option(
        None,
        "--host-id",
        help="Host identity (must match the host agent's; default hostname).",
        rich_help_panel=panels.HOST,
    ),
    no_report: bool = typer.Option(
        False, "--no-report", help="Do not print the report at the end.", rich_help_panel=panels.OUTPUT
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="No live status line on a terminal's stderr.", rich_help_panel=panels.OUTPUT
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.", rich_help_panel=panels.OUTPUT),
    verbose: bool = VERBOSE,
    *,
    choice: StoreChoice,
    rsettings: ReportSettings,
) -> None:
    """Run COMMAND inside a job window: count its units, attribute energy, print the report.

    Exits with COMMAND's exit status (127: not found, 126: not executable, as a shell;
    nothing is recorded then). With --json, COMMAND's stdout goes to stderr.
    """
    from wattline.jobs.wrappers.job import default_job_id
    from wattline.jobs.wrappers.job_command import Job, check_host, claimed_devices, job_spec, run_and_report
    from wattline.jobs.wrappers.run import RunRequest, check_command, units_pattern
    from wattline.jobs.wrappers.served import served_units

    if kind not in {"inference", "training", "other"}:
        raise ConfigError(f"option --kind: {kind!r} is not inference, training or other")
    after = parse_duration(saturated_after, "--saturated-after") if saturated_after else None
    units_pattern(units_from_stdout)
    served, unit_name = served_units(
        metrics, count, preset, units, scrape_every, units_from_stdout is not None, latency
    )
    name = job or Path(command[0]).name
    labelled = parse_pairs(labels or [], "--label")
    devices_claimed = claimed_devices(devices)
    spec = job_spec(job_id or default_job_id(name), name, kind, unit_name, labelled, devices_claimed, service)
    settings, doc = agent_settings(
        choice.config, interval=interval, sysfs_root=sysfs_root, host_id=host_id, sources=sources, collectors=collectors
    )
    check_host(spec, settings)
    check_command(command)
    request = RunRequest(list(command), spec, after, units_from_stdout, stdout_to_stderr=as_json, served=served)
    live_out = sys.stderr if not quiet and sys.stderr.isatty() else None
    running = Job(request, settings, doc, collectors, choice.job_store(), verbose, live_out)
    raise typer.Exit(run_and_report(running, rsettings, not no_report, as_json, report_json_path))


@store_options
@report_options
def report(
    job_id: str = typer.Argument(..., metavar="JOB", help=f"Job: {JOB_HELP}."),
    as_json: bool = typer.Option(
        False, "--json", help="Print JSON (documented, stable shape).", rich_help_panel=panels.OUTPUT
    ),
    plot: Path | None = typer.Option(
        None, "--plot", help="Also draw power over time to FILE.png or FILE.svg.", rich_help_panel=panels.OUTPUT
    ),
    by_host: bool = typer.Option(
        False, "--by-host", help="With --plot/--html: one line per host, not stacked.", rich_help_panel=panels.OUTPUT
    ),
    html: Path | None = typer.Option(
        None, "--html", help="Also write a self-contained HTML page to FILE.html.", rich_help_panel=panels.OUTPUT
    ),
    since: str | None = SINCE,
    from_: str | None = FROM,
    to: str | None = TO,
    every: str | None = EVERY,
    curve: Path | None = CURVE,
    model_split: str = MODEL_SPLIT,
    raw: bool = RAW,
    *,
    choice: StoreChoice,
    rsettings: ReportSettings,
) -> None:
    """Energy, throughput, J per unit, cost and CO2 of one job: the saturated window (from
    saturation to end) beside the whole run, and how the job ended; or, with --since or
    --from/--to, its figures over that window (a service that does not end), a service's from
    its stored intervals inside the window where they match the report's policy (--raw: not)."""
    from wattline.cli import outputs
    from wattline.jobs.wrappers.job_command import emit_report
    from wattline.reports.interval_reports import interval_figures
    from wattline.reports.summaries.reading import report_or_exit

    window = parse_window(since, from_, to, time.time_ns())
    split = check_model_split(model_split, "--model-split")
    rsettings = dataclasses.replace(rsettings, window=window, model_split=split, from_stored=not raw)
    outputs.check_report_outputs(plot, html)
    every_s = parse_every(every, curve)
    with choice.reader() as reader:
        result = report_or_exit(reader, job_id, rsettings)
        check_applies(result)
        if every_s is not None:
            result.intervals = interval_figures(reader, result.job.job_id, result, every_s, rsettings)
        outputs.write_report_outputs(reader, result, plot, html, by_host)
    if curve is not None and result.intervals is not None:
        outputs.write_curve(result, curve)
    emit_report(result, as_json, None)


@store_options
def jobs(
    as_json: bool = AS_JSON,
    energy: bool = typer.Option(
        True,
        "--energy/--no-energy",
        help="Compute each job's energy (a report per job).",
        rich_help_panel=panels.REPORT,
    ),
    as_csv: bool = typer.Option(
        False, "--csv", help="Print CSV: one row per job with its report's figures.", rich_help_panel=panels.OUTPUT
    ),
    price: float | None = PRICE,
    carbon_intensity: str | None = CARBON,
    pue: float = PUE,
    idle: str = IDLE,
    share_rule: str = SHARE,
    label: list[str] | None = typer.Option(
        None, "--label", "-l", help="Only jobs with label KEY=VALUE (repeat: all).", rich_help_panel=panels.JOB
    ),
    mine: bool = typer.Option(
        False,
        "--mine",
        help="Only my jobs: label user=me (Slurm's job user; a wrapper's own user), or namespace=my "
        "namespace (a pod job's: from --namespace-file, else the kubeconfig's current context).",
        rich_help_panel=panels.JOB,
    ),
    namespace_file: Path = typer.Option(
        Path(SERVICE_ACCOUNT_NAMESPACE),
        "--namespace-file",
        help="The service account's namespace file --mine reads first (in a pod).",
        rich_help_panel=panels.JOB,
    ),
    *,
    choice: StoreChoice,
) -> None:
    """List jobs: id, name, status (exit code, running, abandoned), start, duration, hosts,
    units and, unless --no-energy, the whole run's energy and the saturated window's J per unit
    (each job's report under the same --share-rule and --idle as `wattline report`).

    A job whose stored events are bad is listed with its ``error``; it never stops the listing.
    """
    from rich.console import Console

    from wattline.reports.output.jobs_table import print_jobs
    from wattline.reports.summaries.reading import job_rows

    wanted = parse_pairs(label or [], "--label")
    any_of = None
    if mine:
        me = find_mine(os.environ, namespace_file)
        check_labels(me, wanted)
        for line in (*me.problems, me.line()):
            typer.echo(line, err=True)
        any_of = me.any_of()
    settings = report_settings(price, carbon_intensity, pue, idle, share_rule)
    if as_csv:
        from wattline.cli import outputs

        with choice.reader() as reader:
            outputs.jobs_csv(reader, settings, wanted, any_of)
        return
    with choice.reader() as reader:
        rows = job_rows(reader, energy, wanted, settings, any_of)
    if as_json:
        print_json(rows)
    else:
        print_jobs(rows, Console(file=sys.stdout), energy)


@store_options
def compare(
    job_a: str = typer.Argument(..., metavar="A", help=f"Baseline job (A): {JOB_HELP}."),
    job_b: str = typer.Argument(..., metavar="B", help="Candidate job (B), named the same ways."),
    sla: float | None = typer.Option(
        None,
        "--sla",
        help="Target throughput, units per hour: instances needed each way.",
        rich_help_panel=panels.STUDY,
    ),
    work: float | None = typer.Option(
        None, "--work", help="Units of work to process (time, energy, cost each way).", rich_help_panel=panels.STUDY
    ),
    instances: int | None = typer.Option(
        None,
        "--instances",
        help="Instances each way for --work (default: the job's host count).",
        rich_help_panel=panels.STUDY,
    ),
    price_a: float | None = typer.Option(
        None, "--price-a", help="A's price, USD per instance-hour.", rich_help_panel=panels.REPORT
    ),
    price_b: float | None = typer.Option(
        None, "--price-b", help="B's price, USD per instance-hour.", rich_help_panel=panels.REPORT
    ),
    carbon_intensity: str | None = CARBON,
    carbon_a: str | None = typer.Option(
        None, "--carbon-intensity-a", help="A's carbon intensity (number or CSV).", rich_help_panel=panels.REPORT
    ),
    carbon_b: str | None = typer.Option(
        None, "--carbon-intensity-b", help="B's carbon intensity (number or CSV).", rich_help_panel=panels.REPORT
    ),
    pue: float = PUE,
    idle: str = IDLE,
    share_rule: str = SHARE,
    allow_different_units: bool = typer.Option(
        False,
        "--allow-different-units",
        help="Compare jobs that count different units (tokens vs documents).",
        rich_help_panel=panels.STUDY,
    ),
    as_json: bool = AS_JSON,
    plot: Path | None = typer.Option(
        None, "--plot", help="Also draw the study's bars to FILE.png or FILE.svg.", rich_help_panel=panels.OUTPUT
    ),
    last: str | None = typer.Option(
        None,
        "--last",
        help="Each job's last DURATION only (15m): two services compared as they serve now.",
        rich_help_panel=panels.STUDY,
    ),
    *,
    choice: StoreChoice,
) -> None:
    """The study's table for two jobs: throughput, instances for an SLA, energy, cost, CO2."""
    from rich.console import Console

    from wattline.cli import outputs
    from wattline.reports.output.comparison import comparison_json, print_comparison
    from wattline.reports.summaries.reading import compare_jobs, report_or_exit

    settings_a = report_settings(None, carbon_a or carbon_intensity, pue, idle, share_rule)
    settings_b = report_settings(None, carbon_b or carbon_intensity, pue, idle, share_rule)
    _check_compare(sla, work, instances, price_a, price_b)
    outputs.check_report_outputs(plot, None)
    last_s = None if last is None else positive_duration(last, "--last")
    with choice.reader() as reader:
        a = report_or_exit(reader, job_a, settings_a)
        b = report_or_exit(reader, job_b, settings_b)
        if last_s is not None:  # each over its own last stretch: the window ends where the job does
            a = report_or_exit(reader, a.job.job_id, last_window(a, settings_a, last_s))
            b = report_or_exit(reader, b.job.job_id, last_window(b, settings_b, last_s))
    cmp = compare_jobs(a, b, allow_different_units, sla, work, instances, price_a, price_b, pue)
    if plot is not None:
        outputs.write_compare_plot(comparison_json(a, b, cmp), a, b, plot)
    if as_json:
        print_json(comparison_json(a, b, cmp))
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
    app.command(
        cls=panels.PanelCommand, rich_help_panel=panels.MEASURE, context_settings={"allow_interspersed_args": False}
    )(run)
    app.command(cls=panels.PanelCommand, rich_help_panel=panels.READ)(report)
    app.command(cls=panels.PanelCommand, rich_help_panel=panels.READ)(jobs)
    app.command(cls=panels.PanelCommand, rich_help_panel=panels.READ)(compare)
