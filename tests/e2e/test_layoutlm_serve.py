"""The served reference workload (``wattline workload layoutlm-serve``) and the stepped open-loop
load (``wattline workload load``): batching, the step plan, bad flags, a graceful stop, and the
load command's windows. The service measured by wattline at 25, 50 and 100 % of its capacity on a
powercap tree whose power follows the load, restarted in the middle of a step, is
tests/e2e/test_service_windows.py. Needs the ``workloads`` extra (never skipped).
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
from served_layoutlm import Served
from waits import wait_until

from wattline.cli.main import main
from wattline.config import ConfigError
from wattline.reference.batcher import Batcher
from wattline.reference.stepped_load import (
    Step,
    StepSpec,
    arrival_offsets,
    parse_steps,
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
