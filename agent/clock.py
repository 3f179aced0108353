"""Timestamps for samples: wall-clock based, monotonic-stepped, never backwards.

Interval *lengths* always come from the monotonic clock. Interval *stamps* are wall
clock (ns since the epoch) advanced by monotonic time from an anchor, so consecutive
samples tile the timeline exactly. When the wall clock steps (NTP, manual change):

- forward by more than ``step_ns``: re-anchor to the wall clock (the timeline shows a
  gap; no energy is lost, since energy comes from counter differences);
- backward: keep stamping ahead of the wall clock (stamps never go backwards, so no
  point in storage is overwritten) and report the offset; stamps rejoin the wall clock
  at the next agent start.

:attr:`StampClock.offset_ns` (wall - stamp) is exported as a metric either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class StampClock:
    """Pairs of (monotonic ns, stamp ns) for the sampler, one pair per tick."""

    def __init__(
        self,
        step_ns: int = 1_000_000_000,
        wall: Callable[[], int] = time.time_ns,
        mono: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._wall = wall
        self._mono = mono
        self.step_ns = step_ns
        self._anchor_mono = mono()
        self._anchor_wall = wall()
        self._last_stamp = self._anchor_wall
        self.offset_ns = 0
        self.steps = 0

    def now(self) -> tuple[int, int]:
        """Return (monotonic ns, stamp ns); stamps never decrease."""
        mono = self._mono()
        wall = self._wall()
        stamp = self._anchor_wall + (mono - self._anchor_mono)
        offset = wall - stamp
        if offset > self.step_ns:
            log.warning("wall clock stepped forward by %.3f s; re-anchoring sample timestamps", offset / 1e9)
            self._anchor_mono, self._anchor_wall = mono, wall
            stamp, offset = wall, 0
            self.steps += 1
        elif offset < -self.step_ns and self.offset_ns >= -self.step_ns:
            log.warning("wall clock stepped backward by %.3f s; timestamps keep running ahead of it", -offset / 1e9)
            self.steps += 1
        self.offset_ns = offset
        stamp = max(stamp, self._last_stamp)
        self._last_stamp = stamp
        return mono, stamp
