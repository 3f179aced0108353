"""Timestamps for samples: wall-clock based, monotonic-stepped, never backwards.

Interval *lengths* (hence power) always come from the monotonic clock and energies from
counter differences, so no clock event changes a joule. Interval *stamps* are the wall
clock (ns since the epoch) advanced by monotonic time, so consecutive samples tile the
timeline exactly. When the wall clock steps (NTP, a manual change, a resumed VM):

- **forward** by more than ``step_ns``: re-anchor to the wall clock. The one sample
  across the step is stretched over it (its energy is still the counter's);
- **backward**: stamps never go backwards (a point of the same series is never
  overwritten, tiling is kept). They run ahead of the wall clock and **slew** back to it,
  advancing at ``1 - slew`` of the monotonic rate (1 % by default, about what NTP
  itself slews) until they meet it: a 10 s step is absorbed in 1000 s. A restart
  before that starts a new stream at the wall clock, which may overlap the rest of the
  lead (its points carry their stream id).

Skew against the collector is not corrected here: samples keep the agent's stamps (hosts
are expected to run NTP). The collector measures it (``wattline_collector_agent_clock_skew_seconds``,
from ``Batch.sent_ns``) and names hosts beyond 5 s in its log; the agent exports
:attr:`StampClock.offset_ns` (wall - stamp) as ``wattline_agent_clock_offset_seconds``.
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
        slew: float = 0.01,
    ) -> None:
        if not 0 <= slew < 1:
            raise ValueError(f"slew {slew} is not in [0, 1)")
        self._wall = wall
        self._mono = mono
        self.step_ns = step_ns
        self.slew = slew
        self._last_mono = mono()
        self._last_stamp = wall()
        self.offset_ns = 0
        self.steps = 0

    def now(self) -> tuple[int, int]:
        """Return (monotonic ns, stamp ns); stamps never decrease."""
        mono = self._mono()
        wall = self._wall()
        elapsed = max(0, mono - self._last_mono)
        stamp = self._last_stamp + elapsed
        offset = wall - stamp
        if offset > self.step_ns:
            log.warning("wall clock stepped forward by %.3f s; re-anchoring sample timestamps", offset / 1e9)
            stamp, offset = wall, 0
            self.steps += 1
        elif offset < 0:
            if offset < -self.step_ns and self.offset_ns >= -self.step_ns:
                log.warning(
                    "wall clock stepped backward by %.3f s; timestamps slew back to it at %g %% (%.0f s)",
                    -offset / 1e9,
                    self.slew * 100,
                    -offset / 1e9 / self.slew if self.slew else float("inf"),
                )
                self.steps += 1
            catch_up = min(int(elapsed * self.slew), -offset)
            stamp -= catch_up
            offset += catch_up
        self.offset_ns = offset
        self._last_mono = mono
        self._last_stamp = stamp
        return mono, stamp
