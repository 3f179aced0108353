"""A Neuron device's power: from the driver's sysfs file (``stats/power/utilization``),
found under either layout, its last two minutes turned into watts and bounds; without
the file, from NeuronCore utilization (the formulas are in :mod:`.neuron_config`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from wattline.agent.sources.base import Reading
from wattline.agent.sources.neuron_config import NeuronOptions, PowerStats, parse_power_line

POWER_REL: Final = "stats/power/utilization"
#: A reading's error where the device type, and so its max and idle power, is not known.
NO_DEVICE_TYPE: Final = "power: device type unknown (set NeuronOptions.device_type)"


def find_power_file(*bases: Path) -> tuple[Path | None, str]:
    """The power file under the first of ``bases`` that has one (the driver 2.31 layout
    searched for too) and the layout found, for a note."""
    for base in bases:
        if (base / POWER_REL).is_file():
            return base / POWER_REL, f"sysfs {POWER_REL}"
        for parent, dirs, files in os.walk(base):
            depth = len(Path(parent).relative_to(base).parts)
            if depth >= 4:
                dirs.clear()
            if Path(parent).name == "power" and "utilization" in files:
                found = Path(parent) / "utilization"
                return found, f"sysfs {found.relative_to(base)} (moved layout)"
    return None, "utilization model (no stats/power/utilization)"


@dataclass
class DevicePower:
    """One device's power file as read so far: the latest minute and the one before it."""

    name: str  #: "neuron0", as errors name it
    prev: PowerStats | None = None
    last: PowerStats | None = None

    def read(
        self, reading: Reading, path: Path, max_w: float | None, idle_w: float | None, now: float, opts: NeuronOptions
    ) -> None:
        """Power and bounds into ``reading``, or its error (unreadable, not VALID, stale, no device type)."""
        name = self.name
        try:
            stats = parse_power_line(path.read_text())
        except (OSError, ValueError) as exc:
            reading.error = f"{name} power: unreadable ({exc})"
            return
        age = now - stats.epoch_s
        if stats.epoch_s > 0:
            reading.gauges["power_age_s"] = age
        if stats.status != "VALID":
            reading.error = f"{name} power: {stats.status}"
            return
        if abs(age) > opts.power_stale_s:
            reading.error = f"{name} power: stale ({age:.0f} s old)"
            return
        reading.gauges.update(
            power_avg_percent=stats.avg_pct, power_min_percent=stats.min_pct, power_max_percent=stats.max_pct
        )
        if max_w is None or idle_w is None:
            reading.error = f"{name} {NO_DEVICE_TYPE}"
            return
        prev, last = self.prev, self.last or stats
        if last.epoch_s != stats.epoch_s:
            prev = last
        self.prev, self.last = prev, stats
        base = idle_w if opts.add_background_power else 0.0
        lo, hi = stats.min_pct, stats.max_pct
        if prev is not None and prev.status == "VALID" and 0 < stats.epoch_s - prev.epoch_s <= 120:
            lo, hi = min(lo, prev.min_pct), max(hi, prev.max_pct)
        reading.power_w = base + stats.avg_pct / 100.0 * max_w
        reading.power_bounds_w = (base + lo / 100.0 * max_w, base + hi / 100.0 * max_w)


def model_power(reading: Reading, name: str, max_w: float | None, idle_w: float | None, why: str | None) -> None:
    """Power into ``reading`` from its NeuronCore utilization, or its error (``why`` no utilization)."""
    if reading.utilization is None:
        reading.error = f"{name} power: no NeuronCore utilization ({why or 'neuron-monitor not running'})"
    elif max_w is None or idle_w is None:
        reading.error = f"{name} {NO_DEVICE_TYPE}"
    else:
        reading.power_w = idle_w + reading.utilization * max(max_w - idle_w, 0.0)
