"""A process as the kernel tells it apart: pid, start time, boot id, pid namespace (``/proc``).

Apart from :mod:`.holders` so a Slurm hook names its slurmd without loading the wire types.
"""

from __future__ import annotations

import os
from pathlib import Path


def boot_id(proc: Path) -> str:
    try:
        return (proc / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def parse_stat(text: str) -> tuple[str, int, int] | None:
    """(command name, parent pid, start ticks) of a /proc/PID/stat line; the name may hold
    spaces and parentheses, so the fields are counted from its last ``)``."""
    name, _, rest = text.partition("(")[2].rpartition(")")
    fields = rest.split()
    try:
        return name, int(fields[1]), int(fields[19])
    except (ValueError, IndexError):
        return None


def start_ticks(proc: Path, pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot."""
    try:
        parsed = parse_stat((proc / str(pid) / "stat").read_text())
    except OSError:
        return None
    return None if parsed is None else parsed[2]


def pid_ns(proc: Path, pid: int | str) -> int:
    try:
        return os.stat(proc / str(pid) / "ns" / "pid").st_ino
    except OSError:
        return 0
