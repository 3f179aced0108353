"""``wattline run --metrics``: a command that serves, its units counted from its server's own
Prometheus metrics as it serves (issue #44, the holder's side).

The truths are the test's: a client that counts every answered request (the reference service,
``wattline workload layoutlm-serve``, tiny, on CPU), and a powercap zone at a known power. Through
the CLI into the embedded SQLite store, the job's stored units must equal the answered requests
exactly, across a restart of the server inside the wrapped command too; bad input is one line.
The holder's rules (when a reading's units are sent, what is said) are tested on canned scrapes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from procs import CLI, clean_env
from prometheus_client.parser import text_string_to_metric_families
from served_layoutlm import SERVE
from servers import free_port, http
from sysfs_trees import PowerAdvancer, Zone, powercap_tree
from waits import wait_until

from wattline import wire
from wattline.jobs.events import EventBuilder, JobSpec, UnitAccumulator
from wattline.jobs.wrappers.run import JobRunner, RunRequest
from wattline.jobs.wrappers.served import ServedHolder, ServedUnits, served_units
from wattline.reference.stepped_load import Step, Window, run_steps
from wattline.served_scrape import ScrapeError
from wattline.served_specs import parse_unit

HERE = Path(__file__).parents[1]  # tests/
FIXTURES = HERE / "fixtures" / "served_metrics"
ZONE = "intel-rapl:0"
WATTS = 50.0
HOST = "served-host"
COUNT = 'requests=layoutlm_requests_total{outcome="ok"}'
#: The job is alone on its host: it is charged the host, so its energy is the zone's.
ALONE = ["--share-rule", "exclusive"]


@dataclass
class Wrapped:
    """``wattline run`` around a command that serves on 127.0.0.1:``port``, its output in a log."""

    process: subprocess.Popen[bytes]
    log_path: Path
    port: int
    store: str
    started: float  #: monotonic, before the wrapper started

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> str | None:
        """The server's ``/health`` status, None when nothing answers."""
        try:
            status, body = http("GET", f"http://127.0.0.1:{self.port}/health", timeout_s=5)
        except OSError:
            return None
        return str(json.loads(body)["status"]) if body.startswith(b"{") else f"HTTP {status}"

    def serving(self) -> bool:
        assert self.process.poll() is None, self.log()[-3000:]
        return self.health() == "serving"

    def stop(self) -> int:
        """SIGTERM to the wrapper (forwarded to the command); its exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def report(self, job_id: str) -> dict[str, Any]:
        out = subprocess.run(
            [*CLI, "report", job_id, "--json", "--store", self.store, *ALONE],
            capture_output=True, text=True, timeout=60, env=clean_env(),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout))


@pytest.fixture
def zone(tmp_path: Path) -> Iterator[Path]:
    """A RAPL package zone drawing :data:`WATTS` from now on; the tree's root."""
    root = powercap_tree(tmp_path / "host", [Zone(ZONE, "package-0")])
    powered = PowerAdvancer(root, {ZONE: WATTS})
    yield root
    powered.close()


@pytest.fixture
def wrap(tmp_path: Path, zone: Path) -> Iterator[Callable[..., Wrapped]]:
    """Starts ``wattline run --metrics`` of the server on a port, sampling :func:`zone`:
    ``wrap(job_id, port, *args)``, ``args`` run's options, ``--`` and the command. A wrapper a
    failed test left running is stopped (SIGTERM: its command's group gets it too)."""
    started: list[Wrapped] = []
    store = f"sqlite:///{tmp_path / 'w.db'}"
    sampling = ["--sysfs-root", str(zone), "--source", "rapl", "--interval", "1", "--host-id", HOST]

    def start(job_id: str, port: int, *args: str) -> Wrapped:
        log_path = tmp_path / f"{job_id}.log"
        argv = [*CLI, "run", "--job-id", job_id, "--store", store, "--no-report", *sampling, *args]
        began = time.monotonic()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=clean_env()
            )
        started.append(Wrapped(process, log_path, port, store, began))
        return started[-1]

    yield start
    for job in started:
        if job.process.poll() is None:
            job.process.send_signal(signal.SIGTERM)
            try:
                job.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                job.process.kill()


def serve(port: int, linger_s: float) -> list[str]:
    return [*CLI, *SERVE, "--host", "127.0.0.1", "--port", str(port), "--linger", str(linger_s)]


