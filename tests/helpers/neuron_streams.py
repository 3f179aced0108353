#!/usr/bin/env python3
"""neuron-monitor streams shaped like a bigger instance than the one recorded (for
``tests/helpers/neuron_replay.py --file``), built from the recorded trn1.2xlarge report and the
documented fragments next to it; ``fixtures/neuron/SOURCE.md`` says where each field's
shape comes from.

``python tests/helpers/neuron_streams.py`` rewrites the committed trn2.48xlarge stream
(:data:`TRN2_STREAM`); tests check that it is what :func:`trn2_stream` makes.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "neuron"
TRN2_STREAM = FIX / "trn2.48xlarge_shaped_stream.ndjson"
#: The runtime in the streams: no process of a test's jobs (none has this pid's use).
RUNTIME_PID = 4242


def _fragment(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIX / f"docs_fragment_{name}.json").read_text())
    return loaded[name]


def shaped_stream(
    instance_type: str, hardware: dict[str, Any], busy_cores: range, utilization_pct: tuple[float, ...]
) -> list[dict[str, Any]]:
    """One report per ``utilization_pct``: the recorded report 1 with ``instance_type``, the
    ``neuron_hardware_info`` ``hardware``, a hardware-counter entry per device, and one
    runtime (pid :data:`RUNTIME_PID`) holding ``busy_cores`` at that NeuronCore utilization."""
    recorded = json.loads((FIX / "trn1.2xlarge_wandb_stream.ndjson").read_text().splitlines()[0])
    base = recorded["neuron_runtime_data"][0]
    memory = base["report"]["memory_used"]["neuron_runtime_used_bytes"]["usage_breakdown"]["neuroncore_memory_usage"]
    hw_entry = recorded["system_data"]["neuron_hw_counters"]["neuron_devices"][0]
    out = []
    for pct in utilization_pct:
        report = copy.deepcopy(recorded)
        rt = report["neuron_runtime_data"][0]
        rt["pid"], rt["neuron_runtime_tag"] = RUNTIME_PID, str(RUNTIME_PID)
        counters = rt["report"]["neuroncore_counters"]
        # Newer schema (documented fragment, line 395): per-core flops beside the utilization.
        counters["neuroncores_in_use"] = {
            str(c): {"neuroncore_utilization": pct, "flops": 1234567891011} for c in busy_cores
        }
        used = rt["report"]["memory_used"]["neuron_runtime_used_bytes"]["usage_breakdown"]
        used["neuroncore_memory_usage"] = {str(c): copy.deepcopy(memory["0"]) for c in busy_cores}
        devices = range(hardware["neuron_device_count"])
        report["system_data"]["neuron_hw_counters"]["neuron_devices"] = [
            {**hw_entry, "neuron_device_index": d} for d in devices
        ]
        report["instance_info"] = {**_fragment("instance_info"), "instance_type": instance_type}
        report["neuron_hardware_info"] = hardware
        out.append(report)
    return out


def trn2_stream() -> list[dict[str, Any]]:
    """trn2.48xlarge at logical NeuronCore config 1: 16 Trainium2 devices of 8 NeuronCores
    (indexes 0..127); one runtime on device 0's cores 0-7."""
    hardware = {**_fragment("neuron_hardware_info"), "neuroncore_per_device_count": 8, "logical_neuroncore_config": 1}
    return shaped_stream("trn2.48xlarge", hardware, range(8), (61.5, 58.25, 63.75))


def trn1_stream() -> list[dict[str, Any]]:
    """trn1.32xlarge in the recorded (older) schema: 16 devices of 2 NeuronCores (0..31); one
    runtime on devices 0 and 1 (cores 0-3)."""
    hardware = {"neuron_device_count": 16, "neuroncore_per_device_count": 2, "error": ""}
    return shaped_stream("trn1.32xlarge", hardware, range(4), (40.0, 42.5, 38.0))


def ndjson(reports: list[dict[str, Any]]) -> str:
    """One compact JSON report per line, as neuron-monitor writes them."""
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in reports)


if __name__ == "__main__":
    TRN2_STREAM.write_text(ndjson(trn2_stream()))
