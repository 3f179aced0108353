"""The errors every command ends alike: one line on stderr, then an exit status.

No CLI library here: ``wattline agent`` reports its errors without loading one.
"""

from __future__ import annotations

import os
import sys

from wattline.config import ConfigError

#: What :func:`exit_status` turns into one line (a usage error, an interrupt, a runtime failure).
COMMON_ERRORS: tuple[type[BaseException], ...] = (ConfigError, KeyboardInterrupt, OSError, RuntimeError, ValueError)


def one_line(text: str) -> str:
    return " ".join(text.split())


def say_error(text: str) -> None:
    """``wattline: error: TEXT`` on stderr, on one line."""
    print(f"wattline: error: {one_line(text)}", file=sys.stderr, flush=True)


def exit_status(exc: BaseException) -> int:
    """The exit status of one of :data:`COMMON_ERRORS`, after its line: 2 for configuration, 130
    for an interrupt, 1 for a runtime failure (re-raised with ``WATTLINE_DEBUG=1``)."""
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, ConfigError):
        say_error(str(exc))
        return 2
    if os.environ.get("WATTLINE_DEBUG"):
        raise exc
    say_error(str(exc) or type(exc).__name__)
    return 1
