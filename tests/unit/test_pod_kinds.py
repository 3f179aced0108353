"""An annotated pod's service counts what a wrapped one does (issue #44): every unit kind of its
preset per model, its latency histograms bucket by bucket, and the requests served just before
its pod is deleted (a last scrape before the close).

The truths are the test's: a vLLM-shaped endpoint whose counters this test advances (two models'
requests, prompt and generation tokens: tests/integration/test_unit_kinds.py's steps) and whose e2e latency
histogram it fills with known latencies (tests/e2e/test_served_latency.py's steps), served to the pod
watcher as the pod ``wattline.io/preset: vllm`` on the fake kubelet's list
(tests/e2e/test_kube_services.py). The watcher is driven look by look; its events go to SQLite and
``wattline report POD-JOB --json`` must give each model's tokens exactly as the test counted them,
every request (those finished between the last look and the delete too), and p50/p99 in the
bucket of the test's true quantile, interpolated as histogram_quantile does on the known counts.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from schema_check import schema_errors
from test_kube_services import JOB, NODE, T0, Kubelet, kubelet_pki, node, service_pod, watcher
from test_served_latency import LLAMA, STEP_A, STEP_B, STEP_C, check, histogram_lines, merged
from test_unit_kinds import MODELS, STEPS, Vllm
from typer.testing import CliRunner

from wattline import wire
from wattline.agent.holders.kube.event_places import seq_base
from wattline.agent.holders.kube.pod_units import endpoint_of
from wattline.agent.holders.kube.settings import KubeSettings
from wattline.cli.main import app
from wattline.served_series import fixed_sender
from wattline.stores.sqlite.store import SqliteStore

__all__ = ["kubelet_pki", "node"]  # the fake kubelet's fixtures, used here

S = 10**9
Kind = wire.pb.JobEvent
#: Each look's latencies, beside :data:`STEPS`' counts (the last look's brings Qwen's first).
LATENCIES = [STEP_A, STEP_B, STEP_C]
#: Served after the last look, just before the delete: (stop, length, prompt, generated), latencies.
LAST = {MODELS[0]: (2, 1, 260, 910)}
LAST_LATENCIES = {LLAMA: [0.7, 0.7, 1.5]}


class VllmServer(Vllm):
    """tests/integration/test_unit_kinds.py's vLLM endpoint with its e2e latency histogram too."""

    def __init__(self) -> None:
        super().__init__()
        self.latencies: dict[str, list[float]] = {}
        self.created = time.time()

    def observe(self, values: dict[str, list[float]]) -> None:
        with self.lock:
            for model, latencies in values.items():
                self.latencies.setdefault(model, []).extend(latencies)

    def text(self) -> str:
        counters = super().text()
        with self.lock:
            return counters + "\n".join(histogram_lines(self.latencies, self.created)) + "\n"


@pytest.fixture
def vllm() -> Iterator[VllmServer]:
    server = VllmServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def truth(steps: list[dict[str, tuple[int, int, int, int]]]) -> tuple[int, dict[tuple[str, str], int]]:
    """(requests, (kind, model) -> tokens) that ``steps`` add up to."""
    requests = sum(c[0] + c[1] for step in steps for c in step.values())
    tokens: dict[tuple[str, str], int] = {}
    for step in steps:
        for model, (_stop, _length, prompt, generated) in step.items():
            for kind, n in (("input_tokens", prompt), ("output_tokens", generated)):
                tokens[kind, model] = tokens.get((kind, model), 0) + n
    return requests, tokens


