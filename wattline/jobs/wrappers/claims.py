"""The devices a job is charged for in full: ``--devices``, else what its environment gives it
(``CUDA_VISIBLE_DEVICES``, ``NEURON_RT_VISIBLE_CORES``), GPU indexes turned into the UUIDs
samples carry."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)


def devices_from_env(env: Mapping[str, str]) -> list[str]:
    """Devices a job holds by default: CUDA_VISIBLE_DEVICES GPUs, NEURON_RT_VISIBLE_CORES cores."""
    devices: list[str] = []
    cuda = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if cuda and cuda not in {"-1", "none", "NoDevFiles"}:
        devices += [f"gpu:{d.strip()}" for d in cuda.split(",") if d.strip()]
    cores = env.get("NEURON_RT_VISIBLE_CORES", "").strip()
    for part in filter(None, (p.strip() for p in cores.split(","))):
        if "-" in part:
            lo, hi = part.split("-", 1)
            devices += [f"neuroncore:{i}" for i in range(int(lo), int(hi) + 1)]
        else:
            devices.append(f"neuroncore:{part}")
    return devices


def parse_devices(text: str) -> list[str]:
    """``--devices 0,1`` / ``gpu:GPU-uuid`` / ``neuroncore:0-3`` into device claims."""
    devices: list[str] = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        kind, sep, ident = item.partition(":")
        if not sep:
            kind, ident = ("gpu", item)
        if kind not in {"gpu", "neuroncore", "neuron"}:
            raise ValueError(f"--devices: unknown device kind {kind!r} in {item!r} (gpu, neuroncore, neuron)")
        if kind == "neuroncore" and "-" in ident:
            lo, hi = ident.split("-", 1)
            devices += [f"neuroncore:{i}" for i in range(int(lo), int(hi) + 1)]
        else:
            devices.append(f"{kind}:{ident}")
    return devices


def resolve_gpu_claims(claims: list[str], root: Path = Path("/")) -> list[str]:
    """Turn ``gpu:<index>`` claims into ``gpu:<UUID>``, the device id samples carry.

    Indexes are NVML's (PCI bus order, as ``nvidia-smi`` shows them; set
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA agrees). Without NVML the claims stay as given
    and the report charges no GPU to them.
    """
    if not any(c.startswith("gpu:") and c[4:].isdigit() for c in claims):
        return claims
    from wattline.agent.sources.base import SourceUnavailable
    from wattline.agent.sources.nvml import NvmlSource

    source = NvmlSource(root)
    try:
        by_index = {dict(ch.info).get("index", ""): ch.device for ch in source.discover()}
    except SourceUnavailable as exc:
        log.warning("cannot map GPU indexes to UUIDs (%s): job devices stay %s", exc, ",".join(claims))
        return claims
    finally:
        source.close()
    return [f"gpu:{by_index[c[4:]]}" if c.startswith("gpu:") and c[4:] in by_index else c for c in claims]
