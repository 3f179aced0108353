"""``wattline collector --processes 2`` on free ports into a fresh influxd database, and agents
that push known batches to it over gRPC (one channel each, as real agents)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import grpc
from procs import Proc
from prometheus_client.parser import text_string_to_metric_families
from servers import T0, Influxd, free_port, http, make_batch

from wattline import wire

SAMPLES = 20
RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED}


class Collector:
    """``wattline collector --processes 2`` on free ports, writing to a fresh database."""

    def __init__(self, tmp_path: Path, influxd: Influxd, *extra: str) -> None:
        self.influxd = influxd
        self.db = influxd.new_database()
        self.port, self.metrics_port = free_port(), free_port()
        argv = ["collector", "--listen", f"127.0.0.1:{self.port}", "--store", influxd.url, "--influx-api", "v1"]
        argv += ["--influx-database", self.db, "--processes", "2", "--prometheus-port", str(self.metrics_port)]
        self.proc = Proc([*argv, "--no-summaries", *extra], tmp_path / "collector.log")
        self.pids = self._wait_ready()

    def _wait_ready(self) -> list[int]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.alive(), self.proc.log()[-3000:]
            found = re.findall(r"collector: 2 processes on port \d+ \(pids (\d+) (\d+)\)", self.proc.log())
            if found:
                return [int(p) for p in found[-1]]
            time.sleep(0.1)
        raise AssertionError(f"collector not serving:\n{self.proc.log()[-3000:]}")

    def metrics_text(self) -> str:
        """The supervisor's /metrics as served."""
        status, body = http("GET", f"http://127.0.0.1:{self.metrics_port}/metrics")
        assert status == 200
        return body.decode()

    def metrics(self) -> dict[str, float]:
        """``name{label="v",...}`` -> value, from the supervisor's /metrics."""
        out = {}
        for family in text_string_to_metric_families(self.metrics_text()):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def stored(self, host: str | None = None) -> int:
        where = f" WHERE host = '{host}'" if host else ""
        rows = self.influxd.query(f"SELECT count(energy_j) FROM energy{where}", self.db)
        return int(rows[0]["count"]) if rows else 0


class Agent(threading.Thread):
    """One agent on its own channel: pushes batches 1..n in order, each until acknowledged."""

    def __init__(
        self, port: int, host: str, batches: int, pause_s: float = 0.0, resend_first: bool = False, stream: str = ""
    ) -> None:
        super().__init__(daemon=True)
        self.stream = stream or f"s-{host}"
        # Its own connection, as a real agent (channels of one process otherwise share one).
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
        self.host, self.batches, self.pause_s, self.resend_first = host, batches, pause_s, resend_first
        self.acked: list[int] = []
        self.written = 0
        self.retries = 0
        self.errors: list[grpc.StatusCode] = []
        self.stop = threading.Event()

    def batch(self, seq: int) -> bytes:
        t0 = T0 + (seq - 1) * SAMPLES * 10**9
        return make_batch(host=self.host, samples=SAMPLES, t0=t0, stream=self.stream, seq=seq).SerializeToString()

    def run(self) -> None:
        push = self.channel.unary_unary(
            "/wattline.v1.Telemetry/Push", request_serializer=None, response_deserializer=wire.Ack.FromString
        )
        seqs = [1, *range(1, self.batches + 1)] if self.resend_first else range(1, self.batches + 1)
        for seq in seqs:
            while not self.stop.is_set():
                try:
                    ack = push(self.batch(seq), timeout=20)
                except grpc.RpcError as exc:
                    if exc.code() not in RETRY:
                        self.errors.append(exc.code())
                        return
                    self.retries += 1
                    time.sleep(0.1)
                    continue
                assert ack.seq == seq and ack.rejected == 0, ack
                self.acked.append(seq)
                self.written += ack.written
                break
            time.sleep(self.pause_s)
        self.channel.close()


def run_all(agents: list[Agent], timeout_s: float = 120) -> None:
    """Start the agents not started yet; wait for all."""
    for a in agents:
        if a.ident is None:
            a.start()
    for a in agents:
        a.join(timeout_s)
        assert not a.is_alive(), f"agent {a.host} still pushing"
        assert not a.errors, f"agent {a.host}: {a.errors}"
