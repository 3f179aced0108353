"""Entry point: the typer app and the one-line error policy.

Every user error (bad option value, malformed config, unreachable file) ends as one line
on stderr and a non-zero exit, never a traceback. ``WATTLINE_DEBUG=1`` shows tracebacks.
"""

from __future__ import annotations

import logging
import os
import sys

import typer

from wattline import __version__
from wattline.cli import daemons, jobs
from wattline.config import ConfigError

app = typer.Typer(
    name="wattline",
    help="Energy telemetry for machine-learning fleets: measure what each job costs in J, USD and CO2.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
daemons.register(app)
jobs.register(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"wattline {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    log_level: str = typer.Option("info", "--log-level", envvar="WATTLINE_LOG_LEVEL", help="debug, info, warning."),
) -> None:
    """wattline: per-host agent, collector, job wrappers and reports."""
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise ConfigError(f"option --log-level: {log_level!r} is not debug, info, warning or error")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def main() -> None:
    """Console-script entry: run the app, turning expected errors into one line."""
    try:
        app()
    except ConfigError as exc:
        typer.echo(f"wattline: error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except (OSError, RuntimeError, ValueError) as exc:
        if os.environ.get("WATTLINE_DEBUG"):
            raise
        typer.echo(f"wattline: error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
