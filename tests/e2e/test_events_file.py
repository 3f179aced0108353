"""The events file has one grammar (issue #42, items 6 and 7). Every reader — ``wattline run``
(and through it ``wattline sweep``'s latencies), the agent for a Slurm job and for a pod — makes
the same events of tests/helpers/events_table.py's lines, says each kind of bad line once and skips it;
and a ``units 0`` line or ``Job.add_units(0)`` is a UNITS event on every path that ends the span
of the units before it.

Truth: the table's lines with the times written in them; unit counts written at known times and
apportioned by the documented rule (each units event covers the time since the previous one)
around a saturation point the test placed.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import events_table
import pytest
from procs import CLI, clean_env
from servers import Influxd, searchable
from slurm_node_files import node_config, slurmd_proc
from test_kube_pods import NODE, T0, Kubelet, advance, events_file, pod_list, store_with
from test_kube_pods import kubelet_pki as kubelet_pki  # a fixture
from test_kube_pods import node as node  # a fixture
from test_slurm_notes import agent, job_env
from test_slurm_notes import controller as controller  # a fixture
from waits import wait_until

from wattline import Job, wire
from wattline.agent.holders import event_lines
from wattline.agent.holders.kube.watcher import PodWatcher
from wattline.agent.holders.slurm.jobs import HookNotes
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.jobs.jobs_view import build_view
from wattline.jobs.wrappers import slurm_hooks
from wattline.reports.build import build_report
from wattline.reports.model import ReportSettings
from wattline.stores.base import Store
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.prometheus.store import PrometheusStore
from wattline.stores.sqlite.store import SqliteStore
from wattline.stores.victoria.store import VictoriaStore

S = 10**9
TABLE = Path(__file__).parents[1] / "helpers" / "events_table.py"
ZERO_WORKLOAD = Path(__file__).parents[1] / "helpers" / "zero_units_workload.py"
UNITS, PHASE = wire.pb.JobEvent.KIND_UNITS, wire.pb.JobEvent.KIND_PHASE
#: How each kind of problem reads in the one line that says it.
SAID = {
    "long": "a line has at most 4096 characters",
    "form": "expected 'units N', 'phase NAME' or 'latency SECONDS'",
    "units": "units must be a finite number >= 0",
    "latency": "latency must be a finite number >= 0",
    "phase": "a phase name is 1 to 64 printable characters",
    "time": "UNIX_TIME must be seconds after the epoch",
}
#: A time stamp the Python API writes into an events file carries microseconds (``%.6f``),
#: read back through a float of seconds (0.24 us apart near 2026): within 2 us of the event's.
LINE_NS = 2_000
Node = tuple[Kubelet, PodWatcher, dict[str, Path], list[wire.pb.JobEvent]]


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def env_for(tmp_path: Path) -> dict[str, str]:
    return {**clean_env(), "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}", "COLUMNS": "200",
            "XDG_STATE_HOME": str(tmp_path / "state")}  # fmt: skip


def stored(db: Path, job_id: str) -> list[tuple[str, Any, int]]:
    """The job's UNITS and PHASE events in the store, in the order they were made."""
    with SqliteStore(db) as store:
        found = sorted(store.job_events(job_id), key=lambda e: e.event_seq)
    return [(e.event, e.fields[e.event], e.time_ns) for e in found if e.event in ("units", "phase")]


def sent_events(sent: list[wire.pb.JobEvent], job_id: str) -> list[tuple[str, Any, int]]:
    return [
        ("units", e.units, e.time_ns) if e.kind == UNITS else ("phase", e.phase, e.time_ns)
        for e in sent
        if e.job_id == job_id and e.kind in (UNITS, PHASE)
    ]


def said_once_each(messages: list[str], base: int) -> None:
    """One line for each kind of problem in the table, no more."""
    said = [m for m in messages if "ignored line" in m]
    assert sorted(kind for kind, text in SAID.items() for m in said if text in m) == sorted(
        events_table.problems(base)
    ), said
    assert len(said) == len(events_table.problems(base)), said


