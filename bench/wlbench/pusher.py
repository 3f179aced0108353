"""Pushes pre-serialized batches to a collector as fast as acknowledgements come back.

Usage: ``python -m wlbench.pusher --target HOST:PORT --frames FILE --streams K --out FILE``.
The batches are already protobuf bytes (an identity serializer), so this process costs the
collector's measurement nothing but the network. Stream k sends batches k, k+K, k+2K... one
at a time, like an agent waiting for each acknowledgement. FILE gets JSON: start and end
(monotonic), points acknowledged (written + rejected), errors.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import grpc

from wattline import wire
from wlbench.data import read_frames

METHOD = "/wattline.v1.Telemetry/Push"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--frames", type=Path, required=True)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    frames = list(read_frames(args.frames))
    # One connection per stream, as separate agents have (a process's channels otherwise
    # share one), so a collector's processes (SO_REUSEPORT) each get some.
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(args.target, options=options) for _ in range(args.streams)]
    for channel in channels:
        grpc.channel_ready_future(channel).result(timeout=30)
    acked = [0] * args.streams
    errors: list[str] = []

    def stream(k: int) -> None:
        push = channels[k].unary_unary(METHOD, request_serializer=None, response_deserializer=wire.Ack.FromString)
        for data in frames[k :: args.streams]:
            try:
                ack = push(data, timeout=120)
            except grpc.RpcError as exc:
                errors.append(str(exc)[:300])
                continue
            acked[k] += ack.written + ack.rejected

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(args.streams)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = time.monotonic()
    for channel in channels:
        channel.close()
    args.out.write_text(json.dumps({"start": start, "end": end, "acked": sum(acked), "errors": errors[:10]}))


if __name__ == "__main__":
    main()
