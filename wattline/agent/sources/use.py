"""Per-process use of one accelerator, as the sources that can tell report it.

NVML (per-process utilization samples, running compute processes) and neuron-monitor
(per-runtime NeuronCore utilization) both say how much of a device each process used
over an interval. A job's wrapper sums that over the job's processes
(:mod:`wattline.jobs.wrappers.usage`) to record the job's use of each device.
"""

from __future__ import annotations

from dataclasses import dataclass

from wattline import wire


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """Use of one device by each process over the interval since the previous query.

    ``use`` maps a pid to its use, percent of the device (``metric`` says of what: "sm",
    "memory", "neuroncore", or "mig-memory": a process's part of its MIG instance's share
    of the GPU's memory, a rule where NVML measures nothing); a process absent from it used
    nothing. ``running`` are the
    processes holding the device now (a compute context, a Neuron runtime). ``supported``
    is False where the driver gives no per-process figures (e.g. a MIG-enabled GPU).
    """

    component: str  #: "gpu" | "accelerator", as the device's energy samples name it
    device: str  #: GPU UUID, "neuron0"
    metric: str
    running: frozenset[int]
    use: dict[int, float]
    supported: bool = True
    #: Every process's use together, where it is not the sum of ``use`` (MIG: 100, the GPU).
    total: float | None = None

    @property
    def key(self) -> str:
        """The device as job events and device claims name it: ``"gpu:<UUID>"``, ``"neuron:0"``."""
        return wire.claim_key(self.component, self.device)
