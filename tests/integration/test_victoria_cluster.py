"""A VictoriaMetrics cluster's path forms and ``--tenant`` (issue #30). The cluster's vminsert
serves ``/insert/<tenant>/influx/write`` and vmselect ``/select/<tenant>/prometheus/api/v1/…``
and ``/delete/<tenant>/prometheus/api/v1/admin/tsdb/delete_series``: the single node's APIs
under those prefixes. A prefix-routing proxy (as vmauth routes them) stands in front of the
single node here; it forwards only those prefixes, for one tenant, so a request that forgot
its prefix or named another tenant fails. What a store writes through it, the single node read
directly gives back, and ``wattline report`` reads the same from both URLs.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from procs import CLI, Proc, clean_env, start_collector
from servers import T0, VictoriaMetrics, free_port, make_batch, searchable
from test_dead_holder import BATCH_S, EQUAL_ENV, POWER_W, cli, tree
from test_store_victoria import shown
from waits import wait_sampled, wait_until

from wattline.stores.base import JobSummary
from wattline.stores.prometheus.store import PrometheusStore
from wattline.stores.sqlite.store import SqliteStore
from wattline.stores.victoria.store import VictoriaStore

__all__ = ["tree"]  # the fixture, imported for pytest

TENANT = "7:3"
#: A route: the path it takes (its ``rest`` is forwarded, and its ``tenant`` is the request's,
#: else the ``X-Scope-OrgID`` header is), the method, and the upstream's path when not ``rest``.
Route = tuple[re.Pattern[str], str, str | None]
#: The cluster's prefix -> the single node's path it stands for.
ROUTES: dict[str, Route] = {
    "insert": (re.compile(r"/insert/(?P<tenant>[^/]+)/influx(?P<rest>/write(\?.*)?)$"), "POST", None),
    "select": (re.compile(r"/select/(?P<tenant>[^/]+)/prometheus(?P<rest>/api/v1/[a-z_/]+(\?.*)?)$"), "GET", None),
    "delete": (
        re.compile(r"/delete/(?P<tenant>[^/]+)/prometheus(?P<rest>/api/v1/admin/tsdb/delete_series(\?.*)?)$"),
        "POST",
        None,
    ),
}


class PrefixProxy:
    """Forwards the paths of ``routes`` for ``tenant`` to ``upstream`` (by default the cluster's
    tenant paths of :data:`TENANT` to a single node); counts each route taken, and answers
    anything else 404 (counted as ``unrouted``)."""

    def __init__(self, upstream: str, routes: dict[str, Route] = ROUTES, tenant: str = TENANT) -> None:
        self.seen: Counter[str] = Counter()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.forward()

            def do_POST(self) -> None:
                self.forward()

            def forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                for name, (pattern, method, target) in routes.items():
                    match = pattern.match(self.path)
                    asked = match and (match.groupdict().get("tenant") or self.headers.get("X-Scope-OrgID"))
                    if match and asked == tenant and self.command == method:
                        proxy.seen[name] += 1
                        status, data = proxy.send(
                            self.command, upstream + (target or match["rest"]), body, self.headers
                        )
                        break
                else:
                    proxy.seen["unrouted"] += 1
                    status, data = 404, f"no route for {self.command} {self.path}".encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def send(method: str, url: str, body: bytes | None, headers: Any) -> tuple[int, bytes]:
        kept = {k: v for k, v in headers.items() if k.lower() in ("content-type", "content-encoding")}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, body, kept, method=method), timeout=30) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(victoria_metrics: VictoriaMetrics) -> Iterator[PrefixProxy]:
    routed = PrefixProxy(victoria_metrics.url)
    yield routed
    routed.close()


@pytest.mark.servers
def test_a_store_through_the_cluster_paths_reads_what_the_node_holds(
    tmp_path: Path, proxy: PrefixProxy, victoria_metrics: VictoriaMetrics
) -> None:
    batch = make_batch(host="cl-reads", job_id="cl-reads-job", samples=6)
    fields = {"status": "closed", "closed": True, "energy_j": 12.5, "start_ns": T0, "schema": "wattline.job_summary/1"}
    summary = JobSummary("cl-reads-job", T0, {"name": "n"}, fields, {"cl-reads": 12.5})
    with (
        VictoriaStore(proxy.url, tenant=TENANT) as cluster,
        VictoriaStore(victoria_metrics.url) as node,
        SqliteStore(tmp_path / "w.db") as sqlite,
    ):
        assert cluster.write(batch).written == sqlite.write(batch).written == 10
        first = JobSummary(summary.job_id, T0, summary.tags, {**fields, "energy_j": 99.0}, {})
        cluster.write_summary(first)
        shown(node, first)
        cluster.write_summary(summary)  # a rewrite: delete, then write
        shown(node, summary)
        wait_until(
            lambda: len(node.job_events("cl-reads-job")) == len(sqlite.job_events("cl-reads-job")),
            "the batch's job events searchable",
        )
        for store in (cluster, node):
            assert store.job_events("cl-reads-job") == sqlite.job_events("cl-reads-job")
            assert store.samples("cl-reads", T0, T0 + 4 * 10**9) == sqlite.samples("cl-reads", T0, T0 + 4 * 10**9)
            assert store.job_summary("cl-reads-job") == summary
    assert proxy.seen["insert"] >= 3 and proxy.seen["select"] >= 3 and proxy.seen["delete"] == 2
    assert proxy.seen["unrouted"] == 0


@pytest.mark.servers
def test_collector_and_reports_with_a_tenant(
    tmp_path: Path, tree: Any, proxy: PrefixProxy, victoria_metrics: VictoriaMetrics
) -> None:
    """`wattline collector --store PROXY --tenant 7:3` writes a job and its summary;
    `wattline report --store PROXY --tenant 7:3` and the single node's URL read the same."""
    with VictoriaStore(victoria_metrics.url) as node:
        collector_and_reports(
            tmp_path, tree, ["--store", proxy.url, "--tenant", TENANT], node, lambda: searchable(victoria_metrics.url)
        )
    assert proxy.seen["unrouted"] == 0 and proxy.seen["insert"] > 0 and proxy.seen["delete"] > 0


