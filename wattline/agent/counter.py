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
4. A delta implying more than ``max_power_w`` x 1.5 over the interval plus one step of the
   counter (``counter_step_s``: a short interval may see a whole step) is absurd: 0 J,
   status "implausible ... W", and the baseline moves to ``v``.

A failed read (``Reading.error``) of a counter channel keeps the last good value and its
time: the hardware counter kept counting, so the next good read's delta covers the whole
gap and is counted, with status "gap: N s without a reading". Rules 1-4 apply to that
longer interval (the plausibility bound scales with it). A gap longer than the counter's
shortest wrap period (:func:`wrap_period_s`) may hide whole wraps: the status says so.
A gap is held for at most MAX_GAP_S (or the wrap period, when shorter), and not past a
``final`` read (the sampler's last): a failed read then gives it up, one unhealthy 0 J
interval from the last good read with the read's error, and the baseline is dropped.

Power readings (``power_w``) are integrated with the trapezoid rule between successive
reads; a missing or failed previous reading means the first interval uses the current
power alone (rectangle). Negative, NaN or absurd power values count 0 J with a status.
Power (and per-interval energy) channels cannot recover a gap: nothing measured the
power meanwhile, so each failed read's interval counts 0 J, unhealthy, nothing invented.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from wattline.agent.sources.base import Channel, Reading

#: Headroom over a channel's max_power_w before a reading is called implausible.
PLAUSIBILITY_FACTOR = 1.5
#: Longest gap of failed reads held for the next good read to count; beyond, it is given up
#: (said in the store as an unhealthy interval rather than held back indefinitely).
MAX_GAP_S = 60.0
#: Status of an interval whose counter went backwards without a plausible wrap (rules 2, 3).
COUNTER_RESET = "counter reset"


def counter_ticks(
    prev: int, raw: int, wrap_at: int | None, plausible: Callable[[int], bool] | None = None
) -> int | None:
    """Counter units from ``prev`` to ``raw`` (rules 1-3): forward, or backward a wrap at ``wrap_at``
    when ``plausible(ticks)``; None for a reset (what was counted meanwhile is unknown: count none).

    Every raw counter, a measured energy counter or a model's byte counter, goes through here.
    """
    if raw >= prev:
        return raw - prev
    if wrap_at is None:
        return None
    ticks = wrap_at - prev + raw
    return ticks if plausible is None or plausible(ticks) else None


def wrap_period_s(channel: Channel) -> float | None:
    """Shortest time in which ``channel``'s counter can wrap: its range at its plausible
    maximum power (``max_power_w`` x PLAUSIBILITY_FACTOR). None: no wrap range or no bound."""
    if channel.counter_max is None or not channel.max_power_w or channel.max_power_w <= 0:
        return None
    return channel.counter_max * channel.counter_scale_j / (channel.max_power_w * PLAUSIBILITY_FACTOR)


def wraps_within(interval_s: float, channel: Channel) -> bool:
    """True when ``channel``'s counter can wrap within ``interval_s``: it cannot be counted at
    that interval (two wraps in one interval look like one, so a delta could be short by
    whole ranges), so it must not be sampled at all."""
    period = wrap_period_s(channel)
    return period is not None and interval_s >= period


def wrap_text(channel: Channel) -> str:
    """How fast ``channel`` can wrap, for one-line messages: "0.018 s (27 J range at up to 1500 W)"."""
    period = wrap_period_s(channel)
    assert period is not None and channel.counter_max is not None and channel.max_power_w is not None
    return (
        f"{period:.3g} s ({channel.counter_max * channel.counter_scale_j:.6g} J range at up to "
        f"{channel.max_power_w * PLAUSIBILITY_FACTOR:.0f} W)"
    )


@dataclass(slots=True)
class Delta:
    """Energy of one channel over one interval, as the sampler ships it.

    Treat it as immutable. (Not ``frozen``: built once per channel per tick, and a frozen
    dataclass's ``__init__`` goes through ``object.__setattr__`` per field, many times the
    cost of a plain one.)
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

    __slots__ = ("_prev_power", "_prev_raw", "_prev_t", "channel", "cumulative_j", "gap_reads")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.cumulative_j = 0.0
        self._prev_raw: int | None = None
        self._prev_power: float | None = None
        self._prev_t: float | None = None
        #: Failed reads since the last good one while a counter baseline is held (a gap):
        #: the sampler then emits nothing and the next good read's interval spans the gap.
        self.gap_reads = 0

    def update(self, reading: Reading, t_mono_s: float, final: bool = False) -> Delta | None:
        """Fold one reading taken at monotonic time ``t_mono_s`` (seconds).

        Returns None for the very first reading of a counter channel (it only sets the
        baseline) and for a failed read while a counter baseline is held (:attr:`gap_reads`
        counts them); otherwise the interval since the previous call (since the last good
        read, after a gap). ``final``: no read follows, so a gap is not held.
        """
        if reading.error is not None and self._prev_raw is not None:
            if not final and t_mono_s - (self._prev_t or 0.0) < self._max_gap_s():
                self.gap_reads += 1  # keep the baseline and its time: the counter keeps counting
                return None
            self._prev_raw, self.gap_reads = None, 0  # give the gap up: unknown, never invented
        prev_t, self._prev_t = self._prev_t, t_mono_s
        dt = 0.0 if prev_t is None else max(t_mono_s - prev_t, 0.0)
        if reading.error is not None:
            # No counter to recover from: energy during a failure is unknown, never invented.
            self._prev_power = None
            return None if prev_t is None else self._emit(0.0, dt, status=reading.error, healthy=False)
        if reading.energy_raw is not None:
            return self._from_counter(reading.energy_raw, dt, prev_t is None)
        if reading.power_w is not None:
            return self._from_power(reading, dt, prev_t is None)
        if reading.energy_j is not None:
            return self._from_energy(reading.energy_j, dt, prev_t is None, reading.status)
        if prev_t is None:
            return None
        return self._emit(0.0, dt, status="no value", healthy=False)

    def _max_gap_s(self) -> float:
        period = wrap_period_s(self.channel)
        return MAX_GAP_S if period is None else min(MAX_GAP_S, period)

    def forget(self) -> None:
        """Drop the baselines (the channel vanished); :attr:`cumulative_j` goes on from here."""
        self._prev_raw = self._prev_power = self._prev_t = None
        self.gap_reads = 0

    # -- the three kinds of reading ------------------------------------------------

    def _from_counter(self, raw: int, dt: float, first: bool) -> Delta | None:
        prev, self._prev_raw = self._prev_raw, raw
        if prev is None or first:
            return None
        delta = self._count(raw, prev, dt)
        if self.gap_reads:
            self._mark_gap(delta, dt)
        return delta

    def _count(self, raw: int, prev: int, dt: float) -> Delta:
        ch = self.channel
        if raw >= prev:  # the usual case, inlined: counter_ticks rule 1
            ticks: int | None = raw - prev
        else:
            ticks = counter_ticks(prev, raw, ch.counter_max, lambda t: self._plausible(t * ch.counter_scale_j, dt))
        if ticks is None:
            return self._emit(0.0, dt, status=COUNTER_RESET)
        energy = ticks * ch.counter_scale_j
        bound = ch.max_power_w
        if bound is not None and energy > bound * PLAUSIBILITY_FACTOR * (dt + ch.counter_step_s):  # _plausible, inlined
            return self._emit(0.0, dt, status=f"implausible {energy / dt if dt else math.inf:.0f} W", healthy=False)
        self.cumulative_j += energy
        return Delta(energy, energy / dt if dt > 0 else 0.0, self.cumulative_j, dt)

    def _mark_gap(self, delta: Delta, dt: float) -> None:
        """Say that ``delta`` (the first good read after failed ones) spans a gap."""
        self.gap_reads = 0
        gap = f"gap: {dt:.1f} s without a reading"
        period = wrap_period_s(self.channel)
        if period is not None and dt >= period:
            gap += f", longer than the counter's wrap period ({period:.3g} s): whole wraps may be missing"
        delta.status = f"{delta.status}; {gap}" if delta.status else gap

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

    def _from_energy(self, energy: float, dt: float, first: bool, status: str) -> Delta | None:
        if first:
            return None
        if not math.isfinite(energy) or energy < 0 or not self._plausible(energy, dt):
            return self._emit(0.0, dt, status=f"implausible energy {energy} J", healthy=False)
        return self._emit(energy, dt, status=status)

    # -- helpers -------------------------------------------------------------------

    def _plausible(self, energy_j: float, dt: float, power_w: float | None = None) -> bool:
        bound = self.channel.max_power_w
        if bound is None:
            return True
        if power_w is not None:
            return power_w <= bound * PLAUSIBILITY_FACTOR
        return energy_j <= bound * PLAUSIBILITY_FACTOR * (dt + self.channel.counter_step_s)

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
