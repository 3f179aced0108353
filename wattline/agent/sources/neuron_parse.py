"""Pure parsing of one ``neuron-monitor`` JSON report into the dataclasses of :mod:`.neuron_report`.

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
from typing import Any

from wattline.agent.sources.neuron_report import (
    ExecutionStats,
    HardwareInfo,
    HwCounters,
    InstanceInfo,
    NeuronReport,
    RuntimeReport,
)

__all__ = ["ReportError", "parse_report", "parse_report_obj"]


class ReportError(ValueError):
    """A line that is not one JSON object (malformed or truncated)."""


# -- tolerant field access: a value of the wrong type reads as absent ---------------------


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
