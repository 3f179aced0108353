"""The served reference workload (``wattline workload layoutlm-serve``) and the stepped open-loop
load (``wattline workload load``): batching, the step plan, bad flags, and the real service
driven at 25, 50 and 100 % of its measured capacity on a powercap tree whose power follows the
load, restarted in the middle of a step.

The truth is constructed: the client counts every answer, the test steps the zone's power at
each window edge. The service's own counters must split the answers by window exactly, and a
restart must lose and double none of them. Needs the ``workloads`` extra (never skipped).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from procs import CLI, clean_env
from served_layoutlm import Counts, PowerFollowsLoad, Served
from waits import wait_until

from wattline.cli.main import main
from wattline.config import ConfigError
from wattline.workloads.reference.batcher import Batcher
from wattline.workloads.reference.stepped_load import (
    Step,
    StepSpec,
    Window,
    arrival_offsets,
    measure_capacity,
    parse_steps,
    run_steps,
)

# --- dynamic batching ------------------------------------------------------------------


def submit_all(batcher: Batcher, documents: list[int]) -> list[int]:
    """Submit each count from a thread of its own, in order; the batch sizes they ran in."""
    out = [0] * len(documents)

    def one(i: int) -> None:
        out[i] = batcher.submit(documents[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(documents))]
    for t in threads:
        t.start()
        time.sleep(0.01)  # arrival order is submission order
    for t in threads:
        t.join(10)
    return out


def test_requests_within_the_wait_run_as_one_batch_up_to_max_batch() -> None:
    ran: list[int] = []
    batcher = Batcher(ran.append, max_batch=8, max_wait_s=5.0)
    t0 = time.monotonic()
    got = submit_all(batcher, [3, 3, 2, 4, 4])
    batcher.close()
    assert ran == [8, 8]  # full batches leave at once, long before the wait; no request split
    assert got == [8, 8, 8, 8, 8]
    assert time.monotonic() - t0 < 4.0


def test_a_lone_request_waits_at_most_max_wait_and_flush_ends_the_wait() -> None:
    ran: list[int] = []
    batcher = Batcher(ran.append, max_batch=8, max_wait_s=0.2)
    t0 = time.monotonic()
    assert batcher.submit(1) == 1
    assert 0.15 < time.monotonic() - t0 < 2.0
    slow = Batcher(ran.append, max_batch=8, max_wait_s=60.0)
    waiting = threading.Thread(target=slow.submit, args=(2,))
    waiting.start()
    wait_until(lambda: slow.queued == 2, "the request queued")
    slow.flush()
    waiting.join(5)
    assert not waiting.is_alive() and ran == [1, 2]
    slow.close()
    with pytest.raises(RuntimeError):
        slow.submit(1)
    batcher.close()


def test_a_failed_batch_fails_each_of_its_requests_and_the_next_batch_runs() -> None:
    calls: list[int] = []

    def run(n: int) -> None:
        calls.append(n)
        if len(calls) == 1:
            raise RuntimeError("device lost")

    batcher = Batcher(run, max_batch=4, max_wait_s=0.0)
    with pytest.raises(RuntimeError, match="device lost"):
        batcher.submit(2)
    assert batcher.submit(3) == 3
    with pytest.raises(ValueError):
        batcher.submit(5)
    batcher.close()


# --- the step plan -----------------------------------------------------------------------


def test_steps_parse_as_rates_or_shares_of_capacity() -> None:
    specs = parse_steps("25%:30s, 50%:1m,40:2.5")
    assert specs == [StepSpec(25, True, 30), StepSpec(50, True, 60), StepSpec(40, False, 2.5)]
    assert [s.resolve(200.0) for s in specs] == [Step(50, 30), Step(100, 60), Step(40, 2.5)]
    with pytest.raises(ValueError):
        specs[0].resolve(None)
    for bad in ("25%", "fast:10s", "-5:10s", "10:0s", "10:soon", "", "nan%:1s"):
        with pytest.raises(ConfigError, match="option --steps"):
            parse_steps(bad)


def test_arrivals_are_seeded_and_at_the_rate() -> None:
    assert arrival_offsets(Step(10, 2), "fixed", random.Random(0)) == [i / 10 for i in range(20)]
    assert arrival_offsets(Step(0, 5), "poisson", random.Random(0)) == []
    a = arrival_offsets(Step(500, 10), "poisson", random.Random(7))
    assert a == arrival_offsets(Step(500, 10), "poisson", random.Random(7))
    assert abs(len(a) - 5000) < 5 * 5000**0.5 and a == sorted(a) and 0 < a[0] < a[-1] < 10


# --- bad flags ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["layoutlm-serve", "--max-batch", "0"], "option --max-batch: 0 must be > 0"),
        (["layoutlm-serve", "--port", "70000"], "option --port: 70000 is not 0..65535"),
        (["layoutlm-serve", "--size", "huge"], "option --size: 'huge' is not one of base, tiny"),
        (["layoutlm-serve", "--max-wait-ms", "-1"], "option --max-wait-ms: -1.0 must be >= 0"),
        (["layoutlm-serve", "--port", "http"], "Invalid value for '--port'"),
        (["load", "--url", "ftp://h/infer", "--steps", "10:1s"], "option --url: 'ftp://h/infer' is not an http"),
        (["load", "--url", "http://127.0.0.1:9/infer", "--steps", "25%:soon"], "option --steps: invalid duration"),
        (["load", "--url", "http://127.0.0.1:9/infer", "--steps", "9:1s", "--arrivals", "burst"], "option --arrivals"),
        (["load", "--url", "http://127.0.0.1:9/infer", "--steps", "9:1s", "--documents", "0"], "option --documents"),
        (["load", "--url", "http://127.0.0.1:9/infer"], "Missing option '--steps'"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    argv: list[str], text: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["wattline", "workload", *argv])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    assert exit_.value.code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wattline: error: ") and text in lines[0], err
    assert out == ""


# --- the real service ----------------------------------------------------------------------


def window_counts(before: Counts, after: Counts) -> dict[str, float]:
    return {
        "ok": after.ok - before.ok,
        "documents": after.documents - before.documents,
        "latency_count": after.latency_count - before.latency_count,
        "error": after.error - before.error,
    }


def answered(w: Window) -> dict[str, float]:
    return {"ok": w.answered, "documents": w.documents, "latency_count": w.answered, "error": 0}


def test_served_under_stepped_load_counts_every_window_exactly_through_a_restart(tmp_path: Path) -> None:
    """25 %, 50 % and 100 % of the measured capacity; the service restarted (SIGTERM, then a new
    process on the same port) early in the 50 % step. Per window, the service's counter deltas
    equal the client's answers, the two processes' together in the restart's window; J per
    request from the zone's counter and the service's counts is within 1 % of the truth."""
    server = Served(tmp_path / "serve-1.log", "--linger", "0.5")
    capacity = measure_capacity(server.url + "/infer", max_concurrency=16, step_seconds=0.5)
    assert capacity.rps > 0 and [c for c, _ in capacity.history][:2] == [1, 2]
    steps = [Step(capacity.rps * share, seconds) for share, seconds in ((0.25, 4), (0.5, 10), (1.0, 4))]
    power = PowerFollowsLoad(tmp_path / "tree", steps)
    scrapes: list[Counts] = []  # at each edge, of the process serving then
    restarted = threading.Event()
    serving = [server]

    def on_edge(index: int) -> None:
        if index == 2:
            restarted.wait(90)  # a restart slower than the step ends it
        scrapes.append(serving[-1].counts())
        power.on_edge(index)

    result: list[list[Window]] = []
    load = threading.Thread(
        target=lambda: result.append(run_steps(server.url + "/infer", steps, seed=1, on_edge=on_edge))
    )
    load.start()
    try:
        wait_until(lambda: len(power.edges_ns) >= 2, "the 50 % step started")
        time.sleep(1.5)
        first_final, status = server.stop()
        assert status == 0
        serving.append(Served(tmp_path / "serve-2.log", "--linger", "0.5", port=server.port))
        restarted.set()
        load.join(120)
        assert result, "the load did not finish"
    finally:
        restarted.set()
        power.close()
    windows = result[0]
    assert len(scrapes) == 4 and len(power.edges_ns) == 4
    served = [window_counts(scrapes[0], scrapes[1]), {}, window_counts(scrapes[2], scrapes[3])]
    # the restart's window: the first process from the edge to its last count, the second from zero
    before = window_counts(scrapes[1], first_final)
    after = window_counts(Counts(0, 0, 0, 0, 0, 0), scrapes[2])
    served[1] = {k: before[k] + after[k] for k in before}
    for w, counted in zip(windows, served, strict=True):
        assert counted == answered(w), (w.index, counted, w)
        assert w.sent == w.answered + sum(w.errors.values())
    assert before["ok"] > 0 and windows[1].errors, "the restart fell in the 50 % step and cost it requests"
    # refused (503) while stopping, or no connection while down: never a failed inference
    assert set(windows[1].errors) <= {"503", "ConnectionRefusedError", "ConnectionResetError", "RemoteDisconnected",
                                      "BrokenPipeError"}, windows[1].errors  # fmt: skip
    assert not windows[0].errors and not windows[2].errors and windows[2].answered > 0
    # J per request per window: the zone's energy over the service's count, against the truth
    assert power.watts[:3] == [20.0 + 0.1 * s.rate_rps for s in steps]
    for i, w in enumerate(windows):
        assert power.read_j(i) / served[i]["ok"] == pytest.approx(power.truth_j(i) / w.answered, rel=0.01), i
    second_final, status = serving[-1].stop()
    assert status == 0 and second_final.ok == scrapes[3].ok
    assert f"stopped: {second_final.ok:g} requests answered" in serving[-1].proc.log()


def test_sigterm_answers_the_requests_in_flight_then_refuses(tmp_path: Path) -> None:
    """Requests held by a long batch wait are answered at once on SIGTERM; one that arrives
    after is refused (503, counted); /metrics stays up while it lingers."""
    server = Served(tmp_path / "serve.log", "--max-wait-ms", "60000", "--linger", "30")
    status_of: dict[int, tuple[int, dict[str, int]]] = {}

    def post(i: int) -> None:
        request = urllib.request.Request(server.url + "/infer", data=json.dumps({"documents": 2}).encode())
        with urllib.request.urlopen(request, timeout=60) as response:
            status_of[i] = response.status, json.loads(response.read())

    clients = [threading.Thread(target=post, args=(i,)) for i in range(3)]
    for c in clients:
        c.start()
    wait_until(lambda: server.counts().in_flight == 3, "three requests in flight")
    t0 = time.monotonic()
    server.proc.process.send_signal(signal.SIGTERM)
    for c in clients:
        c.join(30)
    assert time.monotonic() - t0 < 20
    assert status_of == {i: (200, {"documents": 2, "predictions": 128, "batch": 6}) for i in range(3)}
    wait_until(lambda: server.health() == "stopped", "stopped")
    late = urllib.request.Request(server.url + "/infer", data=b"")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(late, timeout=10)
    assert refused.value.code == 503 and refused.value.headers["Connection"] == "close"
    counts = server.counts()
    assert (counts.ok, counts.documents, counts.latency_count, counts.refused, counts.in_flight) == (3, 6, 3, 1, 0)
    server.proc.kill9()


def test_load_command_reports_each_window(tmp_path: Path) -> None:
    """``wattline workload load --json`` against a running service: the windows' answers are
    what the service counted."""
    server = Served(tmp_path / "serve.log")
    before = server.counts()
    argv = ["workload", "load", "--url", server.url + "/infer", "--steps", "20:1s,40:1s", "--arrivals", "fixed"]
    proc = subprocess.run([*CLI, *argv, "--json"], capture_output=True, text=True, timeout=60, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    after = server.counts()
    server.proc.terminate()
    assert result["schema"] == "wattline.load/1" and result["capacity_rps"] is None
    assert [(w["rate_rps"], w["sent"], w["answered"]) for w in result["windows"]] == [(20, 20, 20), (40, 40, 40)]
    assert after.ok - before.ok == 60 and Counter(w["latency_ms"]["count"] for w in result["windows"]) == {20: 1, 40: 1}
