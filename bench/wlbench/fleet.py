"""Simulated agents (asyncio gRPC clients), one process of a fleet.

Usage: ``python -m wlbench.fleet --target HOST:PORT --first N --agents K --duration S --out FILE``.
Each agent has its own channel, samples the 12 RAPL + NIC channels once a second on its
own phase, and, like the real uplink, seals and pushes what it has every ``--push-every``
seconds (default: the agent's own ``batch_interval`` default) on another phase, keeping a
batch until it is acknowledged. Sample timestamps are the wall clock of the
tick, so the collector can measure sample-to-commit delay. After the run, unacknowledged
batches are retried for ``--drain`` seconds. FILE gets JSON: samples sent (ticked),
acknowledged, failed pushes, still unacknowledged at the end; the run's wall-clock window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

import grpc

from wattline import wire
from wattline.agent.settings import AgentSettings
from wattline.agent.uplink import channel_options
from wlbench.data import HostStream

METHOD = "/wattline.v1.Telemetry/Push"
NS = 10**9
#: How often a real agent pushes by default (``agent.batch_interval``).
AGENT_PUSH_EVERY_S: float = AgentSettings.batch_interval  # type: ignore[assignment]


async def agent(index: int, target: str, end: float, drain_s: float, push_every: float, stats: dict[str, int]) -> None:
    rng = random.Random(index)
    tick_phase, up_phase = rng.random(), rng.random()
    now = time.time()
    next_tick = int(now) + 1 + tick_phase
    stream = HostStream(f"fleet-{index:05d}", kind="rapl+nic", seed=index, t0_ns=int((next_tick - 1) * NS))
    pending: list[wire.pb.Batch] = []
    # Its own connection, as a real agent (a process's channels otherwise share one), with
    # the real agent's channel settings.
    options = [*channel_options(), ("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        push = channel.unary_unary(
            METHOD, request_serializer=wire.Batch.SerializeToString, response_deserializer=wire.Ack.FromString
        )
        next_up = int(now) + 1 + up_phase * push_every
        while True:
            await asyncio.sleep(max(0.0, next_up - time.time()))
            last = next_up >= end
            batch = None
            while next_tick <= min(next_up, end):
                if batch is None:
                    stream.seq += 1
                    batch = wire.Batch(stream_id=stream.stream_id, seq=stream.seq)
                    batch.host.host_id = stream.host_id
                    batch.host.agent_version = "bench"
                    batch.host.labels["cluster"] = "fleet"
                stream.tick_samples(batch, NS, end_ns=int(next_tick * NS))
                next_tick += 1.0
            if batch is not None:
                stats["sent"] += len(batch.samples)
                pending.append(batch)
            while pending:
                pending[0].sent_ns = time.time_ns()
                try:
                    ack = await push(pending[0], timeout=10)
                except grpc.RpcError as exc:
                    stats["failed_pushes"] += 1
                    code = exc.code().name if callable(getattr(exc, "code", None)) else "UNKNOWN"
                    stats[f"failed_{code}"] = stats.get(f"failed_{code}", 0) + 1
                    if last and time.time() < end + drain_s:
                        await asyncio.sleep(1.0)  # after the run: keep delivering, as an agent would
                        continue
                    break
                stats["acked"] += ack.written
                pending.pop(0)
            if last:
                break
            next_up += push_every
    stats["unacked_batches"] += len(pending)
    stats["unacked_samples"] += sum(len(b.samples) for b in pending)


async def fleet(
    first: int, count: int, target: str, duration: float, drain_s: float, push_every: float
) -> dict[str, float]:
    stats = {"sent": 0, "acked": 0, "failed_pushes": 0, "unacked_batches": 0, "unacked_samples": 0}
    start = time.time()
    end = start + duration
    await asyncio.gather(*(agent(first + i, target, end, drain_s, push_every, stats) for i in range(count)))
    return {**stats, "start": start, "end": end, "finished": time.time()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--agents", type=int, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--drain", type=float, default=60.0, help="seconds to keep delivering after the run")
    ap.add_argument("--push-every", type=float, default=AGENT_PUSH_EVERY_S, help="seconds between pushes")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    stats = asyncio.run(fleet(args.first, args.agents, args.target, args.duration, args.drain, args.push_every))
    args.out.write_text(json.dumps(stats))


if __name__ == "__main__":
    main()
