"""Reading sysfs attributes: the helpers every sysfs-backed source shares.

:class:`CounterFile` keeps one decimal counter attribute open and reads it with one
``pread`` per read; :func:`read_attr` reads a small text attribute once (names, states,
ranges). Both never raise for a missing or unreadable file: a source reports that per
channel, never breaks on it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

#: Bytes read per pread: a 64-bit decimal counter is at most 20 digits and a newline.
_READ_SIZE = 32


def open_ro(path: str) -> int:
    """The one place counter files are opened (a seam for permission tests: tests run as root)."""
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def read_attr(path: Path) -> str:
    """A text attribute, stripped; "" when missing, unreadable or not text."""
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


class CounterFile:
    """One sysfs attribute holding a decimal counter, opened once and read with ``pread``.

    Reading costs one syscall. After a read failure (the device went away) the descriptor is
    closed, and the next :meth:`read` reopens the path, so a re-registered zone or interface
    comes back by itself.
    """

    __slots__ = ("fd", "path")

    def __init__(self, path: str, fd: int | None = None) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, path: str) -> CounterFile:
        """Open ``path`` read-only; OSError (PermissionError included) propagates."""
        return cls(path, open_ro(path))

    def read(self) -> int | str:
        """The counter value, or a one-line error message; never raises."""
        try:
            if self.fd is None:
                self.fd = open_ro(self.path)
            data = os.pread(self.fd, _READ_SIZE, 0)
        except OSError as exc:
            self.close()
            return f"cannot read {self.path}: {exc.strerror or exc}"
        text = data.strip()
        if not text.isdigit():
            return f"bad value in {self.path}: {text[:100].decode(errors='replace')!r}"
        return int(text)

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
