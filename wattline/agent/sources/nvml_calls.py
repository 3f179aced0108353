"""NVML calls that may fail, as the NVML source makes them: a query or None, an optional
query remembered NotSupported until the next refresh, and NVML's strings as str."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wattline.agent.sources.nvml_procs import Gpu


def call(nv: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None on any NVML error."""
    try:
        return fn(*args)
    except nv.NVMLError:
        return None


def optional(nv: Any, gpu: Gpu, key: str, fn: Callable[[Any], Any]) -> Any:
    """``fn(gpu.handle)``, or None when it fails; NotSupported is remembered (in
    ``gpu.unsupported``, under ``key``) until the source's next refresh."""
    if key in gpu.unsupported:
        return None
    try:
        return fn(gpu.handle)
    except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
        gpu.unsupported.add(key)
    except nv.NVMLError:
        pass
    return None


def text(value: Any) -> str:
    """NVML strings arrive as str (convertStrBytes) or, in older bindings, bytes."""
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
