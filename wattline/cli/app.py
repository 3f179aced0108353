"""The typer app: every command, and the one-line error policy of :mod:`wattline.cli.main` for them."""

from __future__ import annotations

import importlib
import os
import sys

import typer

from wattline import __version__
from wattline.cli import daemons, jobs, outputs, panels, slurm, sweep, workload, workload_service
from wattline.cli.agent_entry import start_logging
from wattline.cli.errors import COMMON_ERRORS, exit_status, one_line, say_error
from wattline.config import ConfigError

app = typer.Typer(
    name="wattline",
    cls=panels.PanelGroup,
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
slurm.register(app)
workload_service.register(workload.app)
workload.register(app)
sweep.register(app)


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
    from wattline.agent.spool.outbox import outbox_root
    from wattline.agent.tuning.records import restore_dead, restore_dir

    start_logging(log_level)
    # settings a dead sweep changed are put back by the next wattline command on the host
    restore_dead(restore_dir(outbox_root("")), lambda line: print(f"wattline: {line}", file=sys.stderr, flush=True))


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


#: The store's errors (module, class) that end as one ``store:`` line.
STORE_ERRORS = (
    ("wattline.stores.base", "StoreUnavailable"),
    ("wattline.stores.influxdb.influxql", "QueryError"),
    ("sqlite3", "Error"),
)


def _loaded(*names: tuple[str, str]) -> tuple[type[BaseException], ...]:
    """The error classes ``(module, class)`` of the modules loaded: a module a command never
    loaded raised nothing, and ``--help`` need not load the store back-ends to say so."""
    return tuple(getattr(sys.modules[module], name) for module, name in names if module in sys.modules)


def run() -> None:
    """Run the app, turning expected errors into one line (the policy in :mod:`wattline.cli.main`)."""
    try:
        code = app(prog_name="wattline", standalone_mode=False)
    except USAGE_ERRORS as exc:  # a bad flag, a bad value, a missing argument
        if type(exc).__name__ == "NoArgsIsHelpError":  # "wattline" alone: the help
            exc.show()  # type: ignore[attr-defined]
        else:
            ctx = getattr(exc, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            say_error(f"{where}{exc.format_message()}")  # type: ignore[attr-defined]
        sys.exit(getattr(exc, "exit_code", 2))
    except ABORTS:
        sys.exit(130)
    except (ConfigError, KeyboardInterrupt) as exc:  # before the store errors: some are ConfigErrors too
        sys.exit(exit_status(exc))
    except _loaded(("wattline.jobs.wrappers.run", "CommandNotStarted")) as exc:  # wattline run: as a shell says it
        say_error(str(exc))
        sys.exit(exc.status)  # type: ignore[attr-defined]
    except _loaded(*STORE_ERRORS) as exc:
        if os.environ.get("WATTLINE_DEBUG"):
            raise
        say_error(f"store: {one_line(str(exc)) or type(exc).__name__}")
        sys.exit(1)
    except COMMON_ERRORS as exc:
        sys.exit(exit_status(exc))
    sys.exit(code if isinstance(code, int) else 0)
