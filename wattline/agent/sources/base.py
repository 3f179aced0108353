"""The one small interface every energy source implements.

A source turns one kind of hardware interface (powercap sysfs, NVML, neuron-monitor,
NIC statistics) into :class:`Reading` objects: raw values, cheap to obtain, with no
arithmetic beyond parsing and unit scaling. Turning raw counters into monotonic joules
(wrap, reset, plausibility) happens in exactly one place, :mod:`wattline.agent.counter`.

Life cycle, driven by the sampler::

    src = RaplSource(root, RaplOptions())
    channels = src.discover()   # raises SourceUnavailable("one line why") when absent
    while running:
        readings = src.read()   # one Reading per channel; never raises for one bad channel
    src.close()

Every filesystem path a source touches is rooted at ``root`` (``--sysfs-root``), so a
recorded tree stands in for the real ``/``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wattline.quality import Quality


class SourceUnavailable(Exception):
    """The source is absent on this host; ``str()`` is a one-line reason for users.

    Example: ``SourceUnavailable("no /sys/class/powercap/intel-rapl:* zones (VM or
    non-Intel/AMD CPU)")``.
    """


@dataclass(frozen=True, slots=True)
class Channel:
    """One energy series of a source: a component of a device, with a fixed quality.

    The counter fields describe ``Reading.energy_raw``; they are ignored for readings
    that carry ``power_w`` or ``energy_j`` instead.
    """

    source: str  #: "rapl", "nvml", "neuron", "nic", "cpu_model"
    component: str  #: "cpu_package", "cpu_core", "cpu_uncore", "dram", "psys", "gpu", ...
    device: str  #: "package-0", GPU UUID, "neuron0", "eth0"
    quality: Quality
    #: Joules per raw counter unit (RAPL energy_uj: 1e-6; NVML mJ: 1e-3).
    counter_scale_j: float = 1.0
    #: Raw value at which the counter wraps back to 0 (RAPL max_energy_range_uj);
    #: None for counters that never wrap in practice (64-bit mJ).
    counter_max: int | None = None
    #: Plausibility bound: a reading implying more than this mean power is absurd and
    #: dropped (channel marked unhealthy), and a backwards step that would need more
    #: than this to be a wrap is a reset. None: no bound known.
    max_power_w: float | None = None
    #: Longest the counter holds still between two steps (RAPL about 1 ms; NVML's energy counter
    #: about 100 ms): an interval shorter than that may see a whole step, so the plausibility
    #: bound allows ``max_power_w`` over the interval plus one step.
    counter_step_s: float = 1e-3
    #: Static descriptive labels (zone path, GPU name, UUID); become Prometheus info
    #: and ``wattline sources`` output, never storage tags.
    info: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class Reading:
    """One read of one channel. Exactly one of the energy fields is normally set.

    - ``energy_raw``: a raw hardware energy counter value (COUNTER channels).
    - ``power_w``: instantaneous or short-average power, integrated by the counter
      module over successive reads (INTEGRATED, or MODEL when the model gives power).
    - ``energy_j``: energy already known for the interval since this channel's previous
      read (MODEL sources that compute per interval, e.g. J/byte on byte deltas).

    ``error`` set means the channel failed this time (unhealthy; no energy counted);
    the message is short and user-facing, e.g. "GPU is lost".
    """

    channel: Channel
    energy_raw: int | None = None
    power_w: float | None = None
    energy_j: float | None = None
    #: (low, high) bounds of power_w when the source knows them (per-minute min/max).
    power_bounds_w: tuple[float, float] | None = None
    #: 0..1 over the source's own averaging period, where known.
    utilization: float | None = None
    #: Extra gauges; the unit is the name's suffix (memory_used_bytes, power_limit_w).
    gauges: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    #: With ``energy_j``: what the interval's figure lacks, e.g. "counter reset" (healthy, said).
    status: str = ""


@dataclass(frozen=True, slots=True)
class Note:
    """Something ``wattline sources`` should tell the user about a source."""

    level: str  #: "info" | "warning"
    text: str  #: one line


class Source(abc.ABC):
    """An energy source. Subclasses set :attr:`name` and implement the three methods."""

    #: Short source name, the Sample's ``source`` field.
    name: str = ""

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root
        #: Notes gathered during discover()/read() for ``wattline sources`` and logs.
        self.notes: list[Note] = []

    def path(self, absolute: str) -> Path:
        """Map an absolute host path ("/sys/class/...") under :attr:`root`."""
        return self.root / absolute.lstrip("/")

    @abc.abstractmethod
    def discover(self) -> list[Channel]:
        """Find the channels; raise :class:`SourceUnavailable` if there are none."""

    @abc.abstractmethod
    def read(self) -> list[Reading]:
        """Read every channel once. One failing channel yields a Reading with
        ``error`` set; the call itself raises only if the whole source broke."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release descriptors, child processes, libraries."""

    def host_labels(self) -> dict[str, str]:
        """Labels this source found for the whole host (instance type, zone); none by default."""
        return {}

    def details(self) -> dict[str, Any]:
        """What the source knows beyond its readings (device health, a helper process's
        state), JSON-ready, for ``wattline sources --json``; none by default."""
        return {}
