"""A job's processes: its root processes and every descendant, remembered once seen.

``wattline run`` roots the tree at the command it started; the Job API at the calling
process. A process found once stays the job's (its last samples may arrive after it
exited). A process that leaves the tree before it is first seen (a daemon that
double-forks and detaches within one sampling period) is missed; one that detaches later
is kept.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import psutil


class ProcessTree:
    """The pids of ``roots`` and their descendants, accumulated over :meth:`refresh` calls."""

    def __init__(self, roots: Iterable[int]) -> None:
        self.roots = tuple(roots)
        self._known: set[int] = set()
        self._lock = threading.Lock()

    def refresh(self) -> frozenset[int]:
        """Look again; returns every pid of the job seen so far."""
        found: set[int] = set()
        for pid in self.roots:
            try:
                root = psutil.Process(pid)
                found.add(pid)
                found.update(child.pid for child in root.children(recursive=True))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        with self._lock:
            self._known |= found
            return frozenset(self._known)

    @property
    def known(self) -> frozenset[int]:
        """Every pid seen so far, without looking again."""
        with self._lock:
            return frozenset(self._known)
