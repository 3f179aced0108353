"""What the readers of stores that show their newest data late ask for (issue #42, item 4):
VictoriaMetrics (as an operator starts it: its defaults) answers instant queries at the time
asked, not 30 s before, and a new series to a selector asked before it was searchable within
seconds; every Prometheus-API read asks Mimir for strong read consistency.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import time
from typing import Any, ClassVar

import pytest
from procs import CLI, clean_env
from servers import VictoriaMetrics, make_batch
from waits import wait_until

from wattline.collector.stores.influx_http import HttpClient
from wattline.collector.stores.series_api import Export
from wattline.collector.stores.victoria import VictoriaStore


def wattline(env: dict[str, str], *args: str) -> str:
    """The command's stdout; it exits 0 without a traceback."""
    out = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and "Traceback" not in out.stderr, (args, out.returncode, out.stderr[-3000:])
    return out.stdout


@pytest.mark.servers
def test_victoria_metrics_instant_queries_at_the_time_asked(victoria_metrics_defaults: VictoriaMetrics) -> None:
    """With its default 30 s latency offset, VictoriaMetrics 1.79 answers an instant query at a
    time less than 30 s ago as of 30 s ago, unless asked with ``nocache=1``: the last sample
    before now is the one a second ago, not none."""
    host = f"edge-{time.time_ns()}"
    t0 = time.time_ns() - 5 * 10**9
    with VictoriaStore(victoria_metrics_defaults.url) as vm:
        vm.write(make_batch(host=host, t0=t0, samples=4))  # samples end 1..4 s after t0
        wait_until(lambda: len(vm.samples(host, t0, t0 + 10**10)) == 4, "the samples searchable")
    api = Export(HttpClient(victoria_metrics_defaults.url), "", "VictoriaMetrics")
    edges = api.edges(f'energy_sub_ns{{host="{host}"}}', time.time_ns(), before=True, far_ns=3600 * 10**9)
    last = {labels["device"]: lo for labels, lo, _ in edges}
    ms = 10**6
    assert last == {"GPU-0": (t0 + 3 * 10**9) // ms * ms, "GPU-1": (t0 + 4 * 10**9) // ms * ms}, edges


#: How soon a new series written to VictoriaMetrics must show to a read asked for it from the
#: write on: its rows and its index entries are flushed every second (VictoriaMetrics issue
#: #2061), the reader's matcher names the second (at most one more), and a busy machine gets
#: two. Asked again and again through the same filters it showed 8 to 10 s after on 1.79.5.
NEW_SERIES_S = 5.0


@pytest.mark.servers
def test_victoria_metrics_new_series_show_to_a_selector_asked_before(
    victoria_metrics_defaults: VictoriaMetrics,
) -> None:
    """A job's events, read by its id from the moment they were written (as the collector's
    summary writer does): its close shows within NEW_SERIES_S."""
    job = f"new-{time.time_ns()}"
    with VictoriaStore(victoria_metrics_defaults.url) as vm:
        vm.write(make_batch(host="new-series", job_id=job, samples=1, t0=time.time_ns() - 4 * 10**9))
        written = time.monotonic()

        def closed_by_id() -> bool:
            return any(e.event == "close" for e in vm.job_events(job, every=False))

        wait_until(closed_by_id, "the close read by the job's id", timeout_s=30)
        assert time.monotonic() - written < NEW_SERIES_S


class Recorder(http.server.BaseHTTPRequestHandler):
    """A Prometheus query API that holds nothing, keeping each request's headers."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        Recorder.seen.append({"path": self.path.split("?")[0], **{k.lower(): v for k, v in self.headers.items()}})
        data: Any = {"resultType": "matrix", "result": []} if "/query" in self.path else []
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_prometheus_api_reads_ask_for_what_was_acknowledged() -> None:
    """Mimir's ingest storage answers a query from ingesters that may not have read the latest
    writes unless asked ``X-Read-Consistency: strong``, and its query-frontend from a cached
    answer unless ``Cache-Control: no-store``: every read of ``wattline jobs`` asks both."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        store = f"prometheus+http://127.0.0.1:{server.server_address[1]}"
        assert json.loads(wattline({**clean_env()}, "jobs", "--json", "--store", store)) == []
    finally:
        server.shutdown()
    reads = [r for r in Recorder.seen if r["path"].startswith("/api/v1/")]
    assert reads and all(
        (r.get("x-read-consistency"), r.get("cache-control")) == ("strong", "no-store") for r in reads
    ), reads
