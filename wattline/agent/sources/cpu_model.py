"""Whole-host CPU power as a MODEL, for hosts without RAPL (VMs, containers).

``power_w = idle_w + (tdp_w - idle_w) x utilization``, utilization (0..1) from deltas of
:func:`psutil.cpu_times` (the live ``/proc/stat``; ``root`` does not apply). The counter module
integrates the power. Time the hypervisor stole counts as not busy: that power is spent on
another guest. In a container, ``/proc/stat`` and :func:`os.cpu_count` are the host's, so the
estimate is the whole host's CPU, not the container's share. The registry stands the source down
when RAPL measures the CPU (:data:`wattline.agent.registry.SOURCES`), so a model is never
reported beside a measurement of the same component.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from wattline.agent.sources.base import Channel, Note, Reading, Source, SourceUnavailable
from wattline.config import option
from wattline.quality import Quality

#: Assumed full-load power per logical CPU (W), when tdp_w is not given: server TDP / threads,
#: e.g. 350 W / 112 threads = 3.1 W (56-core Xeon), 105 W / 16 threads = 6.6 W (8-core desktop).
DEFAULT_W_PER_CPU = 4.0


@dataclass
class Options:
    """CPU model settings (``[sources.cpu_model]``)."""

    tdp_w: float | None = option(
        None, f"modeled power at 100% utilization in W; empty: {DEFAULT_W_PER_CPU} W x logical CPUs (assumption)"
    )
    idle_w: float | None = option(None, "modeled power at 0% utilization in W; empty: idle_w_fraction x tdp_w")
    idle_w_fraction: float = option(
        0.3, "idle power as a fraction of tdp_w (assumption: CPU packages idle at roughly a quarter to a third of TDP)"
    )


def _busy_total(times: Mapping[str, float]) -> tuple[float, float]:
    """(busy, total) seconds from ``cpu_times()._asdict()``, as psutil's cpu_percent counts them.

    guest and guest_nice are already inside user and nice on Linux, so they are left out of the
    total; idle, iowait and steal are not busy. The fields differ per platform.
    """
    total = sum(v for k, v in times.items() if k not in ("guest", "guest_nice"))
    idle = sum(times.get(k, 0.0) for k in ("idle", "iowait", "steal"))
    return total - idle, total


def _cpu_times() -> tuple[float, float]:
    # Imported here, not at the top: psutil adds to the agent's resident memory, and this module is
    # imported even where the source stands down (RAPL measures the CPU: the usual case).
    import psutil

    return _busy_total(psutil.cpu_times()._asdict())


class CpuModelSource(Source):
    """One modeled CPU power channel for the whole host (all packages)."""

    name = "cpu_model"

    def __init__(
        self,
        root: Path = Path("/"),
        options: Options | None = None,
        *,
        utilization: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(root)
        self.options = options or Options()
        self._utilization = utilization or self._psutil_utilization
        self._prev: tuple[float, float] | None = None
        self._last_util = 0.0
        self._channel: Channel | None = None
        self.tdp_w = 0.0
        self.idle_w = 0.0

    def discover(self) -> list[Channel]:
        opts = self.options
        cpus = os.cpu_count() or 1
        self.tdp_w = opts.tdp_w if opts.tdp_w is not None else DEFAULT_W_PER_CPU * cpus
        self.idle_w = opts.idle_w if opts.idle_w is not None else opts.idle_w_fraction * self.tdp_w
        if not 0 <= self.idle_w <= self.tdp_w:
            raise SourceUnavailable(f"cpu_model: idle_w {self.idle_w} W must be between 0 and tdp_w {self.tdp_w} W")
        try:
            self._prev = _cpu_times()
        except OSError as exc:
            raise SourceUnavailable(f"cannot read CPU times: {exc}") from None
        model = f"{self.idle_w:g} W + ({self.tdp_w:g} - {self.idle_w:g}) W x utilization"
        self.notes = [Note("warning", f"CPU power is a model, not a measurement: {model}")]
        self._channel = Channel(
            source=self.name,
            component="cpu",
            device="host",
            quality=Quality.MODEL,
            max_power_w=self.tdp_w,
            info=(("model", model), ("logical_cpus", str(cpus))),
        )
        return [self._channel]

    def read(self) -> list[Reading]:
        if self._channel is None:
            return []
        try:
            util = min(max(self._utilization(), 0.0), 1.0)
        except OSError as exc:
            return [Reading(self._channel, error=f"cannot read CPU times: {exc}")]
        power = self.idle_w + (self.tdp_w - self.idle_w) * util
        return [Reading(self._channel, power_w=power, utilization=util, gauges={"tdp_w": self.tdp_w})]

    def _psutil_utilization(self) -> float:
        """Busy fraction of CPU time since the previous call (the previous value when no tick passed)."""
        busy, total = _cpu_times()
        if self._prev is not None:
            d_busy, d_total = busy - self._prev[0], total - self._prev[1]
            if d_total <= 0:
                return self._last_util
            self._last_util = d_busy / d_total
        self._prev = (busy, total)
        return self._last_util
