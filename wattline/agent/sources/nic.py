"""Network interface energy: a MODEL driven by byte counters.

Energy over an interval = ``idle_w`` x seconds + ``j_per_byte`` x (rx + tx bytes moved). Both
coefficients are assumptions, not measurements (see :class:`Options`); the Readings are
quality MODEL and carry the raw totals as gauges. The byte counters go through
:func:`wattline.agent.counter.counter_ticks`, as every raw counter does: they are 64-bit (no
wrap), so a drop is a reset, and that interval counts idle power only, with status "counter reset".

Interfaces come from ``/sys/class/net/<iface>/statistics/{rx,tx}_{bytes,packets}``
(``Documentation/ABI/testing/sysfs-class-net-statistics``). Skipped unless asked for: loopback
(``lo`` or ``type`` 772, ARPHRD_LOOPBACK), virtual interfaces (no ``device`` link: veth,
bridges, docker0, tun, bonds; their traffic also crosses a physical NIC, so counting it would
count bytes twice), and interfaces whose ``operstate`` is not ``up`` or ``unknown``
(``operstates.rst``: "unknown" means the driver does not report it and "must be considered for
user data"). AWS EFA ports, ``/sys/class/infiniband/<dev>/ports/<n>/hw_counters/{tx,rx}_bytes``,
are devices ``efa:<dev>/<n>``: their RDMA traffic bypasses the kernel and is not in any
interface's statistics.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wattline.agent.counter import COUNTER_RESET, counter_ticks
from wattline.agent.sources.base import Channel, Note, Reading, Source, SourceUnavailable
from wattline.agent.sources.sysfs import CounterFile, read_attr
from wattline.config import option
from wattline.quality import Quality

NET = "/sys/class/net"
INFINIBAND = "/sys/class/infiniband"
ARPHRD_LOOPBACK = "772"
#: operstate values that carry traffic; "unknown" is what drivers without operstate report.
_UP = frozenset({"up", "unknown"})
#: (gauge name, file name) per channel kind; the two byte counters first, packets optional.
_NET_FILES = (
    ("rx_bytes", "rx_bytes"),
    ("tx_bytes", "tx_bytes"),
    ("rx_packets", "rx_packets"),
    ("tx_packets", "tx_packets"),
)
#: The gauges whose sum is the bytes moved.
_MOVED = frozenset({"rx_bytes", "tx_bytes"})
_EFA_FILES = (("rx_bytes", "rx_bytes"), ("tx_bytes", "tx_bytes"), ("rx_packets", "rx_pkts"), ("tx_packets", "tx_pkts"))


@dataclass
class Options:
    """NIC model settings (``[sources.nic]``)."""

    idle_w: float = option(
        1.0,
        "modeled idle power per interface in W; assumption: order of a 1-25 GbE port's idle draw, "
        "the adapter's fixed power is not visible to software",
    )
    j_per_byte: float = option(
        2e-10,
        "modeled energy per byte moved (rx + tx) in J/B; assumption: ~5 W extra for a 100 Gb/s link "
        "saturated both ways (25 GB/s), i.e. 25 pJ/bit",
    )
    max_link_gbps: float = option(
        800.0,
        "fastest link speed in Gb/s, per direction; bounds the modeled power (plausibility check)",
    )
    interfaces: list[str] = option([], "only these interfaces (empty: all); the skip rules still apply")
    include_loopback: bool = option(False, "also model loopback (lo)")
    include_down: bool = option(False, "also model interfaces whose operstate is down/lowerlayerdown/notpresent")
    include_virtual: bool = option(False, "also model virtual interfaces (veth, bridges, tun); counts bytes twice")
    efa: bool = option(True, "also model EFA ports found under /sys/class/infiniband/*/ports/*/hw_counters")


@dataclass(slots=True)
class _Port:
    """One modeled channel: its counter files and the baseline of the previous read."""

    channel: Channel
    #: (gauge name, file, counts toward bytes moved); rx_bytes and tx_bytes first.
    files: list[tuple[str, CounterFile, bool]]
    prev_bytes: int | None = None
    prev_t: float = 0.0


class NicSource(Source):
    """Modeled network energy per interface (and per EFA port)."""

    name = "nic"

    def __init__(
        self,
        root: Path = Path("/"),
        options: Options | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(root)
        self.options = options or Options()
        self._clock = clock
        self._ports: list[_Port] = []

    def discover(self) -> list[Channel]:
        kept = {p.channel.device: (p.prev_bytes, p.prev_t) for p in self._ports}  # a rediscovery: keep baselines
        self.close()
        self.notes = [Note("info", self._model_text())]
        for iface in self._interfaces():
            self._add(iface, f"{NET}/{iface}/statistics", _NET_FILES)
        if self.options.efa:
            for dev, port in self._efa_ports():
                self._add(f"efa:{dev}/{port}", f"{INFINIBAND}/{dev}/ports/{port}/hw_counters", _EFA_FILES)
        for found in self._ports:
            found.prev_bytes, found.prev_t = kept.get(found.channel.device, (None, 0.0))
        if not self._ports:
            raise SourceUnavailable(
                "no network interfaces to model (only loopback, virtual or down ones; "
                "inside a container's own network namespace set include_virtual)"
            )
        return [p.channel for p in self._ports]

    def read(self) -> list[Reading]:
        now = self._clock()
        return [self._read(port, now) for port in self._ports]

    def close(self) -> None:
        for port in self._ports:
            for _, file, _ in port.files:
                file.close()
        self._ports = []

    # -- reading -------------------------------------------------------------------

    def _read(self, port: _Port, now: float) -> Reading:
        gauges: dict[str, float] = {}
        moved = 0  # rx + tx bytes, exact ints: floats lose bytes past 2**53
        for gauge, file, is_bytes in port.files:
            value = file.read()
            if isinstance(value, str):
                port.prev_bytes = None
                return Reading(port.channel, error=value)
            gauges[gauge] = float(value)
            if is_bytes:
                moved += value
        energy, status = 0.0, ""
        if port.prev_bytes is not None:
            opts = self.options
            # 64-bit counters on 64-bit kernels never wrap: a drop is a reset, its bytes unknown.
            ticks = counter_ticks(port.prev_bytes, moved, None)
            if ticks is None:
                ticks, status = 0, f"{COUNTER_RESET}: bytes moved not counted, idle power only"
            energy = opts.idle_w * max(now - port.prev_t, 0.0) + opts.j_per_byte * ticks
        port.prev_bytes, port.prev_t = moved, now
        return Reading(port.channel, energy_j=energy, gauges=gauges, status=status)

    # -- discovery -----------------------------------------------------------------

    def _interfaces(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.path(NET)))
        except OSError:
            return []
        wanted = set(self.options.interfaces)
        for missing in sorted(wanted - set(names)):
            self.notes.append(Note("warning", f"{missing}: listed in interfaces but not in {NET}"))
        return [n for n in names if (not wanted or n in wanted) and self._keep(n)]

    def _keep(self, iface: str) -> bool:
        opts = self.options
        if iface == "lo" or self._attr(f"{NET}/{iface}/type") == ARPHRD_LOOPBACK:
            return self._skip_unless(opts.include_loopback, iface, "loopback")
        if not self.path(f"{NET}/{iface}/device").exists():
            return self._skip_unless(opts.include_virtual, iface, "virtual (no device link)")
        state = self._attr(f"{NET}/{iface}/operstate")
        if state not in _UP:
            return self._skip_unless(opts.include_down, iface, f"operstate {state or 'missing'}")
        return True

    def _skip_unless(self, include: bool, iface: str, why: str) -> bool:
        if not include:
            self.notes.append(Note("info", f"{iface}: {why}; skipped"))
        return include

    def _efa_ports(self) -> list[tuple[str, str]]:
        found = []
        for counters in sorted(self.path(INFINIBAND).glob("*/ports/*/hw_counters")):
            if (counters / "tx_bytes").is_file() and (counters / "rx_bytes").is_file():
                found.append((counters.parent.parent.parent.name, counters.parent.name))
        return found

    def _add(self, device: str, directory: str, names: tuple[tuple[str, str], ...]) -> None:
        files: list[tuple[str, CounterFile, bool]] = []
        for gauge, name in names:
            try:
                files.append((gauge, CounterFile.open(str(self.path(f"{directory}/{name}"))), gauge in _MOVED))
            except OSError as exc:
                if gauge.endswith("_bytes"):
                    self.notes.append(
                        Note("warning", f"{device}: cannot open {directory}/{name}: {exc.strerror}; skipped")
                    )
                    for _, file, _ in files:
                        file.close()
                    return
        self._ports.append(_Port(self._channel(device), files))

    def _channel(self, device: str) -> Channel:
        opts = self.options
        max_bytes_per_s = 2 * opts.max_link_gbps * 1e9 / 8
        return Channel(
            source=self.name,
            component="nic",
            device=device,
            quality=Quality.MODEL,
            max_power_w=opts.idle_w + opts.j_per_byte * max_bytes_per_s,
            info=(("model", self._model_text()),),
        )

    def _model_text(self) -> str:
        opts = self.options
        return f"NIC energy is a model: {opts.idle_w} W idle + {opts.j_per_byte} J/byte moved (assumptions)"

    def _attr(self, path: str) -> str:
        return read_attr(self.path(path))
