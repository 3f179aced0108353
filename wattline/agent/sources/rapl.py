"""RAPL energy counters through the Linux powercap sysfs interface.

Layout (``Documentation/power/powercap/powercap.rst``): the zones live under
``/sys/devices/virtual/powercap/<control type>/`` and ``/sys/class/powercap/`` holds one flat
symlink per zone: ``intel-rapl:0`` (name ``package-0``), its subzones ``intel-rapl:0:0``
(``core``), ``intel-rapl:0:1`` (``uncore``), ``intel-rapl:0:2`` (``dram``), and top-level
``intel-rapl:1`` (``psys``) or ``package-0-die-1`` zones. Zone ids are hexadecimal
(``intel-rapl:a`` is the 11th zone), so zones are told apart by directory and ``name``, never by a
parsed index. The ``intel-rapl-mmio`` control type mirrors package-0 through MMIO and is skipped
when the MSR zone of the same name exists. AMD Zen (families 17h-1Ah) uses the same driver with
only ``package`` and ``core`` zones and no power limits.

The source returns raw ``energy_uj`` values; wrap (at ``max_energy_range_uj``) and reset
handling belong to :mod:`wattline.agent.counter`. ``energy_uj`` is root-only (0400) since Linux
5.10 (CVE-2020-8694, PLATYPUS).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from wattline.agent.sources.base import Channel, Note, Reading, Source, SourceUnavailable
from wattline.agent.sources.sysfs import CounterFile, read_attr
from wattline.config import option
from wattline.quality import Quality

POWERCAP = "/sys/class/powercap"
_ZONE_RE = re.compile(r"^(intel-rapl|intel-rapl-mmio)((?::[0-9a-f]+)+)$")
_PACKAGE_RE = re.compile(r"^package-\d+(?:-die-\d+)?$")
_COMPONENTS = {"core": "cpu_core", "uncore": "cpu_uncore", "dram": "dram", "psys": "psys"}
_GRANT = (
    "grant read access: groupadd -r powercap; chgrp powercap /sys/class/powercap/intel-rapl:*/energy_uj; "
    "chmod g+r /sys/class/powercap/intel-rapl:*/energy_uj; add the agent's user to group powercap"
)


@dataclass
class Options:
    """RAPL source settings (``[sources.rapl]``)."""

    default_max_power_w: float = option(
        1000.0,
        "plausibility bound in W for zones whose sysfs gives no constraint max power "
        "(core, uncore, dram, psys, AMD); generous on purpose",
    )
    max_power_factor: float = option(
        4.0,
        "multiplier on a zone's largest constraint_*_max_power_uw (W) for the plausibility bound: "
        "that value is the TDP and turbo (PL2) runs above it, up to ~2.9x on mobile parts",
    )


@dataclass(frozen=True, slots=True)
class _Zone:
    """A powercap zone directory as found in /sys/class/powercap."""

    zone: str  #: directory name, "intel-rapl:0:1"
    control: str  #: "intel-rapl" or "intel-rapl-mmio"
    parent: str | None  #: parent zone directory name for subzones
    sort_key: tuple[int, ...]


class RaplSource(Source):
    """CPU package, core, uncore, DRAM and platform (psys) energy from RAPL counters."""

    name = "rapl"

    def __init__(self, root: Path = Path("/"), options: Options | None = None) -> None:
        super().__init__(root)
        self.options = options or Options()
        self._channels: list[Channel] = []
        self._files: list[CounterFile] = []

    def discover(self) -> list[Channel]:
        self.close()
        self.notes = []
        zones = self._zones()
        names = {z.zone: n for z in zones if (n := self._attr(z.zone, "name"))}
        msr_devices = {self._device(z, names) for z in zones if z.control == "intel-rapl" and z.zone in names}
        for zone in zones:
            if zone.zone not in names:
                self._note("warning", f"{zone.zone}: no name attribute; zone skipped")
            elif zone.control != "intel-rapl" and self._device(zone, names) in msr_devices:
                self._note("info", f"{zone.zone} ({names[zone.zone]}) mirrors the MSR zone; skipped, not counted twice")
            else:
                self._add(zone, names)
        if not self._channels:
            raise SourceUnavailable(self._why_none(zones))
        return list(self._channels)

    def read(self) -> list[Reading]:
        readings = []
        for channel, file in zip(self._channels, self._files, strict=True):
            value = file.read()
            if isinstance(value, int):
                readings.append(Reading(channel, energy_raw=value))
            else:
                readings.append(Reading(channel, error=value))
        return readings

    def close(self) -> None:
        for file in self._files:
            file.close()
        self._files = []
        self._channels = []

    # -- discovery -----------------------------------------------------------------

    def _zones(self) -> list[_Zone]:
        base = self.path(POWERCAP)
        try:
            entries = os.listdir(base)
        except OSError:
            return []
        zones = []
        for entry in entries:
            match = _ZONE_RE.match(entry)
            if match:
                ids = match.group(2).split(":")[1:]
                parent = entry.rsplit(":", 1)[0] if len(ids) > 1 else None
                zones.append(_Zone(entry, match.group(1), parent, tuple(int(i, 16) for i in ids)))
        return sorted(zones, key=lambda z: (z.control != "intel-rapl", z.control, z.sort_key))

    def _add(self, zone: _Zone, names: dict[str, str]) -> None:
        name = names[zone.zone]
        component = "cpu_package" if _PACKAGE_RE.match(name) else _COMPONENTS.get(name)
        device = self._device(zone, names)
        if component is None:
            self._note("warning", f"{zone.zone}: unknown RAPL domain {name!r}; zone skipped")
            return
        path = str(self.path(f"{POWERCAP}/{zone.zone}/energy_uj"))
        try:
            file = CounterFile.open(path)
        except PermissionError:
            self.close()
            raise SourceUnavailable(
                f"cannot read {path} (permission denied: root-only since Linux 5.10); {_GRANT}"
            ) from None
        except OSError as exc:
            self._note("warning", f"{zone.zone} ({device}): cannot open energy_uj: {exc.strerror}; zone skipped")
            return
        if self._attr(zone.zone, "enabled") == "0":
            self._note("info", f"{zone.zone} ({device}): enabled=0 (no power limiting); its counter is still read")
        self._files.append(file)
        self._channels.append(self._channel(zone, name, component, device))

    def _channel(self, zone: _Zone, name: str, component: str, device: str) -> Channel:
        max_range = self._attr(zone.zone, "max_energy_range_uj")
        if not max_range.isdigit():
            self._note("warning", f"{zone.zone} ({device}): no max_energy_range_uj; a wrap will count as a reset")
        return Channel(
            source=self.name,
            component=component,
            device=device,
            quality=Quality.COUNTER,
            counter_scale_j=1e-6,
            counter_max=int(max_range) if max_range.isdigit() else None,
            max_power_w=self._max_power_w(zone.zone),
            info=(("zone", zone.zone), ("name", name)),
        )

    def _max_power_w(self, zone: str) -> float:
        directory = self.path(f"{POWERCAP}/{zone}")
        values = [self._attr(zone, p.name) for p in directory.glob("constraint_*_max_power_uw")]
        largest = max((int(v) for v in values if v.isdigit()), default=0)
        if largest == 0:
            return self.options.default_max_power_w
        return largest * 1e-6 * self.options.max_power_factor

    def _device(self, zone: _Zone, names: dict[str, str]) -> str:
        """``package-0`` for a top-level zone, ``package-0/core`` for a subzone."""
        name = names.get(zone.zone, zone.zone)
        if zone.parent is None:
            return name
        return f"{names.get(zone.parent, zone.parent)}/{name}"

    def _attr(self, zone: str, attr: str) -> str:
        """A zone attribute, stripped; "" when missing or unreadable."""
        return read_attr(self.path(f"{POWERCAP}/{zone}/{attr}"))

    def _note(self, level: str, text: str) -> None:
        self.notes.append(Note(level, text))

    def _why_none(self, zones: list[_Zone]) -> str:
        if not zones:
            return "no RAPL zones under /sys/class/powercap (virtual machine, container, or CPU without RAPL)"
        problems = "; ".join(n.text for n in self.notes if n.level == "warning")
        return f"no readable RAPL zones under /sys/class/powercap ({problems or 'none usable'})"
