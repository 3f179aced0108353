"""What one ``neuron-monitor`` report says, as typed dataclasses (parsed from its JSON line
by :mod:`.neuron_parse`), and one Neuron device's figures from it (:meth:`NeuronReport.device_stats`:
NeuronCores mapped to devices, per-runtime figures to the devices each runtime uses).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "DeviceStats",
    "ExecutionStats",
    "HardwareInfo",
    "HwCounters",
    "InstanceInfo",
    "NeuronReport",
    "RuntimeReport",
]


@dataclass(frozen=True, slots=True)
class ExecutionStats:
    """``execution_stats`` of one runtime.

    The counts look cumulative since the runtime started, not per period: in the
    recorded trn1 stream ``error_summary.generic`` grows 23654 -> 23692 -> 23749 over
    three one-second reports while ``completed`` stays at 260.
    """

    completed: int = 0
    #: ``error_summary``: generic, numerical, transient, model, runtime, hardware.
    errors: Mapping[str, int] = field(default_factory=dict)
    #: ``latency_stats.total_latency``: percentile name ("p50") -> seconds.
    total_latency_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def error_count(self) -> int:
        """All errors of the period, every kind summed."""
        return sum(self.errors.values())


@dataclass(frozen=True, slots=True)
class RuntimeReport:
    """One entry of ``neuron_runtime_data``: one Neuron runtime (process)."""

    pid: int | None
    tag: str
    error: str
    #: NeuronCore index -> utilization in percent (``neuroncore_counters``); None when
    #: the group is missing or reported an error.
    core_utilization_pct: Mapping[int, float] | None = None
    #: NeuronCore index -> FLOP/s (``flops`` or ``effective_flops``), where given.
    core_flops: Mapping[int, float] = field(default_factory=dict)
    #: NeuronCore index -> device memory bytes (``usage_breakdown.neuroncore_memory_usage``).
    core_memory_bytes: Mapping[int, int] = field(default_factory=dict)
    host_memory_bytes: int | None = None
    device_memory_bytes: int | None = None
    #: Device indices named by ``loaded_models[].subgraphs[].neuron_device_index``.
    model_devices: frozenset[int] = frozenset()
    execution: ExecutionStats | None = None

    @property
    def cores(self) -> frozenset[int]:
        """Every NeuronCore index this runtime is seen using."""
        util = set(self.core_utilization_pct or ())
        return frozenset(util | set(self.core_flops) | set(self.core_memory_bytes))


@dataclass(frozen=True, slots=True)
class HwCounters:
    """``neuron_hw_counters`` of one device: ECC event counts by name."""

    device_index: int
    #: e.g. {"mem_ecc_corrected": 0, "sram_ecc_uncorrected": 0, ...}: every integer field.
    counts: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """``instance_info`` (EC2 metadata as neuron-monitor sees it)."""

    instance_type: str = ""
    availability_zone: str = ""
    region: str = ""


@dataclass(frozen=True, slots=True)
class HardwareInfo:
    """``neuron_hardware_info``; the short (older) form has only the two counts."""

    device_count: int | None = None
    cores_per_device: int | None = None
    device_type: str | None = None  #: "trainium2", newer reports only
    device_memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceStats:
    """The report's figures for one Neuron device (see :meth:`NeuronReport.device_stats`)."""

    utilization: float | None = None  #: 0..1, mean over the device's NeuronCores
    memory_used_bytes: int | None = None
    host_memory_used_bytes: int | None = None
    flops_per_s: float | None = None  #: sum of the cores' ``flops``/``effective_flops``
    executions_completed: int | None = None
    execution_errors: int | None = None
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    ecc: Mapping[str, int] = field(default_factory=dict)
    runtimes: int = 0

    def gauges(self) -> dict[str, float]:
        """The figures as Reading gauges (unit in the name); absent ones left out."""
        g: dict[str, float] = {}
        pairs = (
            ("memory_used_bytes", self.memory_used_bytes),
            ("host_memory_used_bytes", self.host_memory_used_bytes),
            ("flops_per_s", self.flops_per_s),
            ("executions_completed", self.executions_completed),
            ("execution_errors", self.execution_errors),
            ("execution_latency_p50_s", self.latency_p50_s),
            ("execution_latency_p99_s", self.latency_p99_s),
            ("runtimes", self.runtimes),
        )
        for name, value in pairs:
            if value is not None:
                g[name] = float(value)
        for key, n in self.ecc.items():
            # "mem_ecc_corrected" -> "ecc_mem_corrected_count"
            m = re.fullmatch(r"(\w+?)_ecc_(\w+)", key)
            g[f"ecc_{m.group(1)}_{m.group(2)}_count" if m else f"{key}_count"] = float(n)
        return g


