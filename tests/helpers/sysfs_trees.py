"""Builders of temporary sysfs trees laid out exactly as the kernel lays them out.

sysfs attributes hold one value and a newline. Class directories (``/sys/class/powercap``,
``/sys/class/net``, ``/sys/class/infiniband``) hold relative symlinks into ``/sys/devices``, where
the real directories nest (a powercap subzone lives inside its parent zone). Values are rewritten
in place (same inode), as the kernel regenerates them, so descriptors a source keeps open see
each new value.
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).parents[1] / "fixtures"
#: max_energy_range_uj for ESU 14 (Intel default) and ESU 16 (AMD Zen); see fixtures/rapl/SOURCE.md.
INTEL_RANGE_UJ = 262143328850
AMD_RANGE_UJ = 65532610987


def write_attr(path: Path, value: object) -> None:
    """Write one sysfs attribute in place: ``value`` and a newline; "" leaves the file empty."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = str(value)
    path.write_text(text + "\n" if text else "")


def symlink(link: Path, target: Path) -> None:
    """Create ``link`` pointing at ``target`` by a relative path, as sysfs does."""
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def copy_fixture(name: str, root: Path) -> Path:
    """Copy ``tests/fixtures/<name>`` (a tree starting at ``sys/``) into ``root``; returns root."""
    shutil.copytree(FIXTURES / name, root, dirs_exist_ok=True)
    return root


# -- powercap (RAPL) -----------------------------------------------------------------


@dataclass
class Constraint:
    """One ``constraint_N_*`` group; ``max_power_uw`` None writes an empty file (as core zones have)."""

    name: str = "long_term"
    power_limit_uw: int = 0
    time_window_us: int = 976
    max_power_uw: int | None = 0


@dataclass
class Zone:
    """One powercap zone: ``zone`` is its directory name, "intel-rapl:0:1" or "intel-rapl-mmio:0"."""

    zone: str
    name: str
    energy_uj: int | str = 0
    max_energy_range_uj: int = INTEL_RANGE_UJ
    enabled: int = 1
    constraints: list[Constraint] = field(default_factory=list)


def zone_dir(root: Path, zone: str) -> Path:
    """The real (nested) directory of ``zone`` under /sys/devices/virtual/powercap."""
    control, *ids = zone.split(":")
    chain = [f"{control}:{':'.join(ids[: i + 1])}" for i in range(len(ids))]
    return root / "sys/devices/virtual/powercap" / control / Path(*chain)


def powercap_tree(root: Path, zones: Iterable[Zone]) -> Path:
    """Build /sys/devices/virtual/powercap/... and the /sys/class/powercap symlinks; returns root."""
    devices = root / "sys/devices/virtual/powercap"
    klass = root / "sys/class/powercap"
    for zone in zones:
        control = zone.zone.split(":")[0]
        if not (devices / control).exists():
            write_attr(devices / control / "enabled", 1)
            write_attr(devices / control / "uevent", "")
            symlink(klass / control, devices / control)
        real = zone_dir(root, zone.zone)
        _zone_attrs(real, zone)
        symlink(real / "subsystem", klass)
        symlink(klass / zone.zone, real)
    return root


def _zone_attrs(real: Path, zone: Zone) -> None:
    write_attr(real / "name", zone.name)
    write_attr(real / "energy_uj", zone.energy_uj)
    write_attr(real / "max_energy_range_uj", zone.max_energy_range_uj)
    write_attr(real / "enabled", zone.enabled)
    write_attr(real / "uevent", "")
    for i, c in enumerate(zone.constraints):
        write_attr(real / f"constraint_{i}_name", c.name)
        write_attr(real / f"constraint_{i}_power_limit_uw", c.power_limit_uw)
        write_attr(real / f"constraint_{i}_time_window_us", c.time_window_us)
        write_attr(real / f"constraint_{i}_max_power_uw", "" if c.max_power_uw is None else c.max_power_uw)


def set_energy(root: Path, zone: str, value: int | str) -> None:
    """Rewrite a zone's energy_uj in place (through the /sys/class/powercap symlink)."""
    write_attr(root / "sys/class/powercap" / zone / "energy_uj", value)


