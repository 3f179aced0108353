"""Accelerator work inside a job's window: wait for queued work at the window's edges.

CUDA (and XLA) calls return before the device has done the work they queue, so a job's
window would open while earlier work still runs and close while its own kernels still
run. ``Job(..., sync="torch")`` (or a callable) waits for that work before the window
opens, at ``mark_saturated()`` and before it closes, as ml-energy/zeus does at its
measurement windows' edges.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)

#: What ``Job(sync=...)`` takes: "torch", a callable, or None (no synchronization).
SyncSpec = str | Callable[[], object] | None


def torch_sync() -> None:
    """Wait for the work queued on every visible CUDA device, and on XLA devices (Neuron,
    TPU) when the program uses ``torch_xla``. Nothing without torch, CUDA or XLA."""
    try:
        import torch  # only when asked: a job without sync="torch" never loads it
    except ImportError:
        return
    if torch.cuda.is_available():
        for device in range(torch.cuda.device_count()):
            torch.cuda.synchronize(device)
    xla = sys.modules.get("torch_xla.core.xla_model")  # only a program that uses XLA has loaded it
    if xla is not None:
        xla.wait_device_ops()


class Sync:
    """Calls the synchronization ``spec`` names (:data:`SyncSpec`); ValueError for another value."""

    def __init__(self, spec: SyncSpec) -> None:
        if spec == "torch":
            self.fn: Callable[[], object] | None = torch_sync
        elif spec is None or callable(spec):
            self.fn = spec
        else:
            raise ValueError(f"sync must be 'torch' or a callable, not {str(spec)[:100]!r}")

    def __call__(self) -> None:
        """Wait for queued accelerator work (an error propagates)."""
        if self.fn is not None:
            self.fn()

    def before_close(self) -> None:
        """Wait before the window closes; an error is logged, not raised: the job still closes."""
        try:
            self()
        except Exception as exc:
            log.warning("sync before the job's close failed (its window closes now): %s", exc)