def report(events: list[wire.pb.JobEvent], db: Path, job: str = JOB, host: str = NODE) -> dict[str, Any]:
    """``wattline report JOB --json`` on a SQLite store holding a watcher's ``events`` from ``host``."""
    with SqliteStore(db) as store:
        batch = wire.Batch(stream_id="agent", seq=1, sent_ns=T0)
        batch.host.host_id = host
        batch.job_events.extend(events)
        assert store.write(batch).rejected == 0
    result = CliRunner().invoke(app, ["report", job, "--store", f"sqlite:///{db}", "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    assert schema_errors("report", data) == []
    return data


def serve_looks(vllm: VllmServer, kubelet: Kubelet, settings: KubeSettings, root: Path) -> tuple[Any, list[Any]]:
    """The pod seen pending, then running from T0 + 2 s; each step served, then a look (5 s apart)."""
    pod = {"wattline.io/preset": "vllm", "wattline.io/metrics": f"{vllm.server_address[1]}/metrics"}
    sent: list[wire.pb.JobEvent] = []
    w = watcher(settings, root, sent)
    kubelet.items = [service_pod(pod, None)]
    w.poll(T0)
    kubelet.items = [service_pod(pod, T0 + 2 * S)]
    for i, (step, latencies) in enumerate(zip(STEPS, LATENCIES, strict=True)):
        vllm.step(step)
        vllm.observe(latencies)
        w.poll(T0 + (5 + 5 * i) * S)
    return w, sent


def test_an_annotated_vllm_pod_counts_each_model_s_tokens_its_latency_and_its_last_requests(
    node: tuple[Kubelet, KubeSettings], vllm: VllmServer, tmp_path: Path
) -> None:
    kubelet, settings = node
    w, sent = serve_looks(vllm, kubelet, settings, tmp_path / "host")
    vllm.step(LAST)
    vllm.observe(LAST_LATENCIES)
    kubelet.items = []  # deleted: its last requests count at the last scrape, before the close
    w.poll(T0 + 20 * S)

    [close] = [e for e in sent if e.kind == Kind.KIND_CLOSE]
    assert close.time_ns == T0 + 20 * S
    own = [e for e in sent if e.kind == Kind.KIND_UNITS and not e.unit]
    assert [(e.time_ns, e.units) for e in own][-1] == (T0 + 20 * S, sum(LAST[MODELS[0]][:2]))
    assert all(e.event_seq != close.event_seq for e in sent if e.kind == Kind.KIND_UNITS)
    requests, tokens = truth([*STEPS, LAST])
    r = report(sent, tmp_path / "w.db")
    assert r["job"]["unit"] == "requests" and r["units"]["total"] == requests
    kinds = {(k["name"], k["labels"]["model_name"]): k["units"] for k in r["unit_kinds"]}
    assert kinds == tokens and all(k["units_bound"] == 0 for k in r["unit_kinds"])
    check(r["latency"], merged(*LATENCIES, LAST_LATENCIES), "pod's whole run")


def test_a_pod_whose_server_is_gone_at_its_delete_says_so_and_its_job_still_closes(
    node: tuple[Kubelet, KubeSettings], vllm: VllmServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The last scrape refused (the server went first): one line, the close as without it, and
    what the earlier looks counted stays exactly what was served up to the last good one."""
    kubelet, settings = node
    w, sent = serve_looks(vllm, kubelet, settings, tmp_path / "host")
    vllm.step(LAST)  # served, but never scraped: lost, and said
    vllm.shutdown()
    vllm.server_close()
    kubelet.items = []
    w.poll(T0 + 20 * S)

    [close] = [e for e in sent if e.kind == Kind.KIND_CLOSE]
    assert close.time_ns == T0 + 20 * S
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "last scrape failed" in lines[0] and "not counted" in lines[0], lines
    requests, tokens = truth(STEPS)
    r = report(sent, tmp_path / "w.db")
    assert r["units"]["total"] == requests
    assert {(k["name"], k["labels"]["model_name"]): k["units"] for k in r["unit_kinds"]} == tokens
    check(r["latency"], merged(*LATENCIES), "pod's looks")


def test_a_count_annotation_names_several_unit_kinds_one_a_line() -> None:
    """``wattline.io/count`` takes specs one a line (the first the job's unit); a kind named twice
    is a bad annotation (one line: a service without units); a preset names all its units and
    its latency histogram."""
    where = {"wattline.io/metrics": "8000"}
    endpoint = endpoint_of({"wattline.io/count": "requests=a_total\ntokens=b_total by model\n", **where})
    assert endpoint is not None and [s.name for s in endpoint.specs] == ["requests", "tokens"]
    assert endpoint.spec.name == "requests" and endpoint.latencies == ()
    with pytest.raises(ValueError, match="named twice") as bad:
        endpoint_of({"wattline.io/count": "requests=a_total\nrequests=b_total", **where})
    assert "\n" not in str(bad.value)
    vllm = endpoint_of({"wattline.io/preset": "vllm", **where})
    assert vllm is not None and [s.name for s in vllm.specs] == ["requests", "input_tokens", "output_tokens"]
    assert [s.name for s in vllm.latencies] == ["e2e"]


def test_a_series_events_identity_is_fixed_by_the_series_and_apart_from_the_job_s() -> None:
    """A restarted agent's sender numbers a series' events as the first did (the stores keep one
    copy); two series, and the job's own block, never share a block."""
    events: list[wire.pb.JobEvent] = []
    base = seq_base(JOB, NODE)
    first, again = (fixed_sender("k8s", JOB, NODE, base, events.append) for _ in range(2))
    for sender in (first, again):
        sender("output_tokens", {"model_name": MODELS[0]})(5.0, T0, 7)
    first("output_tokens", {"model_name": MODELS[1]})(5.0, T0, 7)
    first("input_tokens", {"model_name": MODELS[0]})(5.0, T0, 7)
    seqs = [e.event_seq for e in events]
    assert seqs[0] == seqs[1] and len({*seqs[1:], base | 7}) == 4
    assert all(s & 0xFFFFFFFF == 7 for s in seqs) and events[0].unit_labels == {"model_name": MODELS[0]}
