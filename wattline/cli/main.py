"""Entry point: the typer app and the one-line error policy.

Every error ends as one line on stderr and a non-zero exit, never a traceback
(``WATTLINE_DEBUG=1`` shows tracebacks):

- 2: usage, configuration or input: a bad flag or value, a config file that does not
  parse or names an unknown table or option, a store path that holds no wattline store,
  an InfluxDB database that does not exist, a job that is not in the store;
- 1: a runtime failure: a store unreachable or failing, an error while running;
- ``wattline run``: the command's own status; 127 / 126 when it cannot start (as a shell);
- 130: interrupted.

An unknown ``WATTLINE_*`` environment variable is one warning line, not an error.
"""

from __future__ import annotations

import importlib
import logging
import os
import sqlite3
import sys

import typer

from wattline import __version__
from wattline.cli import daemons, jobs, outputs, workload
from wattline.collector.stores.base import StoreUnavailable
from wattline.collector.stores.influx_v1 import QueryError
from wattline.config import ConfigError
from wattline.workloads.run import CommandNotStarted

app = typer.Typer(
    name="wattline",
    help="Energy telemetry for machine-learning fleets: measure what each job costs in J, USD and CO2.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # help texts are plain: "[agent]" is a TOML table, not markup
    context_settings={"help_option_names": ["-h", "--help"]},
)
daemons.register(app)
jobs.register(app)
outputs.register(app)
workload.register(app)


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
    for line in daemons.environment_warnings():
        typer.echo(f"wattline: warning: {line}", err=True)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _usage_errors() -> tuple[tuple[type[Exception], ...], tuple[type[BaseException], ...]]:
    """(usage error classes, abort classes): typer's own click copy (typer >= 0.20), and click's."""
    usage: list[type[Exception]] = []
    abort: list[type[BaseException]] = [typer.Abort]
    vendored = getattr(typer, "TyperException", None)
    if isinstance(vendored, type):
        usage.append(vendored)
    try:
        click = importlib.import_module("click")
    except ImportError:
        pass
    else:
        usage.append(click.ClickException)
        abort.append(click.exceptions.Abort)
    return tuple(usage), tuple(abort)


USAGE_ERRORS, ABORTS = _usage_errors()


def main() -> None:
    """Console-script entry: run the app, turning expected errors into one line."""
    try:
        code = app(prog_name="wattline", standalone_mode=False)
    except USAGE_ERRORS as exc:  # a bad flag, a bad value, a missing argument
        if type(exc).__name__ == "NoArgsIsHelpError":  # "wattline" alone: the help
            exc.show()  # type: ignore[attr-defined]
        else:
            ctx = getattr(exc, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            typer.echo(f"wattline: error: {where}{_one_line(exc.format_message())}", err=True)  # type: ignore[attr-defined]
        sys.exit(getattr(exc, "exit_code", 2))
    except ABORTS:
        sys.exit(130)
    except ConfigError as exc:
        typer.echo(f"wattline: error: {_one_line(str(exc))}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except CommandNotStarted as exc:  # wattline run: as a shell says it
        typer.echo(f"wattline: error: {_one_line(str(exc))}", err=True)
        sys.exit(exc.status)
    except (StoreUnavailable, QueryError, sqlite3.Error) as exc:
        if os.environ.get("WATTLINE_DEBUG"):
            raise
        typer.echo(f"wattline: error: store: {_one_line(str(exc)) or type(exc).__name__}", err=True)
        sys.exit(1)
    except (OSError, RuntimeError, ValueError) as exc:
        if os.environ.get("WATTLINE_DEBUG"):
            raise
        typer.echo(f"wattline: error: {_one_line(str(exc)) or type(exc).__name__}", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
