"""What the NVML source knows of each GPU beyond energy: its state, its compute processes
and their per-process utilization samples (the queries behind ``processes``/``process_use``;
MIG's rule instead of samples: ``nvml_mig.py``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from wattline.agent.sources.base import Channel
from wattline.agent.sources.use import DeviceUse

log = logging.getLogger(__name__)

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
    #: Per-process utilization samples left out, by reason (:func:`fresh_samples`).
    dropped: dict[str, int] = field(default_factory=dict)


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


def sampled_use(nv: Any, gpu: Gpu, running: frozenset[int]) -> DeviceUse:
    """Each process's SM utilization on ``gpu`` (memory utilization where no process used
    SMs), from the fresh samples since ``gpu.last_use_us``, which moves to the newest."""
    samples = utilization_samples(nv, gpu, gpu.last_use_us)
    if samples is None:  # not supported
        return DeviceUse("gpu", gpu.uuid, "sm", running, {}, supported=False)
    fresh = fresh_samples(gpu, samples, gpu.last_use_us)
    for sample in fresh.values():
        gpu.last_use_us = max(gpu.last_use_us, int(sample.timeStamp))
    sm = {pid: float(s.smUtil) for pid, s in fresh.items()}
    memory = {pid: float(s.memUtil) for pid, s in fresh.items()}
    if not any(sm.values()) and any(memory.values()):  # memory-bound only
        return DeviceUse("gpu", gpu.uuid, "memory", running, memory)
    return DeviceUse("gpu", gpu.uuid, "sm", running, sm)


#: Why a per-process utilization sample is left out (docs/sources.md, nvml).
STALE = "stamped at or before lastSeenTimeStamp"
NO_PID, OVER_100, OLDER = "pid 0", "over 100 %", "older sample of its pid"


def fresh_samples(gpu: Gpu, samples: list[Any], since_us: int) -> dict[int, Any]:
    """pid -> the one sample to use of an answer to ``nvmlDeviceGetProcessUtilization(since_us)``.

    NVML documents one sample per process, newer than ``since_us``, each value a percent;
    drivers also return their whole buffer (the size query answers its size, the rest are
    zero entries: pid 0), samples older than asked, and values over 100 %. A pid 0 entry is
    padding or a process NVML could not name, so no job's; an older sample of a pid is
    superseded by its newest; a value over 100 % is no measurement, and clamping it would
    invent full use. Each left-out sample is counted in ``gpu.dropped`` by reason, and the
    first of each reason is logged."""
    newest: dict[int, Any] = {}
    for sample in samples:
        pid, stamp = int(sample.pid), int(sample.timeStamp)
        if pid == 0:
            reason = NO_PID
        elif stamp <= since_us:
            reason = STALE
        elif max(int(sample.smUtil), int(sample.memUtil)) > 100:
            reason = OVER_100
        elif pid in newest and int(newest[pid].timeStamp) >= stamp:
            reason = OLDER
        else:
            if pid in newest:
                _drop(gpu, OLDER, newest[pid])
            newest[pid] = sample
            continue
        _drop(gpu, reason, sample)
    return newest


def _drop(gpu: Gpu, reason: str, sample: Any) -> None:
    if reason not in gpu.dropped and reason != NO_PID:  # padding is routine: not worth a line
        log.warning(
            "GPU %s: per-process utilization sample left out (%s): pid %d, SM %d %%, memory %d %%, stamp %d us",
            gpu.uuid, reason, int(sample.pid), int(sample.smUtil), int(sample.memUtil), int(sample.timeStamp),
        )  # fmt: skip
    gpu.dropped[reason] = gpu.dropped.get(reason, 0) + 1


def _sm_samples(nv: Any, gpu: Gpu) -> dict[int, int]:
    """pid -> SM percent of the newest sample since the previous call."""
    samples = fresh_samples(gpu, utilization_samples(nv, gpu, gpu.last_sample_us) or [], gpu.last_sample_us)
    for sample in samples.values():
        gpu.last_sample_us = max(gpu.last_sample_us, int(sample.timeStamp))
    return {pid: int(sample.smUtil) for pid, sample in samples.items()}
