"""Files made from reports: ``report --plot/--html``, ``compare --plot``, ``jobs --csv``
and ``export``. Option checks run before any work, so a bad path is one line, exit 2."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from wattline.cli import panels
from wattline.cli.options import IDLE, JOB_HELP, SHARE, StoreChoice, report_settings, store_options
from wattline.config import ConfigError
from wattline.jobs.jobs_view import all_views
from wattline.reports.model import Report, ReportSettings

if TYPE_CHECKING:  # stores and report outputs load in the commands that write them
    from wattline.stores.reader import Reader


def check_report_outputs(plot: Path | None, html: Path | None) -> None:
    """ConfigError for a --plot that is not .png/.svg, or an --html that is not .html/.htm;
    also when matplotlib is missing (its install hint)."""
    from wattline.reports.output import plot as plotting

    if plot is not None:
        plotting.check_path(plot)
    if html is not None and html.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"option --html: {str(html)[:100]!r} must end in .html")
    if plot is not None or html is not None:
        plotting.pyplot()


def write_report_outputs(
    reader: Reader, report: Report, plot: Path | None, html: Path | None, by_host: bool = False
) -> None:
    """Write the report's figure and page (the store is read once more for the timeline)."""
    if plot is None and html is None:
        return
    from wattline.reports.output import page
    from wattline.reports.output import plot as plotting
    from wattline.reports.timeline import build_timeline

    timeline = build_timeline(reader, report)
    if plot is not None:
        _write(plot, lambda: plotting.save(plotting.plot_report(report, timeline, by_host), plot))
    if html is not None:
        svg = plotting.svg_text(plotting.plot_report(report, timeline, by_host))
        text = page.report_page(report, svg, timeline.series)
        _write(html, lambda: html.write_text(text, encoding="utf-8"))


def write_compare_plot(data: dict[str, Any], a: Report, b: Report, plot: Path) -> None:
    """Write ``compare --plot`` from the comparison JSON and the two reports (footnotes)."""
    from wattline.reports.output import plot as plotting

    notes = plotting.comparison_footnotes({"A": a, "B": b})
    _write(plot, lambda: plotting.save(plotting.plot_comparison(data, a.job.unit_name, notes), plot))


def write_curve(report: Report, path: Path) -> None:
    """Write ``report --curve``: energy per unit against load, one point per interval."""
    from wattline.reports.output import plot as plotting

    _write(path, lambda: plotting.save(plotting.plot_curve(report), path))


def _write(path: Path, write: Any) -> None:
    try:
        write()
    except OSError as exc:
        raise ConfigError(f"cannot write {str(path)[:100]!r}: {exc.strerror or exc}") from None
    typer.echo(f"wrote {path}", err=True)


def jobs_csv(
    reader: Reader,
    settings: ReportSettings,
    labels: dict[str, str] | None = None,
    any_of: dict[str, str] | None = None,
) -> None:
    """``jobs --csv``: one row per job (with every one of ``labels``, at least one of
    ``any_of`` where given) on stdout; a job whose events are bad has its error."""
    from wattline.reports.output import export as export_rows
    from wattline.reports.summaries.reading import labelled, listed_report

    rows: list[dict[str, Any]] = []
    for view in labelled(all_views(reader), labels, any_of):
        try:
            view.check()
            rows.append(export_rows.job_row(listed_report(reader, view.job_id, settings)))
        except ValueError as exc:
            rows.append(
                {"job_id": view.job_id, "name": view.name, "kind": view.kind, "error": " ".join(str(exc).split())}
            )
    export_rows.write_csv(rows, export_rows.JOB_COLUMNS, sys.stdout)


def export(reader: Reader, job_id: str, csv_path: str, settings: ReportSettings | None = None) -> None:
    """``export JOB --csv FILE|-``: the job's samples, cut at its window and saturation point,
    each with what the report (under ``settings``) charged the job for it."""
    from wattline.reports.output import export as export_rows
    from wattline.reports.summaries.reading import report_or_exit

    report = report_or_exit(reader, job_id, settings or ReportSettings())
    rows = export_rows.sample_rows(reader, report)
    if csv_path == "-":
        export_rows.write_csv(rows, export_rows.SAMPLE_COLUMNS, sys.stdout)
        return
    path = Path(csv_path)
    try:
        with path.open("w", encoding="utf-8", newline="") as out:
            n = export_rows.write_csv(rows, export_rows.SAMPLE_COLUMNS, out)
    except OSError as exc:
        raise ConfigError(f"option --csv: cannot write {csv_path[:100]!r}: {exc.strerror or exc}") from None
    typer.echo(f"wrote {n} samples to {path}", err=True)


@store_options
def export_command(
    job_id: str = typer.Argument(..., metavar="JOB", help=f"Job: {JOB_HELP}."),
    csv_path: str = typer.Option(
        ..., "--csv", help="CSV file to write, or - for stdout.", rich_help_panel=panels.OUTPUT
    ),
    idle: str = IDLE,
    share_rule: str = SHARE,
    *,
    choice: StoreChoice,
) -> None:
    """The job's samples as CSV: time, host, source, component, device, quality, window, energy,
    power, and what the job was charged for each (as `wattline report` splits the host)."""
    settings = report_settings(None, None, 1.0, idle, share_rule)
    with choice.reader() as reader:
        export(reader, job_id, csv_path, settings)


def register(app: typer.Typer) -> None:
    """Add ``export`` to ``app``."""
    app.command(name="export", cls=panels.PanelCommand, rich_help_panel=panels.READ)(export_command)
