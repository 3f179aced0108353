"""What the NVML source knows of each GPU beyond energy: its state, its compute processes
and their per-process utilization samples (the queries behind ``processes``/``process_use``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wattline.agent.sources.base import Channel

#: nvmlProcessInfo_t.gpuInstanceId outside MIG.
_NO_INSTANCE = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class ProcessUse:
    """One compute process on one GPU (or MIG instance)."""

    pid: int
    #: GPU memory of the process; None where the driver cannot tell (Windows WDDM).
    used_memory_bytes: int | None
    #: Percent of SM time in the driver's samples since the previous call; None: no sample.
    sm_util: int | None = None
    #: The MIG GPU instance running the process; None outside MIG.
    gpu_instance_id: int | None = None


@dataclass(slots=True)
class Gpu:
    """What the source holds of one GPU: its handle, channel and the state of its queries."""

    index: int
    handle: Any
    uuid: str
    channel: Channel | None = None
    mode: str = ""
    mig: bool = False
    limit_w: float | None = None
    #: Optional queries that answered NotSupported; not retried until the next refresh.
    unsupported: set[str] = field(default_factory=set)
    health: str = "ok"
    last_sample_us: int = 0
    #: Newest per-process utilization sample seen by process_use() (CPU time, us).
    last_use_us: int = 0


def process_list(nv: Any, handle: Any, sampled: Gpu | None) -> list[ProcessUse]:
    """Compute processes on ``handle``; SM use from ``sampled``'s samples when given."""
    try:
        infos = nv.nvmlDeviceGetComputeRunningProcesses(handle)
    except (nv.NVMLError, getattr(nv, "NVMLLibraryMismatchError", nv.NVMLError)):
        return []
    sm = _sm_samples(nv, sampled) if sampled is not None else {}
    out = []
    for info in infos:
        pid = int(info.pid)
        memory = getattr(info, "usedGpuMemory", None)
        instance = getattr(info, "gpuInstanceId", _NO_INSTANCE)
        gi = None if instance is None or instance == _NO_INSTANCE else int(instance)
        out.append(ProcessUse(pid, None if memory is None else int(memory), sm.get(pid), gi))
    return out


def utilization_samples(nv: Any, gpu: Gpu, since_us: int) -> list[Any] | None:
    """Per-process utilization samples newer than ``since_us``: [] when there is none
    (NVML_ERROR_NOT_FOUND), None when the query is not supported or failed."""
    if "process_utilization" in gpu.unsupported:
        return None
    try:
        return list(nv.nvmlDeviceGetProcessUtilization(gpu.handle, since_us))
    except nv.NVMLError_NotFound:
        return []
    except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
        gpu.unsupported.add("process_utilization")
    except nv.NVMLError:
        pass
    return None


def _sm_samples(nv: Any, gpu: Gpu) -> dict[int, int]:
    """pid -> SM percent of the newest sample since the previous call."""
    samples = utilization_samples(nv, gpu, gpu.last_sample_us)
    newest: dict[int, tuple[int, int]] = {}
    for sample in samples or ():  # NotFound (no samples since then) -> none
        stamp, pid = int(sample.timeStamp), int(sample.pid)
        if stamp >= newest.get(pid, (-1, 0))[0]:
            newest[pid] = (stamp, int(sample.smUtil))
        gpu.last_sample_us = max(gpu.last_sample_us, stamp)
    return {pid: sm for pid, (_, sm) in newest.items()}
