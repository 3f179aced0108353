"""``wattline sweep``: its options, parsed, and the call (:mod:`wattline.sweep.command`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from wattline.cli import panels
from wattline.cli.agent_entry import agent_settings
from wattline.cli.options import VERBOSE, StoreChoice, report_options, store_options
from wattline.config import ConfigError, parse_pairs
from wattline.reports.model import ReportSettings
from wattline.units import parse_duration

if TYPE_CHECKING:  # the sweep's machinery (jobs, tuning, reports) loads when a sweep runs
    from wattline.sweep.command import Outputs


def _outputs(sla: str | None, as_json: bool, plot: Path | None, html: Path | None, csv: Path | None) -> Outputs:
    """The outputs, checked before anything runs (a bad --plot is found now, not after an hour)."""
    from wattline.cli import outputs
    from wattline.sweep.command import Outputs

    outputs.check_report_outputs(plot, html)
    rate = None
    if sla is not None:
        text = sla.strip().removesuffix("/h")
        try:
            rate = float(text)
        except ValueError:
            raise ConfigError(f"option --sla: {sla[:100]!r} is not units per hour (e.g. 1000000/h)") from None
        if not rate > 0:
            raise ConfigError(f"option --sla: {sla[:100]!r} is not a positive throughput")
    return Outputs(rate, as_json, plot, html, csv)


@store_options
@report_options
def sweep(
    command: list[str] | None = typer.Argument(None, help="The command, after --; {NAME} takes each --param's value."),
    params: list[str] | None = typer.Option(
        None,
        "--param",
        "-p",
        help="NAME=V1,V2,... (repeat); power_limit (W), cpu_max_freq, cpu_governor: applied by wattline.",
        rich_help_panel=panels.STUDY,
    ),
    repeat: int = typer.Option(
        3, "--repeat", "-r", help="Runs of each point, interleaved.", rich_help_panel=panels.STUDY
    ),
    resume: str | None = typer.Option(
        None, "--resume", help="Resume sweep ID: reuse its runs done, run the rest.", rich_help_panel=panels.STUDY
    ),
    job: str | None = typer.Option(
        None, "--job", help="Name of the sweep's jobs (default: the command's name).", rich_help_panel=panels.JOB
    ),
    kind: str = typer.Option("other", "--kind", help="inference, training or other.", rich_help_panel=panels.JOB),
    units: str = typer.Option(
        "units", "--units", help="Name of the work unit (inferences, sequences, tokens).", rich_help_panel=panels.UNITS
    ),
    labels: list[str] | None = typer.Option(
        None, "--label", "-l", help="Job label KEY=VALUE for every run (repeat).", rich_help_panel=panels.JOB
    ),
    sla: str | None = typer.Option(
        None, "--sla", help="Target units per hour (N or N/h): the best settings for it.", rich_help_panel=panels.STUDY
    ),
    saturated_after: str | None = typer.Option(
        None, "--saturated-after", help="Saturated this long after each start.", rich_help_panel=panels.UNITS
    ),
    units_from_stdout: str | None = typer.Option(
        None, "--units-from-stdout", help="Regex counting units on stdout.", rich_help_panel=panels.UNITS
    ),
    collectors: list[str] | None = typer.Option(
        None, "--collector", help="Job events to this collector (with --store).", rich_help_panel=panels.STORE
    ),
    interval: float | None = typer.Option(
        None, "--interval", "-i", help="Embedded sampling interval, seconds.", rich_help_panel=panels.HOST
    ),
    sysfs_root: Path | None = typer.Option(
        None, "--sysfs-root", help="Root for /sys and /proc (sources and cpufreq).", rich_help_panel=panels.HOST
    ),
    sources: list[str] | None = typer.Option(
        None, "--source", help="Sources for embedded sampling (repeat).", rich_help_panel=panels.HOST
    ),
    host_id: str | None = typer.Option(
        None, "--host-id", help="Host identity (must match the host agent's).", rich_help_panel=panels.HOST
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the answer as JSON (commands' output: stderr).", rich_help_panel=panels.OUTPUT
    ),
    plot: Path | None = typer.Option(
        None, "--plot", help="Draw the Pareto figure to FILE.png or FILE.svg.", rich_help_panel=panels.OUTPUT
    ),
    html: Path | None = typer.Option(
        None, "--html", help="Write a self-contained page to FILE.html.", rich_help_panel=panels.OUTPUT
    ),
    csv: Path | None = typer.Option(
        None, "--csv", help="Write one CSV row per point to FILE.", rich_help_panel=panels.OUTPUT
    ),
    verbose: bool = VERBOSE,
    *,
    choice: StoreChoice,
    rsettings: ReportSettings,
) -> None:
    """Run COMMAND over a grid of settings, each point several times as a job, and rank the
    settings by energy per unit, with the Pareto front against throughput and which
    differences are real (beyond both the measurement bound and the spread of the runs)."""
    from wattline.jobs.wrappers.job_command import Job, check_host, claimed_devices, job_spec
    from wattline.jobs.wrappers.run import RunRequest, units_pattern
    from wattline.sweep import plan as plans
    from wattline.sweep.command import run_sweep
    from wattline.sweep.grid import parse_params

    out = _outputs(sla, as_json, plot, html, csv)
    settings, doc = agent_settings(
        choice.config, interval=interval, sysfs_root=sysfs_root, host_id=host_id, sources=sources, collectors=collectors
    )
    if resume is not None:
        if command or params:
            raise ConfigError("--resume ID takes the sweep's command and --param from its plan: give neither")
        from wattline.agent.spool.outbox import outbox_root

        the_plan = plans.load(outbox_root(settings.outbox_dir), resume)
    else:
        if not command:
            raise ConfigError("wattline sweep: give the command after --")
        if kind not in {"inference", "training", "other"}:
            raise ConfigError(f"option --kind: {kind!r} is not inference, training or other")
        units_pattern(units_from_stdout)
        name = job or Path(command[0]).name
        after = parse_duration(saturated_after, "--saturated-after") if saturated_after else None
        the_plan = plans.Plan(
            plans.new_id(name), parse_params(params or []), list(command), repeat, name, kind, units,
            parse_pairs(labels or [], "--label"), after, units_from_stdout,
        )  # fmt: skip
    spec = job_spec(the_plan.sweep_id, the_plan.name, the_plan.kind, the_plan.units, {}, claimed_devices(None))
    check_host(spec, settings)
    request = RunRequest(list(the_plan.command), spec, stdout_to_stderr=as_json)
    template = Job(request, settings, doc, collectors, choice.job_store(), verbose)
    root = sysfs_root or Path("/")
    raise typer.Exit(run_sweep(the_plan, template, rsettings, root, out))


def register(app: typer.Typer) -> None:
    """Add ``sweep`` to ``app``."""
    app.command(
        cls=panels.PanelCommand, rich_help_panel=panels.MEASURE, context_settings={"allow_interspersed_args": False}
    )(sweep)