def collector_and_reports(
    tmp_path: Path, tree: Any, where: list[str], node: VictoriaStore | PrometheusStore, flush: Callable[[], None]
) -> None:
    """A collector writing to the store ``where`` names, an agent and a job run through it; its
    summary converges, and `wattline report --json` through ``where`` and straight from the
    engine (``node``'s URL) read the same figures (all by rule "equal", as :func:`cli`)."""
    host = "cluster-host"
    port = free_port()
    collector = start_collector(port, where, tmp_path / "collector.log", env=EQUAL_ENV)
    started = time.time_ns()  # the engine is the session's: samples of this host from before may be there
    agent = Proc(
        ["agent", "--host-id", host, "--sysfs-root", str(tree.root), "--source", "rapl",
         "--batch-interval", str(BATCH_S), f"--collector=127.0.0.1:{port}"],
        tmp_path / "agent.log",
    )  # fmt: skip
    try:
        wait_sampled(node, host, started, refresh=flush)  # the agent's first batches: samples before the job opens
        cli(tmp_path, "run", "--job-id", "cl-job", "--no-report", "--host-id", host,
            f"--collector=127.0.0.1:{port}", *where, "--", "sleep", "3")  # fmt: skip

        def closed_summary() -> JobSummary | None:
            flush()
            found = node.job_summary("cl-job")
            return found if found is not None and found.fields["status"] == "closed" else None

        found = wait_until(closed_summary, "a closed summary of cl-job")
        closed = max(e.time_ns for e in node.job_events("cl-job") if e.event == "close")
        wait_sampled(node, host, closed, refresh=flush)  # samples up to the stored close
    finally:
        agent.terminate()
        collector.terminate()
    flush()
    via_cluster = json.loads(cli(tmp_path, "report", "cl-job", "--json", *where).stdout)
    via_node = json.loads(cli(tmp_path, "report", "cl-job", "--json", "--store", node.url).stdout)
    assert via_cluster == via_node
    assert via_cluster["job"]["status"] == "closed"
    assert via_cluster["whole_run"]["mean_power_w"] == pytest.approx(POWER_W, rel=0.05)  # the tree's power
    assert found.fields["energy_j"] == pytest.approx(via_cluster["measured"]["energy_j"], rel=1e-9)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--store", "http://127.0.0.1:9", "--tenant", "acme"], "--tenant: 'acme' is not ACCOUNT or ACCOUNT:PROJECT"),
        (["--store", "http://127.0.0.1:9", "--tenant", "1:2:3"], "is not ACCOUNT or ACCOUNT:PROJECT"),
        (["--store", "http://127.0.0.1:9", "--tenant", str(2**32)], "numbers below 2^32"),
        (["--store", "sqlite:///nowhere.db", "--tenant", "1"], "is for a VictoriaMetrics cluster at an http(s) URL"),
        (["--store", "prometheus+http://127.0.0.1:9", "--tenant", "a b"], "--tenant: 'a b' is not a tenant id"),
        (["--store", "prometheus+http://127.0.0.1:9", "--tenant", ".."], "is not a tenant id"),
        (["--store", "prometheus+http://127.0.0.1:9?read=x"], "the one URL parameter is write=PATH or write=URL"),
    ],
)
def test_a_bad_tenant_or_store_url_is_one_line(tmp_path: Path, args: list[str], said: str) -> None:
    out = subprocess.run([*CLI, "jobs", *args], capture_output=True, text=True, timeout=60, env=clean_env())
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert said in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
