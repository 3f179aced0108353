"""MIG as the NVML source sees it: whether a GPU has it on, its instances, their memory and
processes, and each process's share of the GPU by its instance's memory (NVML has no
per-instance energy and no per-process utilization under MIG)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from wattline.agent.sources.nvml_calls import call, text
from wattline.agent.sources.nvml_procs import Gpu, process_list
from wattline.agent.sources.use import DeviceUse


def mig_enabled(nv: Any, handle: Any) -> bool:
    """Whether MIG is on for the GPU of ``handle`` (False when the query fails)."""
    modes = call(nv, nv.nvmlDeviceGetMigMode, handle)
    return modes is not None and modes[0] == nv.NVML_DEVICE_MIG_ENABLE


def mig_handles(nv: Any, gpu: Gpu) -> list[Any]:
    """Handles of the MIG instances of ``gpu`` (none when MIG is off)."""
    count = call(nv, nv.nvmlDeviceGetMaxMigDeviceCount, gpu.handle) if gpu.mig else None
    handles = []
    for slot in range(count or 0):
        try:
            handles.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot))
        except (nv.NVMLError_NotFound, nv.NVMLError_InvalidArgument):
            continue  # empty slot
        except nv.NVMLError:
            break  # the parent itself failed
    return handles


def mig_refused(nv: Any, gpu: Gpu) -> str:
    """Why per-instance shares of ``gpu`` cannot be read without privileges ("" when they can):
    drivers refuse an unprivileged caller (a container) a MIG instance's memory."""
    for handle in mig_handles(nv, gpu):
        try:
            nv.nvmlDeviceGetMemoryInfo(handle)
        except nv.NVMLError_NoPermission as exc:
            return f"MIG instance memory: {exc} (a share per instance needs it: a privileged caller)"
        except nv.NVMLError:
            continue
    return ""


def mig_use(nv: Any, gpu: Gpu, running: frozenset[int]) -> DeviceUse:
    """Each process on an instance of ``gpu`` gets an equal part of the instance's share of
    the GPU's memory (metric "mig-memory", a rule by instance size, not a measurement)."""
    parent = call(nv, nv.nvmlDeviceGetMemoryInfo, gpu.handle)
    use: dict[int, float] = {}
    for handle in mig_handles(nv, gpu):
        try:
            memory = nv.nvmlDeviceGetMemoryInfo(handle)
        except nv.NVMLError_NoPermission:
            # no share can be told: outside the jobs' use scope (charged by claims),
            # never a silent 0 % (:func:`mig_refused` says so at discovery)
            return DeviceUse("gpu", gpu.uuid, "mig-memory", running, {}, supported=False)
        except nv.NVMLError:
            memory = None
        pids = [p.pid for p in process_list(nv, handle, None)]
        if memory is None or parent is None or not int(parent.total) or not pids:
            continue
        instance_share = 100.0 * int(memory.total) / int(parent.total)
        for pid in pids:
            use[pid] = use.get(pid, 0.0) + instance_share / len(pids)
    return DeviceUse("gpu", gpu.uuid, "mig-memory", running, use, total=100.0)


def mig_instances(nv: Any, gpu: Gpu) -> list[dict[str, Any]]:
    """The MIG instances of ``gpu`` as JSON-ready dicts (keys: parent_uuid, mig_uuid,
    gpu_instance_id, memory_used_bytes, memory_total_bytes, processes)."""
    out: list[dict[str, Any]] = []
    for handle in mig_handles(nv, gpu):
        memory = call(nv, nv.nvmlDeviceGetMemoryInfo, handle)
        out.append(
            {
                "parent_uuid": gpu.uuid,
                "mig_uuid": text(call(nv, nv.nvmlDeviceGetUUID, handle)),
                "gpu_instance_id": call(nv, nv.nvmlDeviceGetGpuInstanceId, handle),
                "memory_used_bytes": None if memory is None else int(memory.used),
                "memory_total_bytes": None if memory is None else int(memory.total),
                "processes": [asdict(p) for p in process_list(nv, handle, None)],
            }
        )
    return out
