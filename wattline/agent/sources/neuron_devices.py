"""What the Neuron source knows of its devices' type and figures: the device type from the
first of the options, neuron-monitor's hardware and instance, sysfs and DMI that names one;
its maximum and idle power from the table with the options' overrides; its NeuronCores."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from wattline.agent.sources.neuron_config import (
    CORES_PER_DEVICE,
    DEVICE_IDLE_POWER_W,
    DEVICE_MAX_POWER_W,
    NeuronOptions,
    normalize_device_type,
)
from wattline.agent.sources.neuron_report import HardwareInfo, InstanceInfo
from wattline.agent.sources.sysfs import read_attr


def sysfs_device_type(sys_dir: Path, devices: list[int]) -> str | None:
    """The device type the first device's sysfs ``info/architecture`` names, if any."""
    for dev in devices[:1]:
        arch = sys_dir / f"neuron{dev}" / "info" / "architecture"
        for name in ("device_name", "instance_type", "arch_type"):
            text = read_attr(arch / name)
            if text and (dtype := normalize_device_type(text)):
                return dtype
    return None


def device_type(
    options: NeuronOptions,
    hardware: HardwareInfo | None,
    instance: InstanceInfo | None,
    sysfs_type: str | None,
    dmi_instance_type: str,
) -> str | None:
    """The first canonical device type among, in order: the option, neuron-monitor's
    hardware and instance, sysfs, the DMI product name (an instance type)."""
    candidates = [
        options.device_type,
        hardware.device_type if hardware else None,
        instance.instance_type if instance else None,
        sysfs_type,
        dmi_instance_type,
    ]
    for candidate in candidates:
        if candidate and (dtype := normalize_device_type(candidate)):
            return dtype
    return None


def _overrides(table: Mapping[str, float]) -> dict[str, float]:
    return {normalize_device_type(k) or k: v for k, v in table.items()}


def max_power_w(options: NeuronOptions, dtype: str | None) -> float | None:
    """The device's maximum power (W): the table's, or the options' override."""
    return {**DEVICE_MAX_POWER_W, **_overrides(options.device_max_power_w)}.get(dtype or "")


def largest_max_power_w(options: NeuronOptions) -> float:
    """The largest maximum power of the table with the options' overrides (an unknown type's bound)."""
    return max({**DEVICE_MAX_POWER_W, **_overrides(options.device_max_power_w)}.values())


def idle_power_w(options: NeuronOptions, dtype: str | None) -> float | None:
    """The device's idle power (W): the table's, or the options' override."""
    return {**DEVICE_IDLE_POWER_W, **_overrides(options.device_idle_power_w)}.get(dtype or "")


def cores_per_device(options: NeuronOptions, hardware: HardwareInfo | None, dtype: str | None) -> int | None:
    """NeuronCores per device: the option, else neuron-monitor's hardware, else the table's."""
    if options.cores_per_device:
        return options.cores_per_device
    if hardware and hardware.cores_per_device:
        return hardware.cores_per_device
    return CORES_PER_DEVICE.get(dtype or "")
