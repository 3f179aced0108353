"""``wattline collector`` / ``wattline agent`` as real processes for the fault tests.

Started with the test interpreter (``python -m wattline.cli.main``), logs in files, stopped
by PID: SIGKILL for a crash, SIGTERM for a graceful stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

CLI = [sys.executable, "-m", "wattline.cli.main"]


def clean_env() -> dict[str, str]:
    """The environment without WATTLINE_* settings, systemd or debug variables of the caller."""
    drop = ("WATTLINE_", "NOTIFY_SOCKET", "WATCHDOG_", "STATE_DIRECTORY", "RUNTIME_DIRECTORY")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


class Proc:
    """One wattline process with its log file."""

    def __init__(self, args: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> None:
        """``env``: variables set on top of :func:`clean_env`."""
        self.args = args
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [*CLI, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**clean_env(), **(env or {})},
            )

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill9(self) -> None:
        if self.alive():
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait (SIGKILL past ``timeout_s``); the exit status."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill9()
        return int(self.process.returncode)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_serving(port: int, proc: Proc, timeout_s: float = 30.0) -> None:
    """Block until the collector on ``port`` answers its health check."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if not proc.alive():
                raise AssertionError(f"collector on port {port} exited:\n{proc.log()[-3000:]}")
            try:
                answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0, wait_for_ready=True)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                time.sleep(0.05)
    raise AssertionError(f"collector on port {port} not serving after {timeout_s} s:\n{proc.log()[-3000:]}")


def start_rapl_agent(
    host: str, tree: Path, port: int, batch_s: float, log_path: Path, *extra: str, env: Mapping[str, str] | None = None
) -> Proc:
    """``wattline agent`` sampling the RAPL zones of ``tree`` every 0.25 s, shipping a batch
    every ``batch_s`` to the collector on 127.0.0.1:port."""
    args = ["agent", "--host-id", host, "--sysfs-root", str(tree), "--source", "rapl", "--interval", "0.25"]
    return Proc([*args, "--batch-interval", str(batch_s), f"--collector=127.0.0.1:{port}", *extra], log_path, env)


def start_collector(
    port: int, store_args: list[str], log_path: Path, *extra: str, env: Mapping[str, str] | None = None
) -> Proc:
    """``wattline collector`` on 127.0.0.1:port, serving once this returns."""
    proc = Proc(["collector", "--listen", f"127.0.0.1:{port}", *store_args, *extra], log_path, env)
    wait_serving(port, proc)
    return proc
