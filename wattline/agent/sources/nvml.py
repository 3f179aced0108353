"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` bindings): one energy channel per GPU.

Energy comes from the driver's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
mJ since the driver was loaded, Volta and newer) as a COUNTER channel. GPUs without it
report power to integrate (``NVML_FI_DEV_POWER_INSTANT``, else ``nvmlDeviceGetPowerUsage``,
a 1 s average on Ampere and newer) as INTEGRATED. With MIG enabled the physical GPU's
energy is reported once, on the parent's channel: NVML has no per-instance energy, and
repeating the parent's figure per instance would count it several times. Instances are
listed by :meth:`NvmlSource.mig_devices` instead (``wattline sources --json``, its ``details``).

Cost: a read makes three NVML calls per GPU (energy or power, utilization, memory). The
power limit is re-read, and queries found NotSupported are retried, every
``limit_refresh_reads`` reads. Per-process use (:meth:`NvmlSource.processes`, and
:meth:`NvmlSource.process_use` for job scoping) is separate: jobs' wrappers ask for it.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from wattline.agent.sources.base import Channel, Note, Reading, Source, SourceUnavailable
from wattline.agent.sources.nvml_procs import Gpu, ProcessUse, fresh_samples, process_list, utilization_samples
from wattline.agent.sources.use import DeviceUse
from wattline.quality import Quality

#: The one-line reason when there is no usable NVML library or driver.
LIBRARY_MISSING = "NVML library not found (no NVIDIA driver): libnvidia-ml.so.1"
_ENERGY, _FIELD, _USAGE = "total_energy_consumption", "power_instant", "power_usage"
#: NVML_FI_DEV_POWER_INSTANT (mW), not named by older nvidia-ml-py releases.
_FI_DEV_POWER_INSTANT = 186


@dataclass(frozen=True, slots=True)
class NvmlOptions:
    """Settings of :class:`NvmlSource`."""

    #: Plausibility bound (W) for a GPU that reports no power limit.
    default_max_power_w: float = 1500.0
    #: ``max_power_w`` = enforced power limit x this (transients exceed the limit).
    power_limit_margin: float = 1.5
    #: Re-read power limits, and retry NotSupported queries, every this many reads.
    limit_refresh_reads: int = 60
    #: False integrates power even where the energy counter exists (for cross-checks).
    use_energy_counter: bool = True

    def __post_init__(self) -> None:
        if self.default_max_power_w <= 0:
            raise ValueError("default_max_power_w must be > 0")
        if self.power_limit_margin < 1.0:
            raise ValueError("power_limit_margin must be >= 1")
        if self.limit_refresh_reads < 1:
            raise ValueError("limit_refresh_reads must be >= 1")