def metrics(port: int) -> list[str]:
    return ["--metrics", f"http://127.0.0.1:{port}/metrics", "--count", COUNT, "--units", "requests"]


def answered(windows: list[Window]) -> int:
    return sum(w.answered for w in windows)


# --- the real service, through the CLI ------------------------------------------------------------


def test_a_served_jobs_units_are_the_requests_answered_and_its_energy_is_per_request(
    wrap: Callable[..., Wrapped],
) -> None:
    """Requests at two rates; then SIGTERM to the wrapper: the server answers what it admitted,
    keeps /metrics up 3 s for the last scrapes, and the job closes with every answered request
    counted, its energy the zone's over its window, J per request that energy over the answers."""
    port = free_port()
    job = wrap("served", port, *metrics(port), "--service", *ALONE, "--", *serve(port, 3))
    wait_until(job.serving, lambda: f"the server serving; the log:\n{job.log()[-3000:]}")
    serving = time.monotonic()
    windows = run_steps(f"http://127.0.0.1:{port}/infer", [Step(15, 1.5), Step(40, 1.5)], seed=3)
    stopped = time.monotonic()
    assert job.stop() == 0, job.log()[-3000:]
    ended = time.monotonic()
    truth = answered(windows)
    assert truth > 40 and not any(w.errors for w in windows), windows
    report = job.report("served")
    assert report["units"]["total"] == truth
    assert report["job"]["unit"] == "requests" and report["job"]["exit_code"] == 0
    whole = report["whole_run"]
    # the job's window holds the serving and lies within the wrapper's life
    assert WATTS * (stopped - serving) < whole["energy_j"] < WATTS * (ended - job.started)
    assert whole["j_per_unit"] == pytest.approx(whole["energy_j"] / truth, rel=1e-9)
    summary = f"wattline: {truth} requests counted from http://127.0.0.1:{port}/metrics ("
    assert [line for line in job.log().splitlines() if line.startswith(summary)], job.log()[-3000:]


def test_a_server_restarted_inside_the_command_loses_and_doubles_no_request(
    tmp_path: Path, wrap: Callable[..., Wrapped]
) -> None:
    """The command is a supervisor that restarts its server (same port) on SIGUSR1, in the middle
    of a steady load: the new server's counters start from 0 again; the job counts every request
    either answered, and none twice."""
    port = free_port()
    pidfile = tmp_path / "supervisor.pid"
    supervisor = [*CLI[:1], str(HERE / "helpers" / "served_supervisor.py"), str(pidfile), *serve(port, 1.5)]
    job = wrap("restarted", port, *metrics(port), "--scrape-every", "0.5s", "--", *supervisor)
    wait_until(job.serving, lambda: f"the server serving; the log:\n{job.log()[-3000:]}")
    restarted = threading.Event()

    def on_edge(index: int) -> None:
        if index == 2:
            restarted.wait(90)  # the last step goes to the new server

    result: list[list[Window]] = []
    steps = [Step(20, 1.0), Step(20, 1.0), Step(20, 1.0)]
    load = threading.Thread(
        target=lambda: result.append(run_steps(f"http://127.0.0.1:{port}/infer", steps, seed=5, on_edge=on_edge))
    )
    load.start()
    try:
        time.sleep(1.5)  # in the middle step
        os.kill(int(pidfile.read_text()), signal.SIGUSR1)
        wait_until(lambda: job.health() != "serving", "the first server stopping")
        wait_until(job.serving, lambda: f"the second server serving; the log:\n{job.log()[-3000:]}", timeout_s=60)
        restarted.set()
        load.join(60)
    finally:
        restarted.set()
    assert result, "the load did not finish"
    assert job.stop() == 0, job.log()[-3000:]
    windows = result[0]
    truth = answered(windows)
    assert windows[0].answered and windows[2].answered and windows[1].errors, windows
    assert "supervisor: restarting" in job.log()
    assert job.report("restarted")["units"]["total"] == truth, job.log()[-3000:]


# --- bad input: one line, and the command still runs ----------------------------------------------


