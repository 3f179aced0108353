"""Console-script entry (``wattline``) and its one-line error policy.

``wattline agent`` starts the agent without loading the command-line libraries
(:mod:`wattline.cli.agent_entry`); every other command, ``--help`` and every usage error go
to the typer app (:mod:`wattline.cli.app`).

Every error ends as one line on stderr and a non-zero exit, never a traceback
(``WATTLINE_DEBUG=1`` shows tracebacks):

- 2: usage, configuration or input: a bad flag or value, a config file that does not
  parse or names an unknown table or option, a store path that holds no wattline store,
  an InfluxDB database that does not exist, a job that is not in the store;
- 1: a runtime failure: a store unreachable or failing, an error while running;
- ``wattline run``: the command's own status; 127 / 126 when it cannot start (as a shell);
- ``wattline sweep``: 1 when a run's command failed (the other runs still run; one line
  names the failed points: :func:`wattline.sweep.command.failed_line`);
- 130: interrupted.

An unknown ``WATTLINE_*`` environment variable is one warning line, not an error.
"""

from __future__ import annotations

import sys
from typing import Any

from wattline.agent.grpc_io import defer_grpc

defer_grpc()  # first: gRPC reads its I/O settings when imported (wattline/agent/grpc_io.py)

from wattline.cli.agent_entry import agent_command  # noqa: E402
from wattline.cli.errors import COMMON_ERRORS, exit_status  # noqa: E402


def main() -> None:
    """Console-script entry: the agent's lean path, else the typer app."""
    try:
        status = agent_command(sys.argv[1:])
    except COMMON_ERRORS as exc:
        sys.exit(exit_status(exc))
    if status is None:
        from wattline.cli.app import run

        run()
    sys.exit(status)


def __getattr__(name: str) -> Any:
    """``app``: the typer app, loaded on first use (tests drive it with typer's runner)."""
    if name == "app":
        from wattline.cli.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
