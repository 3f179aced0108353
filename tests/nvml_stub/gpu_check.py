"""Check NvmlSource on a real GPU host: counter energy vs integrated power, under load.

Reads every GPU through two NvmlSource instances for ``--seconds`` (default 20): the
default one (energy counter, COUNTER) and one with ``use_energy_counter=False`` (power
integrated, INTEGRATED), both folded by the real EnergyCounter. While it runs, a torch
matmul loop loads GPU 0 if torch with CUDA is importable; otherwise the GPUs idle.

    python tests/nvml_stub/gpu_check.py [--seconds 20] [--interval 0.1] [--tolerance 0.1] [--ramp 1]

Prints per GPU: joules from both paths, their relative difference, J/s, utilization and
read() cost, then processes, MIG instances and health. Exit status: 0 when every GPU with
both paths agrees within the tolerance, 1 when one does not, 2 when NVML is unavailable.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import threading
import time
from typing import Any

from wattline.agent.counter import EnergyCounter
from wattline.agent.sources.base import Reading, SourceUnavailable
from wattline.agent.sources.nvml import NvmlOptions, NvmlSource


def start_load(stop: threading.Event) -> tuple[str, threading.Thread | None]:
    """Start a matmul loop on CUDA device 0 (NVML index 0); describe what runs."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # make cuda:0 NVML's GPU 0
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError:
        return "none (torch not importable): GPUs idle", None
    if not torch.cuda.is_available():
        return "none (torch sees no CUDA device): GPUs idle", None

    def loop() -> None:
        a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.float16)
        b = torch.randn(8192, 8192, device="cuda:0", dtype=torch.float16)
        while not stop.is_set():
            for _ in range(20):
                torch.matmul(a, b)
            torch.cuda.synchronize(0)

    thread = threading.Thread(target=loop, name="gpu-load", daemon=True)
    thread.start()
    return f"torch float16 8192x8192 matmul on cuda:0 ({torch.cuda.get_device_name(0)})", thread


def sample(src: NvmlSource, counters: dict[str, EnergyCounter], costs: list[float]) -> list[Reading]:
    """One read(), folded into ``counters`` at the read's midpoint."""
    t0 = time.monotonic()
    readings = src.read()
    t1 = time.monotonic()
    costs.append(t1 - t0)
    for reading in readings:
        counters[reading.channel.device].update(reading, (t0 + t1) / 2)
    return readings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--tolerance", type=float, default=0.1, help="relative, e.g. 0.1 = 10 %%")
    parser.add_argument("--ramp", type=float, default=1.0, help="seconds of load before measuring")
    args = parser.parse_args(argv)

    counter_src, power_src = NvmlSource(), NvmlSource(options=NvmlOptions(use_energy_counter=False))
    try:
        counter_channels = counter_src.discover()
        power_channels = power_src.discover()
    except SourceUnavailable as exc:
        print(f"NVML unavailable: {exc}")
        return 2
    for note in counter_src.notes + power_src.notes:
        print(f"[{note.level}] {note.text}")

    stop = threading.Event()
    load, thread = start_load(stop)
    print(f"load: {load}")
    time.sleep(args.ramp)  # let the load ramp up before the first baseline

    by_counter = {c.device: EnergyCounter(c) for c in counter_channels}
    by_power = {c.device: EnergyCounter(c) for c in power_channels}
    costs: dict[str, list[float]] = {"counter": [], "power": []}
    utils: dict[str, list[float]] = {}
    errors: dict[str, set[str]] = {}
    start = time.monotonic()
    try:
        while time.monotonic() - start < args.seconds:
            for reading in sample(counter_src, by_counter, costs["counter"]):
                if reading.utilization is not None:
                    utils.setdefault(reading.channel.device, []).append(reading.utilization)
                if reading.error:
                    errors.setdefault(reading.channel.device, set()).add(reading.error)
            sample(power_src, by_power, costs["power"])
            time.sleep(args.interval)
        elapsed = time.monotonic() - start
        processes, mig, health = counter_src.processes(), counter_src.mig_devices(), counter_src.device_health()
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=10)
        counter_src.close()
        power_src.close()

    print(f"\n{elapsed:.1f} s, {len(costs['counter'])} reads per path")
    for path, values in costs.items():
        print(f"read() cost, {path} path: median {statistics.median(values) * 1e3:.2f} ms for all GPUs")
    ok = True
    for device in sorted(by_counter.keys() | by_power.keys()):
        c, p = by_counter.get(device), by_power.get(device)
        either = c or p
        assert either is not None
        info = dict(either.channel.info)
        print(f"\nGPU {info.get('index', '?')} {device} ({info.get('name', '?')})")
        for ctr in (c, p):
            if ctr is not None:
                joules = ctr.cumulative_j
                print(f"  {ctr.channel.quality:<10} {joules:10.1f} J  {joules / elapsed:7.1f} J/s")
        if c is not None and p is not None and c.channel.quality != p.channel.quality:
            diff = abs(c.cumulative_j - p.cumulative_j) / max(c.cumulative_j, 1e-9)
            agree = diff <= args.tolerance
            ok &= agree
            verdict = "agree" if agree else "DISAGREE"
            print(f"  difference {diff * 100:.2f} % -> {verdict} (tolerance {args.tolerance:.0%})")
        if device in utils:
            print(f"  utilization mean {statistics.fmean(utils[device]) * 100:.0f} %")
        if device in errors:
            print(f"  errors: {sorted(errors[device])}")
        print(f"  health {health.get(device, '?')}; processes {processes.get(device, [])}")
    if mig:
        print(f"\nMIG instances: {mig}")
    print("\nRESULT:", "agree" if ok else "DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
