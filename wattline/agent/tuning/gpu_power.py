"""The power limit of every NVIDIA GPU through NVML (``nvmlDeviceSetPowerManagementLimit``,
mW; root on most systems): ``--param power_limit=200,300`` (W, a ``W`` suffix allowed).

Whether the host permits it is found by setting each GPU's limit to its current value,
which changes nothing.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from wattline.agent.tuning import NotPermitted
from wattline.config import ConfigError

PARAM = "power_limit"
KIND = "nvml_power_limit"
_WATTS = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*[Ww]?\s*")


def milliwatts(text: str) -> int:
    """``250`` / ``250W`` in mW; ValueError otherwise."""
    m = _WATTS.fullmatch(text)
    if m is None:
        raise ValueError(f"{text[:40]!r} is not a power in W")
    return round(float(m.group(1)) * 1000)


@contextlib.contextmanager
def nvml() -> Iterator[Any]:
    """The pynvml module, initialised; NotPermitted when there is no NVML to ask."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the deprecated "pynvml" shim
            import pynvml as nv
    except ImportError:
        raise NotPermitted("--param power_limit: nvidia-ml-py is not installed; nothing changed") from None
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise NotPermitted(
            f"--param power_limit: NVML unavailable ({exc}): no NVIDIA GPU here?; nothing changed"
        ) from None
    try:
        yield nv
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()


def _gpus(nv: Any) -> list[tuple[str, Any]]:
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(i)
        uuid = nv.nvmlDeviceGetUUID(handle)
        out.append((uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))
    return out


class GpuPowerLimit:
    """Every GPU's power limit, set to one value."""

    param = PARAM
    kind = KIND

    def check(self, values: Sequence[str]) -> None:
        try:
            wanted = [milliwatts(v) for v in values]
        except ValueError as exc:
            raise ConfigError(f"--param power_limit: {exc}") from None
        with nvml() as nv:
            gpus = _gpus(nv)
            if not gpus:
                raise NotPermitted("--param power_limit: NVML lists no GPU; nothing changed")
            for uuid, h in gpus:
                try:
                    lo, hi = nv.nvmlDeviceGetPowerManagementLimitConstraints(h)
                    current = nv.nvmlDeviceGetPowerManagementLimit(h)
                except nv.NVMLError as exc:
                    raise NotPermitted(f"--param power_limit: {uuid}: {exc}; nothing changed") from None
                for mw in wanted:
                    if not lo <= mw <= hi:
                        raise ConfigError(
                            f"--param power_limit: {mw / 1000:g} W is outside {uuid}'s {lo / 1000:g}-{hi / 1000:g} W"
                        )
                try:
                    nv.nvmlDeviceSetPowerManagementLimit(h, current)
                except nv.NVMLError as exc:
                    raise NotPermitted(
                        f"--param power_limit: NVML refuses to set {uuid}'s power limit ({exc}; root needed); "
                        "nothing changed"
                    ) from None

    def saved(self) -> dict[str, Any]:
        with nvml() as nv:
            return {uuid: int(nv.nvmlDeviceGetPowerManagementLimit(h)) for uuid, h in _gpus(nv)}

    def apply(self, value: str) -> None:
        _set({uuid: milliwatts(value) for uuid in self.saved()})


def _set(limits: dict[str, int]) -> None:
    with nvml() as nv:
        for uuid, h in _gpus(nv):
            if uuid in limits:
                nv.nvmlDeviceSetPowerManagementLimit(h, int(limits[uuid]))


def restore(state: dict[str, Any]) -> None:
    """Set each saved GPU (by UUID) back to its saved limit."""
    _set({str(k): int(v) for k, v in state.items()})