#: Nothing listens on port 9 (discard) of loopback.
NOWHERE = "http://127.0.0.1:9/metrics"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--count", "requests=x_total{outcome=ok}"], "option --count: unit spec 'requests=x_total{outcome=ok}': expected LABEL OP"),
        (["--count", "Requests=x_total"], "option --count: unit spec 'Requests=x_total': NAME must be a short name"),
        (["--count", COUNT, "--units-from-stdout", "done"], "options --metrics and --units-from-stdout both count"),
        (["--count", COUNT, "--preset", "vllm"], "options --count and --preset both say what to count"),
        (["--count", COUNT, "--units", "documents"], "option --units: 'documents' differs from --count's unit 'requests'"),
        (["--preset", "vllm", "--units", "documents"], "option --units: preset vllm counts requests, input_tokens, output_tokens, not 'documents'"),
        (["--preset", "ollama"], "option --preset: no preset 'ollama': known are vllm, triton, tgi, torchserve"),
        ([], "option --metrics needs --count SPEC or --preset NAME"),
        (["--count", COUNT, "--scrape-every", "0s"], "option --scrape-every: 0s is under 0.1 s"),
        (["--count", COUNT, "--scrape-every", "often"], "option --scrape-every: invalid duration 'often'"),
    ],
)  # fmt: skip
def test_bad_served_options_are_one_line_and_exit_2_before_the_command_starts(
    tmp_path: Path, args: list[str], said: str
) -> None:
    bad_run(tmp_path, ["--metrics", NOWHERE, *args], said)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--metrics", "ftp://127.0.0.1/metrics", "--count", COUNT], "option --metrics: 'ftp://127.0.0.1/metrics' is not an http or https URL"),
        (["--count", COUNT], "option --count needs --metrics URL"),
        (["--scrape-every", "2s"], "option --scrape-every needs --metrics URL"),
    ],
)  # fmt: skip
def test_a_bad_or_missing_metrics_url_is_one_line_and_exit_2(tmp_path: Path, args: list[str], said: str) -> None:
    bad_run(tmp_path, args, said)


def bad_run(tmp_path: Path, args: list[str], said: str) -> None:
    """``wattline run ARGS -- touch ran``: exit 2, ``said`` in one line, nothing run or stored."""
    out = subprocess.run(
        [*CLI, "run", "--store", f"sqlite:///{tmp_path / 'w.db'}", *args, "--", "touch", str(tmp_path / "ran")],
        capture_output=True, text=True, timeout=60, env={**clean_env(), "COLUMNS": "200"},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.splitlines()) == 1 and out.stderr.startswith("wattline: error: "), out.stderr
    assert said in out.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "w.db").exists()


