"""The floor for an agent in Python: read the same counter files at the same rate, nothing else.

Usage: ``python -m wlbench.floor TREE RATE [COLLECTOR]``. Opens the fixture host's 24 counter
files once (8 RAPL ``energy_uj``, 4 statistics files of 4 NICs) and, on a fixed grid, reads
each with ``os.pread`` on the kept descriptor and parses it: the yardstick of BENCHMARKS.md
("plain Python, os.pread on kept descriptors"). Runs until SIGTERM.

With ``COLLECTOR`` (HOST:PORT of a wattline collector) it also makes one **empty** unary gRPC
call (the health service's ``Check``) every ``batch_interval`` (the agent's default), on one
kept channel set up as the agent's (same options, gRPC imported as the agent's entry points
import it): the least a Python agent that ships over gRPC at the default settings can cost,
whatever its batches hold.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path


def empty_call(address: str) -> Callable[[], object]:
    """One empty unary call on a kept channel configured as the agent's uplink."""
    from wattline.agent.grpc_io import import_grpc

    import_grpc()
    import grpc
    from grpc_health.v1 import health_pb2

    from wattline.agent.uplink import channel_options

    channel = grpc.insecure_channel(address, options=channel_options())
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    request = health_pb2.HealthCheckRequest()
    return lambda: check(request, timeout=10)


def default_batch_interval() -> float:
    from wattline.agent.settings import AgentSettings

    return AgentSettings().batch_interval


def main() -> None:
    root, rate = Path(sys.argv[1]), float(sys.argv[2])
    call = empty_call(sys.argv[3]) if len(sys.argv) > 3 else None
    every = default_batch_interval() if call is not None else 0.0
    call_at = time.monotonic() + every
    paths = sorted((root / "sys/class/powercap").glob("intel-rapl:*/energy_uj"))
    paths += sorted((root / "sys/class/net").glob("*/statistics/[rt]x_[bp]*"))
    fds = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in paths]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    period = 1.0 / rate
    next_at = time.monotonic()
    total = 0
    if call is not None:
        call()  # connected before the window
    calls = f", one empty gRPC call per {every:g} s" if call is not None else ""
    print(f"floor: {len(fds)} files at {rate:g} Hz{calls}", flush=True)
    while True:
        for fd in fds:
            total += int(os.pread(fd, 32, 0))
        if call is not None and time.monotonic() >= call_at:
            call()
            call_at += every
        next_at += period
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_at = time.monotonic()


if __name__ == "__main__":
    main()
