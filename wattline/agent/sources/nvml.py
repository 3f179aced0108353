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

This module holds the source (discovery, the views beyond ``read()``); one GPU's energy read
is ``nvml_read.py``, its processes and their samples ``nvml_procs.py``, MIG ``nvml_mig.py``.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from wattline.agent.sources.base import Channel, Note, Reading, Source, SourceUnavailable
from wattline.agent.sources.nvml_calls import call, text
from wattline.agent.sources.nvml_mig import mig_enabled, mig_instances, mig_refused, mig_use
from wattline.agent.sources.nvml_procs import Gpu, ProcessUse, process_list, sampled_use
from wattline.agent.sources.nvml_read import ENERGY, FIELD, power_limit_w, probe_mode, read_gpu
from wattline.agent.sources.use import DeviceUse
from wattline.quality import Quality

#: The one-line reason when there is no usable NVML library or driver.
LIBRARY_MISSING = "NVML library not found (no NVIDIA driver): libnvidia-ml.so.1"
#: Twice the period the energy counter steps at on the GPUs documented in
#: tests/nvml_stub/UNKIND.md, for drivers that step more slowly; the bounds' nvml
#: ``update_s`` (wattline/accounting/uncertainty.py) is that period itself.
NVML_COUNTER_STEP_S = 0.2


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
                    gpu.limit_w = power_limit_w(self._nv, gpu) or gpu.limit_w
                readings.append(read_gpu(self._nv, gpu, gpu.channel))
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
        over 100 %) is left out and counted (``nvml_procs.fresh_samples``). GPUs that failed are
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
                    out.append(mig_use(self._nv, gpu, running))
                else:
                    out.append(sampled_use(self._nv, gpu, running))
            return out

    def mig_devices(self) -> list[dict[str, Any]]:
        """Every MIG instance of every MIG-enabled GPU, as JSON-ready dicts.

        Keys: parent_uuid, mig_uuid, gpu_instance_id, memory_used_bytes,
        memory_total_bytes, processes (ProcessUse fields). Instances carry no energy.
        """
        with self._lock:
            if self._nv is None:
                return []
            out: list[dict[str, Any]] = []
            for gpu in self._gpus:
                gpu.mig = mig_enabled(self._nv, gpu.handle)
                out.extend(mig_instances(self._nv, gpu))
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
        version = call(nv, nv.nvmlSystemGetDriverVersion)
        self.notes.append(Note("info", f"NVIDIA driver {text(version) or 'unknown'}, {count} GPU(s)"))
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = text(nv.nvmlDeviceGetUUID(handle))
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
        name = text(call(nv, nv.nvmlDeviceGetName, gpu.handle)) or "unknown"
        label = f"GPU {gpu.index} {gpu.uuid} ({name})"
        try:
            gpu.mode = probe_mode(nv, gpu.handle, self.options.use_energy_counter)
        except nv.NVMLError as exc:
            gpu.health = str(exc)
            self.notes.append(Note("warning", f"{label}: {exc}; no energy"))
            return
        if not gpu.mode:
            gpu.health = "no energy counter or power reading"
            self.notes.append(Note("warning", f"{label}: NVML reports neither energy nor power"))
            return
        gpu.mig = mig_enabled(nv, gpu.handle)
        gpu.limit_w = power_limit_w(nv, gpu)
        memory = call(nv, nv.nvmlDeviceGetMemoryInfo, gpu.handle)
        info = [
            ("name", name),
            ("uuid", gpu.uuid),
            ("index", str(gpu.index)),
            ("energy_source", gpu.mode),
            ("mig", "enabled" if gpu.mig else "disabled"),
        ]
        if memory is not None:
            info.append(("memory_total_bytes", str(int(memory.total))))
        counter = gpu.mode == ENERGY
        if not counter:
            why = "no energy counter" if self.options.use_energy_counter else "energy counter off by option"
            what = "instantaneous power" if gpu.mode == FIELD else "nvmlDeviceGetPowerUsage (1 s average)"
            self.notes.append(Note("info", f"{label}: {why}; integrating {what}"))
        if gpu.mig:
            self.notes.append(Note("info", f"{label}: MIG enabled; energy is the whole GPU's, counted once"))
            refused = mig_refused(nv, gpu)
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
            counter_step_s=NVML_COUNTER_STEP_S,
            info=tuple(info),
        )

    # -- helpers ---------------------------------------------------------------------------

    def _shutdown(self) -> None:
        nv, self._nv = self._nv, None
        self._gpus = []
        if nv is not None:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()
