"""A pod's own events file, read by the pod watcher: where it is, how it is read safely
(the pod chooses what its name is), and what has been read of it so far."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from wattline.agent.holders.event_lines import complete_lines

#: Where a pod's own events file is, under the sysfs root: an emptyDir volume named
#: ``wattline`` (docs/operations/kubernetes.md); only the pod can write there.
EVENTS_FILE = "var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/wattline/events"


@dataclass
class EventsFile:
    """What has been read of one pod's events file."""

    offset: int = 0
    number: int = 0  #: lines given a place so far (the watcher numbers them)
    partial: bytes = b""

    def new_lines(self, root: Path, uid: str) -> list[str]:
        """The complete lines written since the previous call."""
        chunk = read_pod_file(root / EVENTS_FILE.format(uid=uid), self.offset)
        if not chunk:
            return []
        self.offset += len(chunk)
        lines, self.partial = complete_lines(self.partial, chunk)
        return lines


def read_pod_file(path: Path, offset: int, size: int = 1 << 20) -> bytes:
    """Up to ``size`` bytes of a pod's file from ``offset``; b"" unless it is a regular file.

    The pod writes the file and chooses what its name is: a symlink would make the agent
    read a file of its own choosing (another pod's), a FIFO would block the watcher. So the
    name is not followed, the open never waits, and only a regular file is read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.pread(fd, size, offset) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return b""
    finally:
        os.close(fd)
