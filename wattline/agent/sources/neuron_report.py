"""Pure parsing of one ``neuron-monitor`` JSON report into typed dataclasses.

neuron-monitor writes one complete JSON object per line to stdout. The shape (docs:
aws-neuron-sdk ``neuron-monitor-user-guide.rst``)::

    {"neuron_runtime_data": [{"pid", "neuron_runtime_tag", "error",
                              "report": {"neuroncore_counters", "execution_stats",
                                         "memory_used", "neuron_runtime_vcpu_usage"}}],
     "system_data": {"neuron_hw_counters", "vcpu_usage", "memory_info"},
     "instance_info": {...}, "neuron_hardware_info": {...}, "neuron_k8s_info": {...}}

Both known generations parse: older reports (2022/23) have a short
``neuron_hardware_info`` (device count, cores per device) and no per-core FLOPs; newer ones
add ``neuron_device_type``, memory size and LNC, and per-core ``flops`` (docs) or
``effective_flops`` (seen in captures). Every field is optional and type-checked: a value
of the wrong type reads as absent, never as an exception. Every non-empty ``error`` string
anywhere in the report is collected in :attr:`NeuronReport.errors`. Only what the source
uses is parsed: per-runtime core use, memory, FLOPs and execution counts, ECC counters,
the instance's type and place, the device layout; not the system's vCPU and memory figures.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DeviceStats",
    "ExecutionStats",
    "HardwareInfo",
    "HwCounters",
    "InstanceInfo",
    "NeuronReport",
    "ReportError",
    "RuntimeReport",
    "parse_report",
    "parse_report_obj",
]


class ReportError(ValueError):
    """A line that is not one JSON object (malformed or truncated)."""


# -- tolerant field access -------------------------------------------------------------


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _index(key: str) -> int | None:
    return int(key) if key.isdigit() else None


# -- dataclasses -----------------------------------------------------------------------


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


# -- parsing ---------------------------------------------------------------------------


def parse_report(line: str | bytes) -> NeuronReport:
    """Parse one stdout line; raise :class:`ReportError` unless it is one JSON object."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReportError(f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ReportError(f"not a JSON object ({type(obj).__name__})")
    return parse_report_obj(obj)


def parse_report_obj(obj: Mapping[str, Any]) -> NeuronReport:
    """Parse an already decoded report; never raises for odd or missing fields."""
    errors: list[str] = []
    if top := _str(obj.get("error")):
        errors.append(f"neuron-monitor: {top}")
    runtimes = tuple(_runtime(r, errors) for r in _list(obj.get("neuron_runtime_data")) if isinstance(r, dict))
    system = _dict(obj.get("system_data"))
    for name, group in system.items():
        if err := _str(_dict(group).get("error")):
            errors.append(f"{name}: {err}")
    hw = _hw_counters(_dict(system.get("neuron_hw_counters")))
    instance = hardware = None
    if isinstance(inst := obj.get("instance_info"), dict):
        instance = _instance(inst)
        if err := _str(inst.get("error")):
            errors.append(f"instance_info: {err}")
    if isinstance(hwi := obj.get("neuron_hardware_info"), dict):
        hardware = _hardware(hwi)
        if err := _str(hwi.get("error")):
            errors.append(f"neuron_hardware_info: {err}")
    return NeuronReport(runtimes, hw, instance, hardware, tuple(errors))


def _runtime(r: Mapping[str, Any], errors: list[str]) -> RuntimeReport:
    pid = _int(r.get("pid"))
    tag = _str(r.get("neuron_runtime_tag"))
    label = f"runtime {tag or pid}"
    error = _str(r.get("error"))
    if error:
        errors.append(f"{label}: {error}")
    report = _dict(r.get("report"))
    for name, group in report.items():
        if err := _str(_dict(group).get("error")):
            errors.append(f"{label} {name}: {err}")

    util: dict[int, float] | None = None
    flops: dict[int, float] = {}
    counters = report.get("neuroncore_counters")
    if isinstance(counters, dict) and not _str(counters.get("error")):
        in_use = counters.get("neuroncores_in_use")
        if isinstance(in_use, dict):
            util = {}
            for key, core in in_use.items():
                idx, core = _index(key), _dict(core)
                if idx is None:
                    continue
                if (pct := _float(core.get("neuroncore_utilization"))) is not None:
                    util[idx] = min(max(pct, 0.0), 100.0)
                fl = _float(core.get("flops"))
                fl = fl if fl is not None else _float(core.get("effective_flops"))
                if fl is not None:
                    flops[idx] = fl

    mem_group = _dict(report.get("memory_used"))
    used = _dict(mem_group.get("neuron_runtime_used_bytes"))
    core_mem: dict[int, int] = {}
    for key, parts in _dict(_dict(used.get("usage_breakdown")).get("neuroncore_memory_usage")).items():
        if (idx := _index(key)) is not None:
            core_mem[idx] = sum(v for v in map(_int, _dict(parts).values()) if v is not None)
    model_devices = set()
    for model in _list(mem_group.get("loaded_models")):
        for sub in _dict(_dict(model).get("subgraphs")).values():
            if (dev := _int(_dict(sub).get("neuron_device_index"))) is not None:
                model_devices.add(dev)

    execution = _execution(report["execution_stats"]) if isinstance(report.get("execution_stats"), dict) else None
    return RuntimeReport(
        pid=pid,
        tag=tag,
        error=error,
        core_utilization_pct=util,
        core_flops=flops,
        core_memory_bytes=core_mem,
        host_memory_bytes=_int(used.get("host")),
        device_memory_bytes=_int(used.get("neuron_device")),
        model_devices=frozenset(model_devices),
        execution=execution,
    )


def _percentiles(d: Any) -> dict[str, float]:
    return {k: f for k, v in _dict(d).items() if re.fullmatch(r"p\d+", k) and (f := _float(v)) is not None}


def _execution(g: Mapping[str, Any]) -> ExecutionStats:
    summary = _dict(g.get("execution_summary"))
    latency = _dict(g.get("latency_stats"))

    return ExecutionStats(
        completed=_int(summary.get("completed")) or 0,
        errors={k: n for k, v in _dict(g.get("error_summary")).items() if (n := _int(v)) is not None},
        total_latency_s=_percentiles(latency.get("total_latency")),
    )


def _hw_counters(g: Mapping[str, Any]) -> dict[int, HwCounters]:
    out: dict[int, HwCounters] = {}
    for dev in _list(g.get("neuron_devices")):
        dev = _dict(dev)
        if (idx := _int(dev.get("neuron_device_index"))) is None:
            continue
        counts = {k: n for k, v in dev.items() if k != "neuron_device_index" and (n := _int(v)) is not None}
        out[idx] = HwCounters(idx, counts)
    return out


def _instance(g: Mapping[str, Any]) -> InstanceInfo:
    return InstanceInfo(
        instance_type=_str(g.get("instance_type")),
        availability_zone=_str(g.get("instance_availability_zone")),
        region=_str(g.get("instance_region")),
    )


def _hardware(g: Mapping[str, Any]) -> HardwareInfo:
    return HardwareInfo(
        device_count=_int(g.get("neuron_device_count")),
        cores_per_device=_int(g.get("neuroncore_per_device_count")),
        device_type=_str(g.get("neuron_device_type")) or None,
        device_memory_bytes=_int(g.get("neuron_device_memory_size")),
    )
