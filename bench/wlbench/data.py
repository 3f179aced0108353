"""Synthetic batches shaped like a real agent's: the fixture host's channels, values as the agent makes them.

An "all sources" host has 21 channels: 8 RAPL zones (no gauges), 4 NICs (4 byte/packet
gauges, MODEL), 8 GPUs (utilization + 3 gauges), 1 Neuron device (utilization + 2 gauges).
Energy is counter ticks x 1e-6 J, power = energy / interval, cumulative a running sum: full
17-digit doubles, as on real hosts (which is what the line-protocol encoder has to print).
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Iterator
from pathlib import Path

from wattline import wire

T0_NS = 1_780_000_000 * 10**9  # 2026-05-28, inside any retention

Channel = tuple[str, str, str, int, tuple[str, ...], bool]  # source, component, device, quality, gauges, util


def channels(kind: str = "all") -> list[Channel]:
    out: list[Channel] = []
    for s in range(2):
        out.append(("rapl", "cpu_package", f"package-{s}", wire.QUALITY_COUNTER, (), False))
        for comp, name in (("cpu_core", "core"), ("cpu_uncore", "uncore"), ("dram", "dram")):
            out.append(("rapl", comp, f"package-{s}/{name}", wire.QUALITY_COUNTER, (), False))
    nic_gauges = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")
    out += [("nic", "nic", f"eth{i}", wire.QUALITY_MODEL, nic_gauges, False) for i in range(4)]
    if kind == "all":
        gpu_gauges = ("memory_utilization", "memory_used_bytes", "power_limit_w")
        out += [
            ("nvml", "gpu", f"GPU-{g:08x}-0000-4000-8000-000000000000", wire.QUALITY_COUNTER, gpu_gauges, True)
            for g in range(8)
        ]
        out.append(("neuron", "accelerator", "neuron0", wire.QUALITY_MODEL, ("memory_used_bytes", "cores"), True))
    return out


class HostStream:
    """One agent stream: ticks of every channel, batched like the agent's spool."""

    def __init__(self, host_id: str, kind: str = "all", seed: int = 0, t0_ns: int = T0_NS) -> None:
        self.host_id = host_id
        self.channels = channels(kind)
        self.rng = random.Random(seed)
        self.stream_id = f"{seed:08x}{self.rng.getrandbits(96):024x}"
        self.seq = 0
        self.t_ns = t0_ns
        self.cumulative = [0.0] * len(self.channels)
        self.counters = [self.rng.randrange(10**9) for _ in self.channels]

    def tick_samples(self, batch: wire.pb.Batch, interval_ns: int, end_ns: int | None = None) -> None:
        start = self.t_ns
        end = end_ns if end_ns is not None else start + interval_ns
        self.t_ns = end
        dt = (end - start) / 1e9
        rng = self.rng
        for i, (source, component, device, quality, gauges, util) in enumerate(self.channels):
            ticks = int(rng.uniform(20, 300) * dt * 1e6)
            self.counters[i] += ticks
            energy = ticks * 1e-6
            self.cumulative[i] += energy
            s = batch.samples.add(
                source=source,
                component=component,
                device=device,
                start_ns=start,
                end_ns=end,
                energy_j=energy,
                power_w=energy / dt,
                cumulative_j=self.cumulative[i],
                quality=quality,
                healthy=True,
            )
            for name in gauges:
                s.gauges[name] = float(self.counters[i] if name.endswith(("bytes", "packets")) else rng.random())
            if util:
                s.utilization = rng.random()

    def batch(self, ticks: int, interval_ns: int = 10**9, labels: dict[str, str] | None = None) -> wire.pb.Batch:
        self.seq += 1
        batch = wire.Batch(stream_id=self.stream_id, seq=self.seq, sent_ns=time.time_ns())
        batch.host.host_id = self.host_id
        batch.host.agent_version = "bench"
        batch.host.labels.update(labels or {"cluster": "bench", "instance_type": "p5.48xlarge"})
        for _ in range(ticks):
            self.tick_samples(batch, interval_ns)
        return batch


def fleet_batches(hosts: int, points: int, per_batch: int = 5000, kind: str = "all") -> list[wire.pb.Batch]:
    """About ``points`` samples from ``hosts`` hosts, in batches of about ``per_batch`` samples."""
    streams = [HostStream(f"bench-host-{h:04d}", kind, seed=h) for h in range(hosts)]
    per_tick = len(streams[0].channels)
    ticks = max(1, per_batch // per_tick)
    batches: list[wire.pb.Batch] = []
    while sum(len(b.samples) for b in batches) < points:
        for stream in streams:
            batches.append(stream.batch(ticks))
    return batches


def write_frames(path: Path, payloads: list[bytes]) -> None:
    with path.open("wb") as fh:
        for data in payloads:
            fh.write(struct.pack("<I", len(data)))
            fh.write(data)


def read_frames(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    pos = 0
    while pos < len(data):
        (size,) = struct.unpack_from("<I", data, pos)
        yield data[pos + 4 : pos + 4 + size]
        pos += 4 + size
