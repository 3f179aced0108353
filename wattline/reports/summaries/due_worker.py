"""A thread of its own working through a table of jobs due, woken through one condition: the
life cycle the summary writer, the interval writer and the Slurm comment writer share (start,
stop, how many due); :class:`DueAt`, a table of when each job is due, the first two's."""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
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


class DueAt(DueWorker[float]):
    """A worker whose ``_due`` maps a job id to when it is due (``clock`` time, seconds)."""

    def __init__(self, name: str, clock: Callable[[], float]) -> None:
        super().__init__(name)
        self._clock = clock

    def _next(self) -> str | None:
        """Wait for the next due job (None when stopping)."""
        with self._cond:
            while not self._stop:
                if self._due:
                    job_id, at = min(self._due.items(), key=lambda item: item[1])
                    wait = at - self._clock()
                    if wait <= 0:
                        del self._due[job_id]
                        return job_id
                    self._cond.wait(wait)
                else:
                    self._cond.wait()
            return None

    def _again(self, job_id: str, delay_s: float) -> None:
        """``job_id`` due again in ``delay_s`` (or sooner, if it already is)."""
        with self._cond:
            at = self._clock() + delay_s
            self._due[job_id] = min(self._due.get(job_id, at), at)
            self._cond.notify()