class PowerAdvancer:
    """Advances zones' energy_uj at a known power in wall time, in place, from a thread.

    A zone reads ``start_uj + watts x seconds since it was added`` (``power_w`` are added at
    construction, all at the same instant), wrapped at its ``max_energy_range_uj`` as the
    kernel wraps it; one pwrite per zone every ``period_s``, padded to the longest value
    written so far rather than truncated, so a read never finds the file empty.

    ``schedule``: a file other processes (a workload) append ``ZONE WATTS UNIX_NS`` lines to
    (:func:`step_power`): from that wall-clock instant on, ZONE draws WATTS. Such a zone reads
    ``start_uj`` plus the integral of its steps up to now, so its energy depends only on the
    times the workload wrote, not on when this thread saw them.
    """

    def __init__(
        self,
        root: Path,
        power_w: Mapping[str, float] | None = None,
        start_uj: int = 0,
        period_s: float = 0.01,
        schedule: Path | None = None,
    ) -> None:
        self.root, self.start_uj, self.period_s = root, start_uj, period_s
        now = time.monotonic()
        self.zones: dict[str, tuple[float, float]] = {z: (w, now) for z, w in (power_w or {}).items()}
        self.schedule, self._read = schedule, 0
        wall = time.time_ns()
        #: zone -> [(wall ns, watts)]: the zones a schedule line named, from construction on
        self.steps: dict[str, list[tuple[int, float]]] = {}
        self._initial = {z: (wall, w) for z, w in (power_w or {}).items()}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._gap_s = period_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def add(self, zone: str, watts: float) -> None:
        """Start advancing ``zone`` (an existing one) at ``watts`` from ``start_uj`` now."""
        with self._lock:
            self.zones[zone] = (watts, time.monotonic())

    def remove(self, zone: str) -> None:
        """Stop writing ``zone`` (before its directory goes)."""
        with self._lock:
            del self.zones[zone]

    def _follow_schedule(self) -> None:
        """Take the schedule lines appended since the last look (whole lines only)."""
        if self.schedule is None or not self.schedule.exists():
            return
        text = self.schedule.read_bytes()[self._read :]
        done = text.rfind(b"\n") + 1
        self._read += done
        for line in text[:done].decode().splitlines():
            zone, watts, at_ns = line.split()
            steps = self.steps.setdefault(zone, [self._initial.get(zone, (int(at_ns), 0.0))])
            steps.append((int(at_ns), float(watts)))

    def _scheduled_uj(self, zone: str, now_ns: int) -> int:
        """``start_uj`` plus the integral of ``zone``'s steps up to ``now_ns``."""
        steps = [*self.steps[zone], (now_ns, 0.0)]
        joules = sum(w * max(0, min(b, now_ns) - a) / 1e9 for (a, w), (b, _) in itertools.pairwise(steps))
        return self.start_uj + int(joules * 1e6)

    @property
    def lag_s(self) -> float:
        """The most a counter read may lag the power set so far: the longest time between two
        passes of this thread (``period_s`` unless a busy machine stalled it)."""
        return self._gap_s

    def _run(self) -> None:
        ranges: dict[str, int] = {}
        widths: dict[str, int] = {}
        last = time.monotonic()
        while not self._stop.wait(self.period_s):
            now = time.monotonic()
            self._gap_s, last = max(self._gap_s, now - last), now
            with self._lock:
                self._follow_schedule()
                for zone, (watts, start) in self.zones.items():
                    klass = self.root / "sys/class/powercap" / zone
                    if zone not in ranges:
                        ranges[zone] = int((klass / "max_energy_range_uj").read_text())
                    if zone in self.steps:
                        value = self._scheduled_uj(zone, time.time_ns())
                    else:
                        value = self.start_uj + int(watts * (time.monotonic() - start) * 1e6)
                    value %= ranges[zone]
                    # A wrapped value is shorter: pad with spaces (sysfs readers strip them).
                    text = f"{value}\n".ljust(widths.get(zone, 0))
                    widths[zone] = len(text)
                    fd = os.open(klass / "energy_uj", os.O_WRONLY)
                    try:
                        os.pwrite(fd, text.encode(), 0)
                    finally:
                        os.close(fd)

    def close(self) -> None:
        """Stop the thread (the counters keep their last values)."""
        self._stop.set()
        self._thread.join(5)


def step_power(schedule: Path, zone: str, watts: float) -> int:
    """Append ``zone WATTS now`` to a :class:`PowerAdvancer`'s schedule; the wall-clock ns of the step."""
    at_ns = time.time_ns()
    fd = os.open(schedule, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{zone} {watts!r} {at_ns}\n".encode())
    finally:
        os.close(fd)
    return at_ns


# -- network interfaces --------------------------------------------------------------

STATISTICS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped")


@dataclass
class Iface:
    """One network interface; ``pci`` None makes it virtual (/sys/devices/virtual/net, no device link)."""

    name: str
    pci: str | None = "0000:00:05.0"
    operstate: str = "up"
    type: int = 1  #: ARPHRD_ETHER; 772 is ARPHRD_LOOPBACK
    stats: dict[str, int] = field(default_factory=dict)


def net_tree(root: Path, ifaces: Iterable[Iface]) -> Path:
    """Build /sys/devices/.../net/<iface> and the /sys/class/net symlinks; returns root."""
    for iface in ifaces:
        if iface.pci is None:
            real = root / "sys/devices/virtual/net" / iface.name
        else:
            device = root / "sys/devices/pci0000:00" / iface.pci
            write_attr(device / "vendor", "0x1d0f")
            real = device / "net" / iface.name
            symlink(real / "device", device)
        write_attr(real / "operstate", iface.operstate)
        write_attr(real / "type", iface.type)
        write_attr(real / "mtu", 1500 if iface.type == 1 else 65536)
        for stat in STATISTICS:
            write_attr(real / "statistics" / stat, iface.stats.get(stat, 0))
        symlink(root / "sys/class/net" / iface.name, real)
    return root


def set_stat(root: Path, iface: str, stat: str, value: int | str) -> None:
    """Rewrite one statistics attribute in place."""
    write_attr(root / "sys/class/net" / iface / "statistics" / stat, value)


def efa_tree(root: Path, dev: str, counters: dict[str, int], port: int = 1, pci: str = "0000:90:1b.0") -> Path:
    """Build an rdma device with one port's hw_counters and its /sys/class/infiniband symlink."""
    real = root / "sys/devices/pci0000:90" / pci / "infiniband" / dev
    for name, value in counters.items():
        write_attr(real / "ports" / str(port) / "hw_counters" / name, value)
    symlink(root / "sys/class/infiniband" / dev, real)
    return root
