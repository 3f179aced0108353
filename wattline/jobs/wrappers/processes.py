"""A job's processes: its root processes and every descendant, remembered once seen, and
their CPU time.

``wattline run`` roots the tree at the command it started; the Job API at the calling
process. A process found once stays the job's (its last samples may arrive after it
exited). A process that leaves the tree before it is first seen (a daemon that
double-forks and detaches within one sampling period) is missed; one that detaches later
is kept.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from wattline.agent.usage.cpu_use import NS_PER_TICK


class ProcessTree:
    """The pids of ``roots`` and their descendants, accumulated over :meth:`refresh` calls."""

    def __init__(self, roots: Iterable[int]) -> None:
        self.roots = tuple(roots)
        self._known: set[int] = set()
        #: The processes the last :meth:`refresh` found in the tree (not those seen before).
        self.current: frozenset[int] = frozenset()
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
            self.current = frozenset(found)
            return frozenset(self._known)

    @property
    def known(self) -> frozenset[int]:
        """Every pid seen so far, without looking again."""
        with self._lock:
            return frozenset(self._known)


@dataclass(frozen=True, slots=True)
class _Seen:
    """A process as last read: its start (ticks after boot: with the pid, its identity), parent
    and CPU time in ticks (its own and that of the children it reaped)."""

    start: int
    ppid: int
    ticks: int


class TreeCpu:
    """The CPU time (ns) the job's processes have used so far, read from ``/proc/PID/stat``.

    The processes in the tree now count their own CPU time and that of the children they
    reaped (``cutime``/``cstime``): a process that starts and ends between two reads counts
    through the parent that waited for it. A process that left since the last read counts what
    it had then, unless it went to an ancestor still in the tree (reaped: its parent's
    children's time holds all of it); so what an orphan did after the last read before its
    end, reaped by init, is not counted. The total never goes back.
    """

    def __init__(self, tree: ProcessTree, proc: Path = Path("/proc")) -> None:
        self.tree, self.proc = tree, proc
        self._seen: dict[int, _Seen] = {}
        self._gone = 0  #: ticks of processes that left the tree and were not reaped in it
        self._total = 0

    def read(self) -> int:
        """The tree's CPU time so far, ns."""
        self.tree.refresh()
        live: dict[int, _Seen] = {}
        for pid in self.tree.current | self._seen.keys():
            now = _stat(self.proc / str(pid) / "stat")
            before = self._seen.get(pid)
            if now is not None and (before is None or before.start == now.start):
                live[pid] = now
        for pid, before in self._seen.items():
            if pid not in live and not _reaped_in(pid, self._seen, live):
                self._gone += before.ticks
        self._seen = live
        self._total = max(self._total, self._gone + sum(p.ticks for p in live.values()))
        return self._total * NS_PER_TICK


def _reaped_in(pid: int, seen: dict[int, _Seen], live: dict[int, _Seen]) -> bool:
    """Whether a process that left went to an ancestor still in the tree (its parent, or a
    parent that left too, up the line)."""
    steps = 0
    while pid in seen and steps < 64:
        pid, steps = seen[pid].ppid, steps + 1
        if pid in live:
            return True
    return False


def _stat(path: Path) -> _Seen | None:
    """A process's start, parent and CPU ticks from its ``stat`` file; None when it is gone."""
    try:
        data = path.read_bytes()
        rest = data[data.rindex(b")") + 2 :].split()
        # fields 4 (ppid), 14-17 (utime, stime, cutime, cstime), 22 (starttime) of proc(5)
        return _Seen(int(rest[19]), int(rest[1]), sum(int(v) for v in rest[11:15]))
    except (OSError, ValueError, IndexError):
        return None
