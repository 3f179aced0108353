"""A thread of its own working through a table of jobs due, woken through one condition: the
life cycle the summary writer and the Slurm comment writer share (start, stop, how many due)."""

from __future__ import annotations

import abc
import threading
from typing import Generic, Self, TypeVar

Due = TypeVar("Due")


class DueWorker(abc.ABC, Generic[Due]):
    """``_due`` (job id -> what the subclass keeps of it) and ``_stop`` change under ``_cond``;
    :meth:`_run` is the thread."""

    def __init__(self, name: str) -> None:
        self._due: dict[str, Due] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @abc.abstractmethod
    def _run(self) -> None:
        """Work until ``_stop``, waiting on ``_cond`` while nothing is due."""

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (what it is doing is finished first, within ``timeout_s``)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def pending(self) -> int:
        """Jobs due (for tests: 0 once everything is done)."""
        with self._cond:
            return len(self._due)