@dataclass(frozen=True, slots=True)
class NeuronReport:
    """One parsed neuron-monitor report."""

    runtimes: tuple[RuntimeReport, ...] = ()
    hw_counters: Mapping[int, HwCounters] = field(default_factory=dict)
    instance: InstanceInfo | None = None
    hardware: HardwareInfo | None = None
    #: Every non-empty error in the report, prefixed by where it was ("runtime 1337: ...").
    errors: tuple[str, ...] = ()

    @property
    def counters_known(self) -> bool:
        """True when every runtime reported its NeuronCore counters without error."""
        return all(rt.core_utilization_pct is not None for rt in self.runtimes)

    def core_utilization_pct(self) -> dict[int, float]:
        """NeuronCore index -> utilization percent, summed over runtimes, capped at 100."""
        out: dict[int, float] = {}
        for rt in self.runtimes:
            for core, pct in (rt.core_utilization_pct or {}).items():
                out[core] = min(out.get(core, 0.0) + pct, 100.0)
        return out

    def device_stats(self, device: int, cores_per_device: int | None, device_count: int | None) -> DeviceStats:
        """Figures of one device.

        NeuronCore ``i`` belongs to device ``i // cores_per_device`` (neuron-monitor numbers
        cores, logical ones under LNC, densely across devices). Utilization is the mean over
        all the device's cores, an idle core (absent from every runtime) counting 0; None
        when the core-to-device map is unknown or a runtime's counters are missing.
        Device memory is summed per core; None when a runtime's share cannot be placed.
        Per-runtime figures (host memory, execution stats) belong to the devices the runtime
        uses; a runtime spanning several devices shows them on each.
        """
        single = device_count == 1

        def on_device(core: int) -> bool:
            if cores_per_device:
                return core // cores_per_device == device
            return single and device == 0

        users = [rt for rt in self.runtimes if device in self._runtime_devices(rt, cores_per_device, device_count)]
        utilization: float | None = None
        if cores_per_device and self.counters_known:
            per_core = self.core_utilization_pct()
            cores = range(device * cores_per_device, (device + 1) * cores_per_device)
            utilization = sum(per_core.get(c, 0.0) for c in cores) / cores_per_device / 100.0
        mem: int | None = 0
        flops: float | None = None
        for rt in self.runtimes:
            if rt.core_memory_bytes and (cores_per_device or single):
                mem = None if mem is None else mem + sum(b for c, b in rt.core_memory_bytes.items() if on_device(c))
            elif rt.device_memory_bytes is not None:
                devices = self._runtime_devices(rt, cores_per_device, device_count)
                if devices == {device}:
                    mem = None if mem is None else mem + rt.device_memory_bytes
                elif device in devices or not devices:
                    mem = None  # this runtime's device memory cannot be split per device
            else:
                mem = None  # no memory figures from this runtime (error, or not requested)
            fl = [f for c, f in rt.core_flops.items() if on_device(c)]
            if fl:
                flops = (flops or 0.0) + sum(fl)
        host = [rt.host_memory_bytes for rt in users if rt.host_memory_bytes is not None]
        execs = [rt.execution for rt in users if rt.execution is not None]
        p50 = [x for e in execs if (x := e.total_latency_s.get("p50")) is not None]
        p99 = [x for e in execs if (x := e.total_latency_s.get("p99")) is not None]
        hw = self.hw_counters.get(device)
        return DeviceStats(
            utilization=utilization,
            memory_used_bytes=mem,
            host_memory_used_bytes=sum(host) if host else None,
            flops_per_s=flops,
            executions_completed=sum(e.completed for e in execs) if execs else None,
            execution_errors=sum(e.error_count for e in execs) if execs else None,
            latency_p50_s=max(p50) if p50 else None,
            latency_p99_s=max(p99) if p99 else None,
            ecc=dict(hw.counts) if hw else {},
            runtimes=len(users),
        )

    @staticmethod
    def _runtime_devices(rt: RuntimeReport, cores_per_device: int | None, device_count: int | None) -> set[int]:
        devices = set(rt.model_devices)
        if cores_per_device:
            devices |= {c // cores_per_device for c in rt.cores}
        elif device_count == 1 and (rt.cores or rt.device_memory_bytes):
            devices.add(0)
        return devices
