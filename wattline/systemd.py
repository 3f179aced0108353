"""systemd service notification (``sd_notify``) without any dependency.

A ``Type=notify`` unit tells systemd that it is up with ``READY=1``, that it is going down
with ``STOPPING=1``, what it is doing with ``STATUS=...``, and that it is alive with
``WATCHDOG=1`` at least every ``WatchdogSec=`` (systemd passes the interval in
``WATCHDOG_USEC``). Each message is one datagram of ``KEY=VALUE`` lines sent to the
``AF_UNIX`` socket named by ``$NOTIFY_SOCKET``: a filesystem path, or an abstract-namespace
name written with a leading ``@``.

Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op returning False, so the
daemons call these helpers unconditionally. A failed send is logged at debug level and
returns False: a notification never takes a daemon down.

Floor 1: imports nothing of the project.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)

__all__ = ["notify", "ready", "status", "stopping", "watchdog", "watchdog_interval"]


def _address(env: Mapping[str, str]) -> str | None:
    """The socket address in ``$NOTIFY_SOCKET`` as ``socket.connect`` takes it, or None."""
    name = env.get("NOTIFY_SOCKET", "")
    if name.startswith("@") and len(name) > 1:
        return "\0" + name[1:]  # abstract namespace
    if name.startswith("/"):
        return name
    # Unset, empty, relative, or a transport this module does not speak (vsock:...).
    return None


def notify(state: str) -> bool:
    """Send ``state`` (newline-separated ``KEY=VALUE`` assignments) to systemd.

    Returns True when the datagram was sent, False when not under systemd or on any error.
    """
    address = _address(os.environ)
    if address is None or not state:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode("utf-8"))
    except (OSError, UnicodeError) as exc:
        log.debug("sd_notify %r failed: %s", state.split("\n", 1)[0], exc)
        return False
    return True


def _one_line(text: str) -> str:
    """``text`` without line breaks, which would start another assignment."""
    return " ".join(text.splitlines())


def ready(status_text: str | None = None) -> bool:
    """``READY=1``: start-up finished (sources discovered, port bound), optionally with a status."""
    return notify("READY=1" if status_text is None else f"READY=1\nSTATUS={_one_line(status_text)}")


def stopping() -> bool:
    """``STOPPING=1``: shutdown has begun."""
    return notify("STOPPING=1")


def status(text: str) -> bool:
    """``STATUS=text``: one line shown by ``systemctl status`` (line breaks become spaces)."""
    return notify(f"STATUS={_one_line(text)}")


def watchdog() -> bool:
    """``WATCHDOG=1``: the keep-alive ping ``WatchdogSec=`` expects."""
    return notify("WATCHDOG=1")


def watchdog_interval() -> float | None:
    """Seconds between watchdog pings: half of ``WATCHDOG_USEC``, or None when disabled.

    None when the variable is unset, not a positive integer, or ``WATCHDOG_PID`` names
    another process (the environment was inherited from the service's main process).
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    if not usec.isdigit() or int(usec) == 0:
        return None
    return int(usec) / 2_000_000
