"""The served reference workload (``wattline workload layoutlm-serve``, tiny, CPU, one torch
thread) as a real process, and its own metrics as a scrape reads them.
"""

from __future__ import annotations

import json
import re
import signal
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from procs import Proc
from prometheus_client.parser import text_string_to_metric_families
from waits import wait_until

SERVE = ["workload", "layoutlm-serve", "--size", "tiny", "--device", "cpu", "--threads", "1"]
MODEL = "layoutlm-tiny"


@dataclass(frozen=True)
class Counts:
    """One scrape of the service's counters."""

    ok: float
    error: float
    refused: float
    documents: float
    latency_count: float
    in_flight: float


class Served:
    """One ``layoutlm-serve`` process on loopback; ``port`` 0 takes a free one."""

    def __init__(self, log_path: Path, *args: str, port: int = 0) -> None:
        self.log_path = log_path
        log_path.write_text("")  # a restart's log is its own
        self.proc = Proc([*SERVE, "--host", "127.0.0.1", "--port", str(port), *args], log_path)
        self.url = wait_until(self._ready, lambda: f"the service ready; its log:\n{self.proc.log()[-3000:]}")
        self.port = int(self.url.rsplit(":", 1)[1])

    def _ready(self) -> str | None:
        assert self.proc.alive(), self.proc.log()[-3000:]
        found = re.search(r"^listening on (http://\S+)$", self.proc.log(), re.MULTILINE)
        return found.group(1) if found else None

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def health(self) -> str | None:
        """``/health``'s status, None when nothing answers."""
        try:
            return str(json.loads(self.get("/health")[1])["status"])
        except OSError:
            return None

    def counts(self) -> Counts:
        status, body = self.get("/metrics")
        assert status == 200, body
        values = {
            (s.name, s.labels.get("outcome", "")): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples
            if s.labels.get("model") == MODEL
        }
        return Counts(
            ok=values[("layoutlm_requests_total", "ok")],
            error=values[("layoutlm_requests_total", "error")],
            refused=values[("layoutlm_requests_total", "refused")],
            documents=values[("layoutlm_documents_total", "")],
            latency_count=values[("layoutlm_request_latency_seconds_count", "")],
            in_flight=values[("layoutlm_in_flight_requests", "")],
        )

    def stop(self) -> tuple[Counts, int]:
        """SIGTERM; its final counts, scraped while it lingers (it needs ``--linger``), and its exit status."""
        self.proc.process.send_signal(signal.SIGTERM)
        wait_until(lambda: self.health() == "stopped", lambda: f"the service stopped; its log:\n{self.proc.log()}")
        final = self.counts()
        return final, self.proc.process.wait(timeout=60)
