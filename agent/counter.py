"""The ONE place raw readings become monotonic joules.

For each channel, :class:`EnergyCounter` keeps the previous raw value and the monotonic
time of the previous read, and turns each new :class:`Reading` into a :class:`Delta`:
energy over the interval (never negative), mean power, the cumulative energy since the
counter was created, and a status when something was wrong.

Rules, in order, for a raw counter value ``v`` after ``prev``:

1. ``v >= prev``: delta = ``v - prev``.
2. ``v < prev`` and the counter has a wrap range ``max``: a wrap gives
   ``max - prev + v``. If that is plausible (``max_power_w`` x interval x 1.5, or no
   bound known), it is a wrap; otherwise it is a **reset** (driver reload, zone
   re-registered): the interval counts 0 J (the energy since the reset is unknown:
   counting ``v`` could count energy from before our interval), status "counter reset".
3. ``v < prev`` and no wrap range: a reset, as above.
4. A delta implying more than ``max_power_w`` x 1.5 is absurd: 0 J, status
   "implausible ... W", and the baseline moves to ``v``.

Power readings (``power_w``) are integrated with the trapezoid rule between successive
reads; a missing or failed previous reading means the first interval uses the current
power alone (rectangle). Negative, NaN or absurd power values count 0 J with a status.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wattline.agent.sources.base import Channel, Reading

#: Headroom over a channel's max_power_w before a reading is called implausible.
PLAUSIBILITY_FACTOR = 1.5


@dataclass(slots=True)
class Delta:
    """Energy of one channel over one interval, as the sampler ships it.

    Treat it as immutable. (Not ``frozen``: built once per channel per tick, a frozen
    dataclass costs about ten times as much to construct.)
    """

    energy_j: float
    power_w: float
    cumulative_j: float
    interval_s: float
    #: Half-width of the energy error bound in J, when the source gave power bounds.
    energy_error_j: float | None = None
    #: Empty when all is well; otherwise a short reason.
    status: str = ""
    #: False when the reading itself failed (error set) or was implausible.
    healthy: bool = True


class EnergyCounter:
    """Monotonic joules for one channel."""

    __slots__ = ("_prev_power", "_prev_raw", "_prev_t", "channel", "cumulative_j")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.cumulative_j = 0.0
        self._prev_raw: int | None = None
        self._prev_power: float | None = None
        self._prev_t: float | None = None

    def update(self, reading: Reading, t_mono_s: float) -> Delta | None:
        """Fold one reading taken at monotonic time ``t_mono_s`` (seconds).

        Returns None for the very first reading of a counter channel (it only sets the
        baseline); otherwise the interval since the previous call.
        """
        prev_t, self._prev_t = self._prev_t, t_mono_s
        dt = 0.0 if prev_t is None else max(t_mono_s - prev_t, 0.0)
        if reading.error is not None:
            # Drop the baselines: energy during a failure is unknown, never invented.
            self._prev_raw = None
            self._prev_power = None
            return None if prev_t is None else self._emit(0.0, dt, status=reading.error, healthy=False)
        if reading.energy_raw is not None:
            return self._from_counter(reading.energy_raw, dt, prev_t is None)
        if reading.power_w is not None:
            return self._from_power(reading, dt, prev_t is None)
        if reading.energy_j is not None:
            return self._from_energy(reading.energy_j, dt, prev_t is None)
        if prev_t is None:
            return None
        return self._emit(0.0, dt, status="no value", healthy=False)

    # -- the three kinds of reading ------------------------------------------------

    def _from_counter(self, raw: int, dt: float, first: bool) -> Delta | None:
        prev, self._prev_raw = self._prev_raw, raw
        if prev is None or first:
            return None
        ch = self.channel
        if raw >= prev:
            ticks = raw - prev
        elif ch.counter_max is not None and self._plausible((ch.counter_max - prev + raw) * ch.counter_scale_j, dt):
            ticks = ch.counter_max - prev + raw
        else:
            return self._emit(0.0, dt, status="counter reset")
        energy = ticks * ch.counter_scale_j
        bound = ch.max_power_w
        if bound is not None and energy > bound * PLAUSIBILITY_FACTOR * max(dt, 1e-3):  # _plausible, inlined
            return self._emit(0.0, dt, status=f"implausible {energy / dt if dt else math.inf:.0f} W", healthy=False)
        self.cumulative_j += energy
        return Delta(energy, energy / dt if dt > 0 else 0.0, self.cumulative_j, dt)

    def _from_power(self, reading: Reading, dt: float, first: bool) -> Delta | None:
        power = reading.power_w
        assert power is not None
        prev_power, self._prev_power = self._prev_power, None
        if not math.isfinite(power) or power < 0 or not self._plausible(power * dt, dt, power):
            return None if first else self._emit(0.0, dt, status=f"implausible power {power} W", healthy=False)
        self._prev_power = power
        if first:
            return None
        mean = power if prev_power is None else (power + prev_power) / 2.0
        error = None
        if reading.power_bounds_w is not None:
            low, high = reading.power_bounds_w
            error = max(abs(high - mean), abs(mean - low)) * dt
        return self._emit(mean * dt, dt, error=error)

    def _from_energy(self, energy: float, dt: float, first: bool) -> Delta | None:
        if first:
            return None
        if not math.isfinite(energy) or energy < 0 or not self._plausible(energy, dt):
            return self._emit(0.0, dt, status=f"implausible energy {energy} J", healthy=False)
        return self._emit(energy, dt)

    # -- helpers -------------------------------------------------------------------

    def _plausible(self, energy_j: float, dt: float, power_w: float | None = None) -> bool:
        bound = self.channel.max_power_w
        if bound is None:
            return True
        if power_w is not None:
            return power_w <= bound * PLAUSIBILITY_FACTOR
        return energy_j <= bound * PLAUSIBILITY_FACTOR * max(dt, 1e-3)

    def _emit(
        self,
        energy: float,
        dt: float,
        *,
        status: str = "",
        healthy: bool = True,
        error: float | None = None,
    ) -> Delta:
        self.cumulative_j += energy
        power = energy / dt if dt > 0 else 0.0
        return Delta(energy, power, self.cumulative_j, dt, error, status, healthy)