class NvmlSource(Source):
    """Energy, utilization and memory of every NVIDIA GPU that NVML sees."""

    name = "nvml"

    def __init__(self, root: Path = Path("/"), options: NvmlOptions | None = None) -> None:
        super().__init__(root)  # NVML reads no files; root is kept for uniformity.
        self.options = options or NvmlOptions()
        self._nv: Any = None  # the pynvml module once nvmlInit succeeded
        self._gpus: list[Gpu] = []
        self._unidentified: dict[str, str] = {}
        self._reads = 0
        self._lock = threading.Lock()

    # -- Source ----------------------------------------------------------------------

    def discover(self) -> list[Channel]:
        with self._lock:
            nv = self._init()
            try:
                return self._discover(nv)
            except BaseException:
                self._shutdown()
                raise

    def read(self) -> list[Reading]:
        with self._lock:
            if self._nv is None:
                return []
            self._reads += 1
            refresh = self._reads % self.options.limit_refresh_reads == 0
            readings = []
            for gpu in self._gpus:
                if gpu.channel is None:
                    continue
                if refresh and gpu.health == "ok":
                    gpu.unsupported.clear()
                    gpu.limit_w = self._power_limit_w(gpu) or gpu.limit_w
                readings.append(self._read_gpu(gpu, gpu.channel))
            return readings

    def close(self) -> None:
        with self._lock:
            self._shutdown()

    # -- views beyond read() -----------------------------------------------------------

    def details(self) -> dict[str, Any]:
        """``health`` (:meth:`device_health`), ``processes`` (:meth:`processes`, GPU UUID ->
        ProcessUse fields), ``mig_devices`` (:meth:`mig_devices`) and ``dropped_samples``
        (GPU UUID -> reason -> per-process utilization samples left out so far)."""
        processes = {uuid: [asdict(p) for p in procs] for uuid, procs in self.processes().items()}
        with self._lock:
            dropped = {g.uuid: dict(g.dropped) for g in self._gpus if g.dropped}
        return {
            "health": self.device_health(),
            "processes": processes,
            "mig_devices": self.mig_devices(),
            "dropped_samples": dropped,
        }

    def device_health(self) -> dict[str, str]:
        """GPU UUID -> "ok" or the last error of its energy/power read."""
        with self._lock:
            return {**self._unidentified, **{g.uuid: g.health for g in self._gpus}}

    def processes(self) -> dict[str, list[ProcessUse]]:
        """GPU UUID -> its compute processes.

        A MIG parent lists all its instances' processes where the driver allows it (root);
        :meth:`mig_devices` lists them per instance.
        """
        with self._lock:
            if self._nv is None:
                return {}
            return {g.uuid: process_list(self._nv, g.handle, None if g.mig else g) for g in self._gpus}

    def process_use(self, since_us: int | None = None) -> list[DeviceUse]:
        """Every GPU's per-process use since the previous call (or since ``since_us``, CPU
        time in microseconds, which the first call should give: the driver keeps samples
        of the last seconds). Each process's SM utilization (memory utilization where no
        process used SMs) is its mean over the driver's samples in that time: NVML answers
        one sample per process with non-zero use, the mean over its sample periods (1/6 s to
        1 s) since then; what drivers add to that (padding, stale samples, pid 0, values
        over 100 %) is left out and counted (:func:`fresh_samples`). GPUs that failed are
        left out. A MIG-enabled GPU has no per-process utilization: each process
        on an instance gets an equal part of the instance's share of the GPU's memory (metric
        "mig-memory", a rule by instance size, not a measurement; the rest of the GPU, empty
        or unpartitioned, is no process's)."""
        with self._lock:
            if self._nv is None:
                return []
            out = []
            for gpu in self._gpus:
                if gpu.channel is None or gpu.health != "ok":
                    continue
                if since_us is not None:
                    gpu.last_use_us = since_us
                running = frozenset(p.pid for p in process_list(self._nv, gpu.handle, None))
                if gpu.mig:
                    out.append(self._mig_use(gpu, running))
                    continue
                samples = utilization_samples(self._nv, gpu, gpu.last_use_us)
                if samples is None:  # not supported
                    out.append(DeviceUse("gpu", gpu.uuid, "sm", running, {}, supported=False))
                    continue
                fresh = fresh_samples(gpu, samples, gpu.last_use_us)
                for sample in fresh.values():
                    gpu.last_use_us = max(gpu.last_use_us, int(sample.timeStamp))
                sm = {pid: float(s.smUtil) for pid, s in fresh.items()}
                memory = {pid: float(s.memUtil) for pid, s in fresh.items()}
                if not any(sm.values()) and any(memory.values()):  # memory-bound only
                    out.append(DeviceUse("gpu", gpu.uuid, "memory", running, memory))
                else:
                    out.append(DeviceUse("gpu", gpu.uuid, "sm", running, sm))
            return out

    def _mig_use(self, gpu: Gpu, running: frozenset[int]) -> DeviceUse:
        nv = self._nv
        parent = self._call(nv.nvmlDeviceGetMemoryInfo, gpu.handle)
        use: dict[int, float] = {}
        for handle in self._mig_handles(gpu):
            try:
                memory = nv.nvmlDeviceGetMemoryInfo(handle)
            except nv.NVMLError_NoPermission:
                # no share can be told: outside the jobs' use scope (charged by claims),
                # never a silent 0 % (:meth:`_mig_refused` says so at discovery)
                return DeviceUse("gpu", gpu.uuid, "mig-memory", running, {}, supported=False)
            except nv.NVMLError:
                memory = None
            pids = [p.pid for p in process_list(self._nv, handle, None)]
            if memory is None or parent is None or not int(parent.total) or not pids:
                continue
            for pid in pids:
                use[pid] = use.get(pid, 0.0) + 100.0 * int(memory.total) / int(parent.total) / len(pids)
        return DeviceUse("gpu", gpu.uuid, "mig-memory", running, use, total=100.0)

    def _mig_refused(self, gpu: Gpu) -> str:
        """Why per-instance shares of ``gpu`` cannot be read without privileges ("" when they can):
        drivers refuse an unprivileged caller (a container) a MIG instance's memory."""
        nv = self._nv
        for handle in self._mig_handles(gpu):
            try:
                nv.nvmlDeviceGetMemoryInfo(handle)
            except nv.NVMLError_NoPermission as exc:
                return f"MIG instance memory: {exc} (a share per instance needs it: a privileged caller)"
            except nv.NVMLError:
                continue
        return ""

    def _mig_handles(self, gpu: Gpu) -> list[Any]:
        """Handles of the MIG instances of ``gpu`` (none when MIG is off)."""
        nv = self._nv
        count = self._call(nv.nvmlDeviceGetMaxMigDeviceCount, gpu.handle) if gpu.mig else None
        handles = []
        for slot in range(count or 0):
            try:
                handles.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot))
            except (nv.NVMLError_NotFound, nv.NVMLError_InvalidArgument):
                continue  # empty slot
            except nv.NVMLError:
                break  # the parent itself failed
        return handles

    def mig_devices(self) -> list[dict[str, Any]]:
        """Every MIG instance of every MIG-enabled GPU, as JSON-ready dicts.

        Keys: parent_uuid, mig_uuid, gpu_instance_id, memory_used_bytes,
        memory_total_bytes, processes (ProcessUse fields). Instances carry no energy.
        """
        with self._lock:
            if self._nv is None:
                return []
            nv = self._nv
            out: list[dict[str, Any]] = []
            for gpu in self._gpus:
                gpu.mig = self._mig_enabled(gpu.handle)
                for handle in self._mig_handles(gpu):
                    memory = self._call(nv.nvmlDeviceGetMemoryInfo, handle)
                    out.append(
                        {
                            "parent_uuid": gpu.uuid,
                            "mig_uuid": _text(self._call(nv.nvmlDeviceGetUUID, handle)),
                            "gpu_instance_id": self._call(nv.nvmlDeviceGetGpuInstanceId, handle),
                            "memory_used_bytes": None if memory is None else int(memory.used),
                            "memory_total_bytes": None if memory is None else int(memory.total),
                            "processes": [asdict(p) for p in process_list(self._nv, handle, None)],
                        }
                    )
            return out

    # -- discovery -----------------------------------------------------------------------

    def _init(self) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # the deprecated "pynvml" shim
                import pynvml as nv
        except ImportError:
            raise SourceUnavailable("nvidia-ml-py is not installed (module pynvml)") from None
        if self._nv is None:
            try:
                nv.nvmlInit()
            except (nv.NVMLError_LibraryNotFound, nv.NVMLError_DriverNotLoaded):
                raise SourceUnavailable(LIBRARY_MISSING) from None
            except nv.NVMLError as exc:
                raise SourceUnavailable(f"NVML initialisation failed: {exc}") from None
            self._nv = nv
        return nv

    def _discover(self, nv: Any) -> list[Channel]:
        self.notes = []
        self._gpus, self._unidentified, self._reads = [], {}, 0
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            raise SourceUnavailable(f"NVML cannot count GPUs: {exc}") from None
        if count == 0:
            raise SourceUnavailable("NVML found no GPUs")
        version = self._call(nv.nvmlSystemGetDriverVersion)
        self.notes.append(Note("info", f"NVIDIA driver {_text(version) or 'unknown'}, {count} GPU(s)"))
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
            except nv.NVMLError as exc:
                self._unidentified[f"gpu{index}"] = str(exc)
                self.notes.append(Note("warning", f"GPU {index}: {exc}; skipped"))
                continue
            gpu = Gpu(index, handle, uuid)
            self._gpus.append(gpu)
            self._open(nv, gpu)
        channels = [g.channel for g in self._gpus if g.channel is not None]
        if not channels:
            errors = sorted({*self._unidentified.values(), *(g.health for g in self._gpus)} - {"ok"})
            raise SourceUnavailable(f"none of {count} GPU(s) reports energy or power ({'; '.join(errors)})")
        return channels

    def _open(self, nv: Any, gpu: Gpu) -> None:
        """Probe one GPU and give it a channel, or record why it has none."""
        name = _text(self._call(nv.nvmlDeviceGetName, gpu.handle)) or "unknown"
        label = f"GPU {gpu.index} {gpu.uuid} ({name})"
        try:
            gpu.mode = self._probe_mode(nv, gpu.handle)
        except nv.NVMLError as exc:
            gpu.health = str(exc)
            self.notes.append(Note("warning", f"{label}: {exc}; no energy"))
            return
        if not gpu.mode:
            gpu.health = "no energy counter or power reading"
            self.notes.append(Note("warning", f"{label}: NVML reports neither energy nor power"))
            return
        gpu.mig = self._mig_enabled(gpu.handle)
        gpu.limit_w = self._power_limit_w(gpu)
        memory = self._call(nv.nvmlDeviceGetMemoryInfo, gpu.handle)
        info = [("name", name), ("uuid", gpu.uuid), ("index", str(gpu.index)), ("energy_source", gpu.mode)]
        info.append(("mig", "enabled" if gpu.mig else "disabled"))
        if memory is not None:
            info.append(("memory_total_bytes", str(int(memory.total))))
        counter = gpu.mode == _ENERGY
        if not counter:
            why = "no energy counter" if self.options.use_energy_counter else "energy counter off by option"
            what = "instantaneous power" if gpu.mode == _FIELD else "nvmlDeviceGetPowerUsage (1 s average)"
            self.notes.append(Note("info", f"{label}: {why}; integrating {what}"))
        if gpu.mig:
            self.notes.append(Note("info", f"{label}: MIG enabled; energy is the whole GPU's, counted once"))
            refused = self._mig_refused(gpu)
            if refused:
                self.notes.append(
                    Note("warning", f"{label}: {refused}; jobs on its MIG instances are charged by their claims")
                )
        limit = gpu.limit_w
        gpu.channel = Channel(
            source=self.name,
            component="gpu",
            device=gpu.uuid,
            quality=Quality.COUNTER if counter else Quality.INTEGRATED,
            counter_scale_j=1e-3 if counter else 1.0,
            counter_max=None,
            max_power_w=limit * self.options.power_limit_margin if limit else self.options.default_max_power_w,
            counter_step_s=0.2,  # twice its ~100 ms step (tests/nvml_stub/UNKIND.md), the bounds' nvml update_s
            info=tuple(info),
        )

    def _probe_mode(self, nv: Any, handle: Any) -> str:
        """Which energy read works: "" when none does; other NVML errors propagate."""
        unsupported = (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound)
        if self.options.use_energy_counter:
            try:
                nv.nvmlDeviceGetTotalEnergyConsumption(handle)
                return _ENERGY
            except unsupported:
                pass
        try:
            self._field_power_w(handle)
            return _FIELD
        except nv.NVMLError:
            pass  # drivers that predate the field answer variously; the plain query decides
        try:
            nv.nvmlDeviceGetPowerUsage(handle)
            return _USAGE
        except unsupported:
            return ""

    def _mig_enabled(self, handle: Any) -> bool:
        modes = self._call(self._nv.nvmlDeviceGetMigMode, handle)
        return modes is not None and modes[0] == self._nv.NVML_DEVICE_MIG_ENABLE

    def _power_limit_w(self, gpu: Gpu) -> float | None:
        nv = self._nv
        for fn in (nv.nvmlDeviceGetEnforcedPowerLimit, nv.nvmlDeviceGetPowerManagementLimit):
            milliwatts = self._optional(gpu, fn.__name__, fn)
            if milliwatts:
                return float(milliwatts) / 1000.0
        return None

    # -- reading -------------------------------------------------------------------------

    def _read_gpu(self, gpu: Gpu, channel: Channel) -> Reading:
        nv = self._nv
        reading = Reading(channel)
        try:
            if gpu.mode == _ENERGY:
                reading.energy_raw = int(nv.nvmlDeviceGetTotalEnergyConsumption(gpu.handle))
            elif gpu.mode == _FIELD:
                reading.power_w = self._field_power_w(gpu.handle)
            else:
                reading.power_w = float(nv.nvmlDeviceGetPowerUsage(gpu.handle)) / 1000.0
        except nv.NVMLError as exc:
            gpu.health = reading.error = str(exc)
            return reading  # a failed GPU is not asked for the rest
        gpu.health = "ok"
        util = self._optional(gpu, "utilization", nv.nvmlDeviceGetUtilizationRates)
        if util is not None:
            reading.utilization = util.gpu / 100.0
            reading.gauges["memory_utilization"] = util.memory / 100.0
        memory = self._optional(gpu, "memory", nv.nvmlDeviceGetMemoryInfo)
        if memory is not None:
            reading.gauges["memory_used_bytes"] = float(memory.used)
        if gpu.limit_w is not None:
            reading.gauges["power_limit_w"] = gpu.limit_w
        return reading

    def _field_power_w(self, handle: Any) -> float:
        nv = self._nv
        value = nv.nvmlDeviceGetFieldValues(handle, [_FI_DEV_POWER_INSTANT])[0]
        if value.nvmlReturn != nv.NVML_SUCCESS:
            raise nv.NVMLError(value.nvmlReturn)
        member = _VALUE_MEMBERS.get(int(value.valueType), "uiVal")
        return float(getattr(value.value, member)) / 1000.0

    # -- helpers ---------------------------------------------------------------------------

    def _optional(self, gpu: Gpu, key: str, fn: Callable[[Any], Any]) -> Any:
        """``fn(handle)``, or None when it fails; NotSupported is remembered until refresh."""
        nv = self._nv
        if key in gpu.unsupported:
            return None
        try:
            return fn(gpu.handle)
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
            gpu.unsupported.add(key)
        except nv.NVMLError:
            pass
        return None

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None on any NVML error."""
        try:
            return fn(*args)
        except self._nv.NVMLError:
            return None

    def _shutdown(self) -> None:
        nv, self._nv = self._nv, None
        self._gpus = []
        if nv is not None:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()


#: nvmlValueType_t -> the c_nvmlValue_t member holding it.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _text(value: Any) -> str:
    """NVML strings arrive as str (convertStrBytes) or, in older bindings, bytes."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
