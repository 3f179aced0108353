"""A stop signal stops a daemon whatever its main thread is doing: the handler never takes
the lock of the event it sets (a SIGTERM that arrived inside ``Event.wait`` hung the agent)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from procs import clean_env

#: The main thread spends nearly all its time inside ``Event.wait``, holding the event's lock:
#: where a handler that sets the event itself hangs.
SPINNER = """
import sys, threading
from wattline.signals import set_on_signals
stop = threading.Event()
set_on_signals(stop)
print("ready", flush=True)
while not stop.wait(0):
    pass
print("stopped", flush=True)
"""


def test_sigterm_stops_a_main_thread_that_waits_on_the_event() -> None:
    for _ in range(5):
        child = subprocess.Popen([sys.executable, "-c", SPINNER], env=clean_env(), stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            for _ in range(10):  # more than one: each is a new chance to land inside the wait
                child.send_signal(signal.SIGTERM)
                time.sleep(0.02)
            out, _ = child.communicate(timeout=20)
        finally:
            child.kill()
            child.wait()
        # a signal sent after the stop may end the interpreter on its way out: it has stopped
        assert out == "stopped\n" and child.returncode in (0, -signal.SIGTERM)


def test_a_flood_of_signals_neither_blocks_nor_is_lost() -> None:
    """More signals than the pipe holds before the relay reads it: the handler never waits."""
    child = subprocess.Popen(
        [sys.executable, "-c", SPINNER.replace("wait(0)", "wait(0.5)")],
        env=clean_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        for _ in range(2000):
            child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=20)
    finally:
        child.kill()
        child.wait()
    assert out == "stopped\n" and child.returncode in (0, -signal.SIGINT)