class Counting(ThreadingHTTPServer):
    """A server whose ``/metrics`` shows ``ok`` requests answered; each ``POST /bump`` adds one."""

    ok = 1

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Exposition(BaseHTTPRequestHandler):
    server: Counting

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.answer(exposed(self.server.ok).encode())

    def do_POST(self) -> None:
        self.server.ok += 1
        self.answer(b"")

    def answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def counting() -> Iterator[Counting]:
    server = Counting(("127.0.0.1", 0), Exposition)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("path", "count", "said"),
    [
        (None, COUNT, "wattline: no requests were counted from the metrics: no scrape of {url} answered ("),
        ("/metric", COUNT, "wattline: no requests were counted from the metrics: no scrape of {url} answered (HTTP 404 "),
        ("/metrics", "requests=layoutlm_request_total", "wattline: {url} exposes no series requests=layoutlm_request_total selects"),
    ],
    ids=["dead", "mistyped-path", "mistyped-metric"],
)  # fmt: skip
def test_metrics_that_count_nothing_are_said_and_the_command_runs(
    tmp_path: Path, counting: Counting, path: str | None, count: str, said: str
) -> None:
    url = NOWHERE if path is None else counting.url + path
    store = f"sqlite:///{tmp_path / 'w.db'}"
    out = subprocess.run(
        [*CLI, "run", "--job-id", "nothing", "--store", store, "--no-report", "--metrics", url, "--count", count,
         "--", "sh", "-c", f"sleep 1.5; touch {tmp_path / 'ran'}; exit 3"],
        capture_output=True, text=True, timeout=60, env={**clean_env(), "COLUMNS": "200"},
    )  # fmt: skip
    assert out.returncode == 3 and (tmp_path / "ran").exists(), out.stderr
    assert said.format(url=url) in out.stderr
    lines = [line for line in out.stderr.splitlines() if url in line]
    assert len(lines) == len(set(lines)) <= 2, out.stderr  # each said once, never a line a scrape
    report = subprocess.run(
        [*CLI, "report", "nothing", "--json", "--store", store],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["units"]["total"] == 0


# --- the holder's rules, on canned scrapes ---------------------------------------------------------


def exposed(ok: float) -> str:
    return f'# TYPE layoutlm_requests counter\nlayoutlm_requests_total{{outcome="ok"}} {ok}\n'


class Canned:
    """A holder fed canned scrapes (an exposition, or a :class:`ScrapeError`'s reason), with the
    UNITS events it sends and the lines it says."""

    URL = "http://127.0.0.1:9/metrics"

    def __init__(self) -> None:
        self.events: list[wire.pb.JobEvent] = []
        self.said: list[str] = []
        self.answers: list[str | ScrapeError] = []
        units = UnitAccumulator(EventBuilder(JobSpec("canned", "canned")), self.events.extend)
        served = ServedUnits(self.URL, parse_unit(COUNT))
        self.holder = ServedHolder(served, units, time.time_ns(), self.said.append, self._fetch)

    def _fetch(self, url: str, timeout_s: float) -> str:
        answer = self.answers.pop(0)
        if isinstance(answer, ScrapeError):
            raise answer
        return answer

    def scrape(self, answer: str | ScrapeError) -> int | None:
        """One scrape answered so; its reading's time (None: it failed)."""
        self.answers.append(answer)
        reading = self.holder.scrape(1.0)
        return None if reading is None else reading.time_ns

    def sent(self) -> list[tuple[float, int]]:
        return [(e.units, e.time_ns) for e in self.events]


def test_the_first_scrape_counts_what_the_server_answered_and_idle_scrapes_send_nothing_until_work() -> None:
    """The command started the server: its first reading's units are ours, sent at that scrape
    (the UNITS event covers open to it). Idle readings send nothing; the last one's 0 goes out
    just before the next busy one, so that one's units cover its own interval. A restart (the
    counter back to 1) counts the new server's 1."""
    canned = Canned()
    times = [canned.scrape(exposed(ok)) for ok in (3, 3, 3, 5, 1)]
    assert all(times)
    t1, _t2, t3, t4, t5 = times
    assert canned.sent() == [(3, t1), (0, t3), (2, t4), (1, t5)]
    assert canned.holder.total == 6
    assert canned.said == [
        f'{Canned.URL}: layoutlm_requests_total{{outcome="ok"}}: reset (it went down); counted from 0 again'
    ]


def test_failures_are_said_once_per_reason_after_the_first_good_scrape_and_summed_up_at_the_end() -> None:
    canned = Canned()
    refused = ScrapeError(f"{Canned.URL}: [Errno 111] Connection refused")
    assert canned.scrape(refused) is None  # the server still starting: not said
    assert canned.said == [] and canned.events == []
    canned.scrape(exposed(2))
    for answer in (refused, refused, ScrapeError("the response took longer than the timeout"), exposed(6)):
        canned.scrape(answer)
    canned.answers.append(refused)  # the last scrape, once the command ended: the server is gone
    canned.holder.finish()
    assert [units for units, _ in canned.sent()] == [2, 4]
    assert canned.said == [
        f"scrape of {Canned.URL} failed: [Errno 111] Connection refused (said once; the next good scrape counts what it missed)",
        f"scrape of {Canned.URL} failed: the response took longer than the timeout (said once; the next good scrape counts what it missed)",
        f"6 requests counted from {Canned.URL} (2 scrapes, 3 failed between them)",
    ]


def test_a_server_that_never_answers_is_said_and_counts_nothing() -> None:
    canned = Canned()
    canned.answers.append(ScrapeError(f"{Canned.URL}: HTTP 404 Not Found"))
    canned.holder.finish()
    assert canned.events == []
    assert canned.said == [
        f"no requests were counted from the metrics: no scrape of {Canned.URL} answered (HTTP 404 Not Found)"
    ]


def test_a_large_count_is_said_in_full_and_changing_reasons_fill_no_log() -> None:
    canned = Canned()
    canned.scrape(exposed(1234567))
    for i in range(80):  # a server whose error names a changing value
        canned.scrape(ScrapeError(f"unparsable exposition: bad value at line {i}"))
    canned.answers.append(ScrapeError("gone"))
    canned.holder.finish()
    assert len(canned.said) == 52, canned.said  # 50 reasons, that no more are said, the summary
    assert canned.said[-2:] == [
        f"50 lines said about {Canned.URL}: no more",
        f"1234567 requests counted from {Canned.URL} (1 scrape)",
    ]


class Sink:
    """The job's events, as a store would get them."""

    host_id = "sink"

    def __init__(self) -> None:
        self.events: list[wire.pb.JobEvent] = []

    def send(self, events: list[wire.pb.JobEvent]) -> None:
        self.events.extend(events)

    def edge_tick(self) -> int | None:
        return None

    def close(self) -> None:
        pass


def test_the_last_scrape_is_taken_once_the_command_ended_and_before_the_job_closes(counting: Counting) -> None:
    """Scrapes 30 s apart: the first at the start, then none until the command has ended. The
    command answers two requests (bumps the counter) as its last act; the last scrape, after it,
    counts them, and the close comes after it. The OPEN says the job is a service."""
    bump = f"import urllib.request as u; [u.urlopen(u.Request('{counting.url}/bump', b'')) for _ in range(2)]"
    spec = JobSpec("svc", "svc", unit_name="requests", service=True)
    served = ServedUnits(counting.url + "/metrics", parse_unit(COUNT), every_s=30)
    sink = Sink()
    command = [sys.executable, "-c", f"import time; time.sleep(0.5); {bump}"]
    started = time.monotonic()
    assert JobRunner(RunRequest(command, spec, served=served), sink).run() == 0
    assert time.monotonic() - started < 10  # the 30 s wait for the next scrape is cut short
    assert counting.ok == 3
    Event = wire.pb.JobEvent
    events = [e for e in sink.events if e.kind != Event.KIND_HEARTBEAT]
    assert [e.kind for e in events] == [Event.KIND_OPEN, Event.KIND_UNITS, Event.KIND_UNITS, Event.KIND_CLOSE]
    opened, first, last, closed = events
    assert opened.service and (first.units, last.units) == (1, 2)
    assert opened.time_ns < first.time_ns < last.time_ns <= closed.time_ns


def test_an_endpoint_that_never_answers_holds_the_end_of_the_run_a_few_seconds_at_most(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A listener that takes connections and never answers: each scrape ends at its timeout, and
    the run ends a few seconds after the command (a scrape under way, then the last one), its
    line saying why nothing was counted."""
    with socket.create_server(("127.0.0.1", 0)) as mute:
        url = f"http://127.0.0.1:{mute.getsockname()[1]}/metrics"
        spec = JobSpec("mute", "mute", unit_name="requests")
        sink = Sink()
        started = time.monotonic()
        request = RunRequest(["sleep", "0.5"], spec, served=ServedUnits(url, parse_unit(COUNT)))
        assert JobRunner(request, sink).run() == 0
        took = time.monotonic() - started
    assert took < 8, took
    assert [e.kind for e in sink.events if e.kind == wire.pb.JobEvent.KIND_UNITS] == []
    assert f"no requests were counted from the metrics: no scrape of {url} answered (" in capsys.readouterr().err


#: Per preset unit: the sample read, and its growth in scrapes 2 and 3 of the recorded vLLM
#: scrapes as tests/fixtures/served_metrics/SOURCES.md says it was made (Llama's and Qwen's; in
#: scrape 3 Qwen's server restarted, its counter past its old value: only ``_created`` shows it).
VLLM_GROWTH = {
    "requests": ("vllm:request_success_total", [5 + 2, 3 + 29]),
    "output_tokens": ("vllm:generation_tokens_total", [2230 + 400, 900 + 9800]),
}


@pytest.mark.parametrize("units", [None, "output_tokens"])
def test_a_preset_counts_its_unit_summed_over_the_models(units: str | None) -> None:
    """``--preset vllm`` (``--units`` picks which of its units) on recorded two-model scrapes: the
    job's units are the first scrape's whole value (the command started the server), then each
    scrape's growth summed over models and reasons, a restart's counts since it included."""
    served, unit = served_units(Canned.URL, None, "vllm", units, None, False)
    assert served is not None and unit == (units or "requests")
    sample, growth = VLLM_GROWTH[unit]
    texts = [(FIXTURES / f"vllm_two_models_{i}.txt").read_text() for i in (1, 2, 3)]
    first = sum(
        s.value for family in text_string_to_metric_families(texts[0]) for s in family.samples if s.name == sample
    )
    sent: list[float] = []
    units_to = UnitAccumulator(
        EventBuilder(JobSpec("v", "v")), lambda events: sent.extend(e.units for e in events if not e.unit)
    )
    holder = ServedHolder(served, units_to, time.time_ns(), lambda line: None, lambda url, timeout_s: texts.pop(0))
    for _ in range(3):
        assert holder.scrape(1.0) is not None
    assert first > 0 and sent == [first, *growth]
