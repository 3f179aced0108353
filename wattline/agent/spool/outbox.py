"""The host's job-event outbox: job events kept on disk until a collector acknowledged them.

``wattline run --collector`` and the Job API with ``collector=`` write every job event to
a crash-safe :class:`~wattline.agent.spool.disk.DiskSpool` of their own *before* sending
it, one directory per process under the outbox root (``agent.outbox_dir``; by default
``$XDG_STATE_HOME/wattline/outbox``, else ``~/.local/state/wattline/outbox``)::

    <root>/p<pid>-<random>/   lock, seg-*.wls, cursor: one process's events (disk_spool's format)

A process holds its directory's ``flock`` while it lives, so concurrent processes never
share a file and nobody takes a live process's events. A process whose events were all
acknowledged removes its directory; otherwise (no collector answered, or it was killed,
``kill -9`` included) the directory stays. Any later wattline process that reaches a
collector (the host agent, every few seconds; a later ``wattline run`` or Job with a
collector) takes the lock of each directory whose owner is gone, replays its events in
order under their own identity (host, stream, job id, ``event_seq``: the stores keep one
copy of a resent event) and removes the directory once they are acknowledged.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from wattline.agent.spool.format import SpoolError

if TYPE_CHECKING:  # imported where a spool is opened: an agent without leftovers (a Slurm
    # task prolog asking only for outbox_root) never loads them
    from wattline import wire
    from wattline.agent.spool.base import Spool
    from wattline.agent.spool.disk import DiskSpool
    from wattline.agent.uplink import Uplink  # gRPC: a Slurm hook writing its events never loads it

log = logging.getLogger(__name__)

#: Bounds of one process's outbox directory: job events are small (a week-long job
#: counting units twice a second is about 50 MB), and a month covers a long outage.
MAX_BYTES = 256 << 20
MAX_AGE_S = 30 * 86400.0
#: Files a DiskSpool keeps in its directory (all that :func:`remove` deletes).
_FILES = ("seg-*.wls", "cursor", "cursor.tmp", "lock")
#: Name of one process's directory (nothing else under the root is touched).
_NAME = re.compile(r"p[0-9]+-[0-9a-f]{12}")


def outbox_root(setting: str, env: Mapping[str, str] | None = None) -> Path:
    """``setting`` if given, else ``$XDG_STATE_HOME/wattline/outbox``, else ``~/.local/state/wattline/outbox``.

    Raises SpoolError when none of them is known (no home directory).
    """
    if setting:
        return Path(setting).expanduser()
    env = os.environ if env is None else env
    state = env.get("XDG_STATE_HOME", "")
    if state and Path(state).is_absolute():
        return Path(state) / "wattline" / "outbox"
    try:
        home = Path(env.get("HOME") or Path.home())
    except (RuntimeError, KeyError):
        raise SpoolError("no home directory for the job-event outbox: set agent.outbox_dir") from None
    return home / ".local" / "state" / "wattline" / "outbox"


def open_outbox(root: Path, host: wire.pb.Host) -> DiskSpool:
    """A fresh spool directory of this process under ``root``; raises SpoolError if none can be made."""
    from wattline.agent.spool.disk import DiskSpool

    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SpoolError(f"outbox {root}: {exc.strerror or exc}") from None
    error = SpoolError(f"outbox {root}: no directory could be created")
    for _attempt in range(3):  # a drainer may have taken (and removed) a brand-new directory: take another
        directory = root / f"p{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            directory.mkdir(mode=0o700)
            return DiskSpool(host, directory, max_bytes=MAX_BYTES, max_age_s=MAX_AGE_S)
        except SpoolError as exc:
            error = exc
        except OSError as exc:
            error = SpoolError(f"outbox {directory}: {exc.strerror or exc}")
    raise error


def remove(directory: Path) -> bool:
    """Delete a drained spool directory, unless another process holds its lock; True when gone."""
    try:
        fd = os.open(directory / "lock", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = -1
    except OSError:
        return False
    try:
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # taken meanwhile by a process that will remove it itself
        for pattern in _FILES:
            for path in directory.glob(pattern):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        directory.rmdir()
        return True
    except OSError as exc:
        log.debug("outbox %s not removed: %s", directory, exc)
        return False
    finally:
        if fd >= 0:
            os.close(fd)


class OutboxDrainer:
    """Delivers what dead processes left in the outbox (one directory at a time, oldest first)."""

    def __init__(
        self,
        root: Path,
        host: wire.pb.Host,
        make_uplink: Callable[[Spool], Uplink],
        own: Path | None = None,
    ) -> None:
        self.root = root
        self.host = host
        self.make_uplink = make_uplink
        self.own = own
        self.delivered_dirs = 0
        self._refused: set[str] = set()
        self._pass: threading.Thread | None = None

    def leftovers(self) -> list[Path]:
        """Other processes' directories, oldest first (live ones included: their lock decides)."""
        try:
            found = [p for p in self.root.iterdir() if _NAME.fullmatch(p.name) and p.is_dir() and p != self.own]
        except OSError:
            return []

        def age(path: Path) -> float:
            try:
                return path.stat().st_mtime
            except OSError:
                return 0.0

        return sorted(found, key=age)

    def drain_once(self, stop: threading.Event) -> int:
        """One pass over the outbox; returns how many directories were delivered and removed."""
        done = 0
        for directory in self.leftovers():
            if stop.is_set():
                break
            delivered = self._drain(directory, stop)
            if delivered is None:
                break  # the collector stopped answering: the rest waits for the next pass
            done += delivered
        self.delivered_dirs += done
        return done

    def _drain(self, directory: Path, stop: threading.Event) -> int | None:
        """1: delivered and removed; 0: live, unreadable or left; None: the collector failed."""
        from wattline.agent.spool.disk import DiskSpool

        try:
            spool = DiskSpool(self.host, directory, max_bytes=MAX_BYTES, max_age_s=MAX_AGE_S)
        except SpoolError as exc:
            if "in use" not in str(exc) and directory.name not in self._refused:
                self._refused.add(directory.name)
                log.warning("outbox: cannot deliver %s: %s", directory, exc)
            return 0
        batches = spool.recovered_batches
        uplink = self.make_uplink(spool)
        failed = False
        try:
            spool.seal()
            while spool.backlog() and not stop.is_set():
                uplink.drain()
        except ConnectionError:
            failed = True
        finally:
            uplink.close()
            left = spool.backlog()
            spool.close()
        if left:
            return None if failed else 0
        if batches:
            log.info("outbox: delivered %d batches of job events left in %s by an earlier process", batches, directory)
        return 1 if remove(directory) else 0

    def start_pass(self, stop: threading.Event) -> bool:
        """Start one pass over the outbox on a thread of its own when something is there and no
        pass runs; True when one started.

        The agent calls it from its uplink's thread every few seconds while a collector answers:
        an empty outbox costs one directory listing there, and no thread waits in between.
        """
        if self._pass is not None and self._pass.is_alive():
            return False
        if not self.leftovers():
            return False
        self._pass = threading.Thread(target=self._one_pass, args=(stop,), name="wattline-outbox", daemon=True)
        self._pass.start()
        return True

    def _one_pass(self, stop: threading.Event) -> None:
        try:
            self.drain_once(stop)
        except Exception:  # a bug here must not end the process's own delivery
            log.exception("outbox: pass over %s failed", self.root)

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a pass that runs."""
        if self._pass is not None:
            self._pass.join(timeout_s)
