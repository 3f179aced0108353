"""Supervision of the ``neuron-monitor`` child process.

The child runs in its own session (a terminal's Ctrl-C reaches the agent, which stops
it), its stdout is read line by line on a thread and handed to a callback, its stderr is
drained (never left to fill a pipe) with the last line kept for error messages, and it
is restarted with exponential back-off when it exits: ``backoff_initial_s`` doubling up
to ``backoff_max_s``, reset once a child lived ``backoff_reset_s``. ``stop()``
terminates, waits ``terminate_timeout_s``, kills and reaps: no zombie.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, Final, Protocol

log = logging.getLogger("wattline.agent.sources.neuron")

#: Longest stdout line read (a report with many runtimes is large, but bounded).
MAX_LINE: Final = 8 << 20


class Backoff(Protocol):
    """The supervision settings (NeuronOptions has them)."""

    @property
    def backoff_initial_s(self) -> float: ...
    @property
    def backoff_max_s(self) -> float: ...
    @property
    def backoff_reset_s(self) -> float: ...
    @property
    def terminate_timeout_s(self) -> float: ...


class Supervisor:
    """Runs a child, feeds each stdout line to ``on_line``, restarts it with back-off."""

    def __init__(
        self, argv: list[str], env: Mapping[str, str], on_line: Callable[[bytes], None], opts: Backoff
    ) -> None:
        self._argv = argv
        self._env = {**os.environ, **env}
        self._on_line = on_line
        self._opts = opts
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="neuron-monitor", daemon=True)
        self.starts = 0
        self.last_exit = ""
        self.stderr_last = ""

    def start(self) -> None:
        self._thread.start()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    def _run(self) -> None:
        delay = self._opts.backoff_initial_s
        while not self._stop.is_set():
            began = time.monotonic()
            proc, error = self._spawn()
            if proc is None and error is None:
                return  # stopped before spawning
            if proc is not None:
                self._pump(proc)
                if self._stop.is_set():
                    return
                if time.monotonic() - began >= self._opts.backoff_reset_s:
                    delay = self._opts.backoff_initial_s
                tail = f": {self.stderr_last}" if self.stderr_last else ""
                self.last_exit = f"exited with status {proc.returncode}{tail}"
            else:
                self.last_exit = f"could not start: {error}"
            log.warning("neuron-monitor %s; restarting in %.2f s", self.last_exit, delay)
            if self._stop.wait(delay):
                return
            delay = min(delay * 2.0, self._opts.backoff_max_s)

    def _spawn(self) -> tuple[subprocess.Popen[bytes] | None, str | None]:
        with self._lock:
            if self._stop.is_set():
                return None, None
            try:
                proc = subprocess.Popen(
                    self._argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=self._env,
                    start_new_session=True,  # a terminal's Ctrl-C reaches the agent, not the child
                )
            except OSError as exc:
                return None, str(exc)
            self._proc = proc
            self.starts += 1
            self.stderr_last = ""  # exit messages quote this child's stderr only
            return proc, None

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        drain = threading.Thread(target=self._drain, args=(proc.stderr,), name="neuron-monitor-stderr", daemon=True)
        drain.start()
        with proc.stdout:
            while line := proc.stdout.readline(MAX_LINE):
                try:
                    self._on_line(line)
                except Exception:  # a bug in one line's handling must not stop the reader
                    log.exception("neuron-monitor: failed to handle a report line")
        proc.wait()
        drain.join(timeout=1.0)

    def _drain(self, stream: IO[bytes]) -> None:
        with stream:
            for raw in iter(stream.readline, b""):
                if text := raw.decode(errors="replace").strip():
                    self.stderr_last = text[:300]
                    log.debug("neuron-monitor stderr: %s", text)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout=self._opts.terminate_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._opts.terminate_timeout_s + 2.0)
