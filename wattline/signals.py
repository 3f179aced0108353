"""Signals that stop a daemon, turned into a :class:`threading.Event` safely.

A Python signal handler runs on the main thread between two of its bytecodes. If that thread
is inside ``Event.wait`` at that moment it holds the event's internal lock, and a handler
that calls ``Event.set`` waits for that lock for ever: a SIGTERM that hangs the daemon it
should stop (the agent did, under load). So the handler here only writes a byte to a pipe;
a thread of its own reads the pipe and sets the event.

Floor 1: imports nothing of the project.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterable
from types import FrameType

__all__ = ["STOP_SIGNALS", "set_on_signals"]

#: What stops a daemon: systemd's and Kubernetes' stop signal, and Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def set_on_signals(event: threading.Event, signals: Iterable[int] = STOP_SIGNALS) -> None:
    """Set ``event`` when one of ``signals`` arrives (call from the main thread)."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(write_fd, False)  # a flood of signals fills the pipe; the handler never waits

    def handler(_signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(BlockingIOError):  # the pipe is full: the event is being set already
            os.write(write_fd, b"!")

    def relay() -> None:
        while os.read(read_fd, 64):
            event.set()

    threading.Thread(target=relay, name="wattline-signals", daemon=True).start()
    for sig in signals:
        signal.signal(sig, handler)
