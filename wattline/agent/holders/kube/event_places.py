"""Where each event of a pod job sits in its (job, host) event_seq block.

Every event's place is fixed by its identity (open, heartbeat period, use period and
device, events-file line, service look, close), so a restarted agent sends the same events
again under the same numbers and the stores keep one copy.
"""

from __future__ import annotations

import hashlib
import zlib

from wattline.agent.usage.cgroup_cpu import CPU_DEVICE

#: Places in a (job, host) event_seq block (CPU periods: ``cpu_use.CPU_AT`` up to 2**31 + 2**28).
OPEN_AT, BEATS_AT, LINES_AT, USE_AT, CLOSE_AT = 1, 1 << 28, 1 << 29, 1 << 30, (1 << 32) - 2
#: A service's UNITS events: two places per look (a restarted agent's first look, its pods'
#: baselines, takes the odd one: never the place of the last look before the restart).
SCRAPES_AT = (1 << 31) + (1 << 29)
_LOOKS = 1 << 28
#: Device slots per use period (slot 0: ``cpu:host``) and periods before the numbers wrap.
_SLOTS, _PERIODS = 64, 1 << 24


def seq_base(job_id: str, host_id: str) -> int:
    """The (job, host) block's base: ``(1..2**31-1) << 32``, fixed by its identity."""
    digest = int.from_bytes(hashlib.sha256(f"k8s\0{job_id}\0{host_id}".encode()).digest()[:8], "big")
    return (digest % (2**31 - 1) + 1) << 32


def beat_place(period: int) -> int:
    """The heartbeat of heartbeat period number ``period``."""
    return BEATS_AT + period % (1 << 28)


def line_place(uid: str, number: int) -> int:
    """Line ``number`` of pod ``uid``'s events file (each pod of a job its own run of places)."""
    pod_slot = (zlib.crc32(uid.encode()) % 16) << 24
    return LINES_AT + pod_slot + number % (1 << 24)


def scrape_place(look: int, first: bool) -> int:
    """A service's UNITS event of look number ``look``; ``first``: a restarted agent's first
    look (its pods' baselines) takes the odd place."""
    return SCRAPES_AT + 2 * (look % _LOOKS) + int(first)


def use_place(look: int, device: str, scope: set[str] | frozenset[str]) -> int:
    """A USE event of ``device``, numbered by the look that sends it (looks are a
    poll_interval apart), not by its end: a closing job's last period ends between two looks.
    ``scope``: the devices whose use is tallied, which give each its slot."""
    return USE_AT + (look % _PERIODS) * _SLOTS + _slot(device, scope)


def _slot(device: str, scope: set[str] | frozenset[str]) -> int:
    if device == CPU_DEVICE:
        return 0
    known = sorted(scope | {device})
    index = 1 + known.index(device)
    return index if index < _SLOTS else 1 + zlib.crc32(device.encode()) % (_SLOTS - 1)
