"""How the NVML source reads a GPU's energy: which read works (the total-energy counter,
else instantaneous power, else the 1 s average power), probed once at discovery, then
one read per GPU and tick with its utilization, memory and power limit."""

from __future__ import annotations

from typing import Any

from wattline.agent.sources.base import Channel, Reading
from wattline.agent.sources.nvml_calls import optional
from wattline.agent.sources.nvml_procs import Gpu

#: The energy reads, as ``Gpu.mode`` names them ("" : none works).
ENERGY, FIELD, USAGE = "total_energy_consumption", "power_instant", "power_usage"
#: NVML_FI_DEV_POWER_INSTANT (mW), not named by older nvidia-ml-py releases.
_FI_DEV_POWER_INSTANT = 186
#: nvmlValueType_t -> the c_nvmlValue_t member holding it.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def probe_mode(nv: Any, handle: Any, use_energy_counter: bool) -> str:
    """Which energy read works: "" when none does; other NVML errors propagate."""
    unsupported = (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound)
    if use_energy_counter:
        try:
            nv.nvmlDeviceGetTotalEnergyConsumption(handle)
            return ENERGY
        except unsupported:
            pass
    try:
        field_power_w(nv, handle)
        return FIELD
    except nv.NVMLError:
        pass  # drivers that predate the field answer variously; the plain query decides
    try:
        nv.nvmlDeviceGetPowerUsage(handle)
        return USAGE
    except unsupported:
        return ""


def field_power_w(nv: Any, handle: Any) -> float:
    """Instantaneous power (W) from the field query; an NVMLError when it fails."""
    value = nv.nvmlDeviceGetFieldValues(handle, [_FI_DEV_POWER_INSTANT])[0]
    if value.nvmlReturn != nv.NVML_SUCCESS:
        raise nv.NVMLError(value.nvmlReturn)
    member = _VALUE_MEMBERS.get(int(value.valueType), "uiVal")
    return float(getattr(value.value, member)) / 1000.0


def power_limit_w(nv: Any, gpu: Gpu) -> float | None:
    """The enforced power limit (W), else the management limit; None when neither answers."""
    for fn in (nv.nvmlDeviceGetEnforcedPowerLimit, nv.nvmlDeviceGetPowerManagementLimit):
        milliwatts = optional(nv, gpu, fn.__name__, fn)
        if milliwatts:
            return float(milliwatts) / 1000.0
    return None


def read_gpu(nv: Any, gpu: Gpu, channel: Channel) -> Reading:
    """One read of ``gpu`` by its probed mode; a failed energy read marks it unhealthy."""
    reading = Reading(channel)
    try:
        if gpu.mode == ENERGY:
            reading.energy_raw = int(nv.nvmlDeviceGetTotalEnergyConsumption(gpu.handle))
        elif gpu.mode == FIELD:
            reading.power_w = field_power_w(nv, gpu.handle)
        else:
            reading.power_w = float(nv.nvmlDeviceGetPowerUsage(gpu.handle)) / 1000.0
    except nv.NVMLError as exc:
        gpu.health = reading.error = str(exc)
        return reading  # a failed GPU is not asked for the rest
    gpu.health = "ok"
    util = optional(nv, gpu, "utilization", nv.nvmlDeviceGetUtilizationRates)
    if util is not None:
        reading.utilization = util.gpu / 100.0
        reading.gauges["memory_utilization"] = util.memory / 100.0
    memory = optional(nv, gpu, "memory", nv.nvmlDeviceGetMemoryInfo)
    if memory is not None:
        reading.gauges["memory_used_bytes"] = float(memory.used)
    if gpu.limit_w is not None:
        reading.gauges["power_limit_w"] = gpu.limit_w
    return reading