def slurm_job(tmp_path: Path, job_id: str) -> tuple[dict[str, str], Path, HookNotes, list[wire.pb.JobEvent]]:
    """A Slurm job whose prolog the agent took: the job's environment, the node's config, the
    agent's notes reader and what it sent."""
    config, proc = node_config(tmp_path), slurmd_proc(tmp_path / "proc")
    env = job_env(job_id)
    sent: list[wire.pb.JobEvent] = []
    notes = agent(tmp_path, sent)
    slurm_hooks.prolog(env, config, proc)
    assert notes.take() == 1
    return env, config, notes, sent


class Recorder:
    """A sink of the caller's own: keeps the job's events."""

    host_id = "h"

    def __init__(self) -> None:
        self.events: list[wire.pb.JobEvent] = []

    def send(self, events: list[wire.pb.JobEvent]) -> None:
        self.events += events

    def edge_tick(self) -> None:
        return None

    def close(self) -> None:
        return None


@pytest.fixture
def agent_says(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The agent's reports of bad lines, fresh for the test (the agent keeps one for its life)."""
    monkeypatch.setattr(event_lines, "AGENT_BAD_LINES", event_lines.BadLines())
    caplog.set_level(logging.WARNING, logger="wattline.agent.holders.event_lines")
    return caplog


# ------------------------------------------------------------------ item 6: one table, every reader


def test_wattline_run_reads_the_table(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    out = cli("run", "--job-id", "table-run", "--no-report", "--", sys.executable, str(TABLE), env=env)
    assert out.returncode == 0, out.stderr
    base = int(out.stdout.split()[0])
    assert stored(tmp_path / "w.db", "table-run") == events_table.events(base)
    said_once_each(out.stderr.splitlines(), base)
    assert "Traceback" not in out.stderr


def test_wattline_sweep_reads_the_tables_latencies(tmp_path: Path) -> None:
    """The good latencies after the table's ``phase saturated`` (0.25 s, 0 s): their median; the
    bad ones (-0.5, nan) skipped."""
    out = cli("sweep", "--param", "n=1", "--repeat", "1", "--json", "--", sys.executable, str(TABLE), "{n}",
              env=env_for(tmp_path), timeout=240)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    [point] = json.loads(out.stdout)["points"]
    assert point["latency_s"]["mean"] == 0.125
    assert "Traceback" not in out.stderr


def test_a_slurm_jobs_events_file_reads_the_table(
    tmp_path: Path, controller: dict[str, str], agent_says: pytest.LogCaptureFixture
) -> None:
    env, config, notes, sent = slurm_job(tmp_path, "61")
    base = int(time.time())
    (tmp_path / "slurm/61.events").write_text(events_table.text(base), encoding="utf-8")
    slurm_hooks.epilog({**env, "SLURM_JOB_EXIT_CODE2": "0:0"}, config)
    assert notes.take() == 1
    assert sent_events(sent, "61") == events_table.events(base)
    messages = [r.getMessage() for r in agent_says.records]
    said_once_each(messages, base)
    assert all(m.startswith("slurm job 61: events file: ignored line:") for m in messages), messages


def test_a_pods_events_file_reads_the_table(node: Node, agent_says: pytest.LogCaptureFixture) -> None:
    kubelet, watcher, dirs, sent = node
    advance(dirs, 0)
    watcher.poll(T0)
    base = T0 // S + 1
    events_file(watcher.root, "note").write_text(events_table.text(base), encoding="utf-8")
    watcher.poll(T0 + 10 * S)
    kubelet.reply = pod_list("Succeeded")
    watcher.poll(T0 + 65 * S)
    assert sent_events(sent, "k8s:team-a/nb-alice") == events_table.events(base)
    messages = [r.getMessage() for r in agent_says.records]
    said_once_each(messages, base)
    assert all("job k8s:team-a/nb-alice: events file: ignored line:" in m for m in messages), messages


def test_the_job_api_takes_no_more_than_the_events_file_carries() -> None:
    """A phase name or a latency the file would refuse is a ValueError, whichever way the job's
    events go (here: the caller's own sink)."""
    sink = Recorder()
    with Job("limits", sink=sink) as job:
        for name in ("p" * 65, "two words", "bell\x07", ""):
            with pytest.raises(ValueError, match=r"^a phase name is 1 to 64 printable characters without spaces"):
                job.phase(name)
        for seconds in (-0.5, float("nan"), float("inf")):
            with pytest.raises(ValueError, match=r"^latency must be a finite number >= 0, got "):
                job.add_latency(seconds)
        job.phase("p" * 64)
    assert [e.phase for e in sink.events if e.kind == PHASE] == ["p" * 64]


# ------------------------------------------------------------------ item 7: units 0 ends the span


def report_of(env: dict[str, str], job_id: str) -> dict[str, Any]:
    out = cli("report", job_id, "--json", env=env)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_wattline_run_counts_from_a_units_0_line(tmp_path: Path) -> None:
    """``units 0`` at B then ``units 10`` at B + 2 s, saturated 2.5 s after the open (between
    them): the saturated window holds 10 x (B + 2 s - saturation) / 2 s of the units, not 10 x
    that / (B + 2 s - open)."""
    env = env_for(tmp_path)
    script = (
        'b=$(( $(date +%s) + 2 )); echo "$b"; echo "units 0 $b" >> "$WATTLINE_EVENTS"; '
        'echo "units 10 $(( b + 2 ))" >> "$WATTLINE_EVENTS"; sleep 5'
    )
    out = cli("run", "--job-id", "zero-run", "--saturated-after", "2.5s", "--no-report", "--", "sh", "-c", script,
              env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    b = int(out.stdout.split()[0]) * S
    with SqliteStore(tmp_path / "w.db") as store:
        [opened] = [e.time_ns for e in store.job_events("zero-run") if e.event == "open"]
    assert stored(tmp_path / "w.db", "zero-run") == [
        ("units", 0.0, b), ("units", 10.0, b + 2 * S), ("phase", "saturated", opened + 5 * S // 2)
    ]  # fmt: skip
    saturated_at = opened + 5 * S // 2
    assert b < saturated_at < b + 2 * S  # the command started within 0.5 s of the open
    truth = 10 * (b + 2 * S - saturated_at) / (2 * S)
    units = report_of(env, "zero-run")["units"]
    # times are whole ns; float64 holds ns near 2026 to 256 ns: 10 units over 2 s move 1.3e-6 per step
    assert units["saturated"] == pytest.approx(truth, abs=1e-5)
    assert units["warmup"] == pytest.approx(10 - truth, abs=1e-5)
    assert units["total"] == 10


@pytest.mark.parametrize("how", ["embedded", "joined"])
def test_the_job_api_counts_from_add_units_0(tmp_path: Path, how: str) -> None:
    """``add_units(0)`` 1 s into the job, ``mark_saturated()`` 1 s later, ``add_units(10)`` 1 s
    after that (tests/helpers/zero_units_workload.py): half the units are saturated (each call's instant
    known to its bracket), not a third. Embedded (the job's own), and joined to ``wattline run``
    (lines in its events file)."""
    env = env_for(tmp_path)
    marks = tmp_path / "marks.json"
    if how == "embedded":
        out = subprocess.run([sys.executable, str(ZERO_WORKLOAD), env["WATTLINE_STORE"], str(marks)],
                             capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
        job_id, slack = "zero-api", 0
    else:
        out = cli("run", "--job-id", "zero-joined", "--no-report", "--", sys.executable, str(ZERO_WORKLOAD), "",
                  str(marks), env=env)  # fmt: skip
        job_id, slack = "zero-joined", LINE_NS
    assert out.returncode == 0, out.stderr
    at = json.loads(marks.read_text())
    zero = [t for kind, units, t in stored(tmp_path / "w.db", job_id) if kind == "units" and units == 0]
    assert len(zero) == 1 and at["zero"][0] - slack <= zero[0] <= at["zero"][1] + slack, (zero, at)
    (a, b), (c, d), (e, f) = ([t - slack, u + slack] for t, u in (at["zero"], at["mark"], at["ten"]))
    low, high = 10 * (e - d) / (f - a), 10 * (f - c) / (e - b)
    units = report_of(env, job_id)["units"]
    assert low <= units["saturated"] <= high, (units, low, high)
    assert units["total"] == 10 and units["warmup"] + units["saturated"] == pytest.approx(10, abs=1e-9)


def test_a_count_sent_by_add_units_0_keeps_its_own_time() -> None:
    """Units counted before ``add_units(0)`` and not yet sent go out at the time they were
    counted, and the 0 at its own: the span it starts begins at the 0, not at the units."""
    sink = Recorder()
    with Job("pending", sink=sink) as job:
        a = time.time_ns()
        job.add_units(5)  # within the batching period of the job's start: kept for the next event
        b = time.time_ns()
        time.sleep(0.1)
        c = time.time_ns()
        job.add_units(0)
        d = time.time_ns()
    units = [(e.units, e.time_ns) for e in sink.events if e.kind == UNITS]
    assert [u for u, _ in units] == [5, 0], units
    assert a <= units[0][1] <= b and c <= units[1][1] <= d, (units, a, b, c, d)


def joined_zero(monkeypatch: pytest.MonkeyPatch, path: Path, job_id: str, then: float = 0) -> tuple[int, int, int]:
    """The Python API joined to ``job_id`` through its events file ``path`` calls ``add_units(0)``,
    then ``add_units(then)`` where it is not 0: the clock just before and just after the 0, and
    once the job's window is left (the last count is sent then)."""
    monkeypatch.setenv("WATTLINE_EVENTS", str(path))
    monkeypatch.setenv("WATTLINE_JOB_ID", job_id)
    with Job("inside") as job:
        before = time.time_ns()
        job.add_units(0)
        after = time.time_ns()
        if then:
            job.add_units(then)
    return before, after, time.time_ns()


def test_a_slurm_job_counts_from_units_0(
    tmp_path: Path, controller: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines ``units 0`` at B, ``phase saturated`` at B + 0.5 s, ``units 10`` at B + 1 s, then the
    Python API joined to the job (``add_units(0)``, ``add_units(4)``): every 0 reaches the store
    at its time, and the saturated window holds 5 + 4 units."""
    env, config, notes, sent = slurm_job(tmp_path, "62")
    b = int(time.time()) + 1
    path = tmp_path / "slurm/62.events"
    path.write_text(f"units 0 {b}\nphase saturated {b + 0.5}\nunits 10 {b + 1}\n")
    time.sleep(max(0.0, b + 1.2 - time.time()))
    before, after, closing = joined_zero(monkeypatch, path, "62", then=4)
    slurm_hooks.epilog({**env, "SLURM_JOB_EXIT_CODE2": "0:0"}, config)
    assert notes.take() == 1
    got = sent_events(sent, "62")
    assert got[:3] == [("units", 0.0, b * S), ("phase", "saturated", b * S + S // 2), ("units", 10.0, (b + 1) * S)]
    assert [(kind, units) for kind, units, _ in got[3:]] == [("units", 0.0), ("units", 4.0)]
    assert before - LINE_NS <= got[3][2] <= after + LINE_NS and after - LINE_NS <= got[4][2] <= closing + LINE_NS
    with SqliteStore(tmp_path / "w.db") as store:
        store.write(wire.Batch(host=wire.Host(host_id="n1"), job_events=sent))
        report = build_report(store, "62", ReportSettings())
    assert (report.units_warmup, report.units_saturated) == (5.0, 9.0)


def test_a_pod_counts_from_units_0(node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines ``units 0`` at T0 + 10 s, ``phase saturated`` at T0 + 15 s, ``units 10`` at T0 + 20 s
    in the notebook pod's file (its window opens at T0), then ``add_units(0)`` from the pod's
    Python: half the units are saturated, and the API's 0 reaches the store at its time."""
    kubelet, watcher, dirs, sent = node
    advance(dirs, 0)
    watcher.poll(T0)
    note = events_file(watcher.root, "note")
    note.write_text("".join(f"{line} {(T0 + k * S) // S}\n" for line, k in
                            (("units 0", 10), ("phase saturated", 15), ("units 10", 20))))  # fmt: skip
    before, after, _ = joined_zero(monkeypatch, note, "k8s:team-a/nb-alice")
    watcher.poll(T0 + 30 * S)
    kubelet.reply = pod_list("Succeeded")
    watcher.poll(T0 + 65 * S)
    got = sent_events(sent, "k8s:team-a/nb-alice")
    assert got[:3] == [("units", 0.0, T0 + 10 * S), ("phase", "saturated", T0 + 15 * S), ("units", 10.0, T0 + 20 * S)]
    assert len(got) == 4 and got[3][:2] == ("units", 0.0) and before - LINE_NS <= got[3][2] <= after + LINE_NS
    report = build_report(store_with(tmp_path / "w.db", sent), "k8s:team-a/nb-alice", ReportSettings(),
                          now_ns=T0 + 120 * S)  # fmt: skip
    assert (report.units_warmup, report.units_saturated) == (5.0, 5.0)
    assert NODE in report.job.hosts


def _store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    if kind == "sqlite":
        return SqliteStore(tmp_path / "w.db")
    if kind == "influxdb1":
        influxd: Influxd = request.getfixturevalue("influxd")
        return InfluxV1Store(influxd.url, influxd.new_database())
    if kind == "victoria":
        return VictoriaStore(request.getfixturevalue("victoria_metrics").url)
    return PrometheusStore(request.getfixturevalue("prometheus").url)


@pytest.mark.servers
@pytest.mark.parametrize("kind", ["sqlite", "influxdb1", "victoria", "prometheus"])
def test_every_store_starts_a_span_at_a_units_0_event(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """Read back from each store, a 0-unit event ends the span before it: a job's two hosts each
    count 4 units at 1 s, 0 at 3 s, 10 at 4 s and 2 at 5 s, saturated at 3.5 s; one host's
    events carry running totals (SQLite reads a span's units from them), the other's do not.
    Each host: 4 + 0 + 10 x 0.5 s / 1 s = 9 units before the saturation point, 5 + 2 after."""
    start = (time.time_ns() // S - 600) * S  # recent: inside every store's window for late samples
    job_id = f"zero-store-{kind}"
    with _store(kind, tmp_path, request) as store:
        for host in ("totals", "no-totals"):
            b = EventBuilder(JobSpec(job_id, job_id, "training", "steps"))
            events = [b.open(start), b.units(4.0, start + S), b.units(0.0, start + 3 * S)]
            events += [b.phase("saturated", start + 7 * S // 2)] if host == "totals" else []
            events += [b.units(10.0, start + 4 * S), b.units(2.0, start + 5 * S), b.close(0, start + 6 * S)]
            for e in events if host == "no-totals" else ():
                e.ClearField("units_total")
            batch = wire.Batch(stream_id=f"s-{host}", seq=1)
            batch.host.host_id = host
            batch.job_events.extend(events)
            assert store.write(batch).rejected == 0
        if kind == "victoria":
            searchable(store.url)
        found = wait_until(lambda: len(got := store.job_events(job_id)) == 13 and got, f"{job_id}'s events stored")
        per_host = [(start, start + S, 4.0), (start + S, start + 3 * S, 0.0), (start + 3 * S, start + 4 * S, 10.0),
                    (start + 4 * S, start + 5 * S, 2.0)]  # fmt: skip
        assert sorted(build_view(job_id, found).unit_intervals) == sorted(per_host * 2)
        report = build_report(store, job_id, ReportSettings(), now_ns=start + 60 * S)
    assert (report.units_warmup, report.units_saturated) == (18.0, 14.0)
