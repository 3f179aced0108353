"""A job's lease (issue #14, item 6): a `wattline run` killed with SIGKILL never closes its
job; its heartbeats stop, and once the lease has passed the job is abandoned at its last
heartbeat: its report stops growing, `wattline jobs` says so, and the next job on the host
is charged in full. A live job keeps renewing its lease and keeps sharing.

The lease is for what the host cannot check: the killed runs here keep their holder
records in a state home of their own (as a wrapper in another PID namespace would be out
of reach), so no later process ends their jobs at once (tests/e2e/test_dead_holder.py: when one
can). Real processes on a fake powercap tree advanced at a known power; lowered heartbeat
(``WATTLINE_HEARTBEAT_S``) so the lease is about a second. The jobs' windows are under
test, not their CPU time: every report here splits the host by rule "equal" (the jobs' commands
sleep; by CPU time they would get next to none of the host, tests/unit/test_cpu_*.py).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pipeline import T0_NS, SyntheticHost, ZoneSpec
from procs import Proc
from servers import Influxd
from sysfs_trees import PowerAdvancer, Zone, powercap_tree
from waits import wait_until

from wattline.collector.server import CollectorServer
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.jobs.jobs_view import all_views, views_of
from wattline.jobs.wrappers.job import Job
from wattline.reports.build import build_report
from wattline.reports.model import ReportSettings
from wattline.stores.influxdb.influxql import QueryError
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.reader import StoredJobEvent
from wattline.stores.sqlite.store import SqliteStore
from wattline.wire import JobEvent, lease_ns

WATTLINE = [sys.executable, "-m", "wattline.cli.main"]
POWER_W = 50.0
START_UJ = 10**11
HEARTBEAT_S = 0.5  # lease: 3 x 0.5 s (wire.LEASE_HEARTBEATS periods)
LEASE_S = 3 * HEARTBEAT_S
ENV_HEARTBEAT = "WATTLINE_HEARTBEAT_S"  # wire.ENV_HEARTBEAT
HOST = "lease-host"


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[PowerAdvancer]:
    """One RAPL package zone advanced at POWER_W in wall time."""
    root = powercap_tree(tmp_path / "host", [Zone("intel-rapl:0", "package-0", START_UJ)])
    powered = PowerAdvancer(root, {"intel-rapl:0": POWER_W}, START_UJ)
    yield powered
    powered.close()


def utc_iso(ns: int) -> str:
    """As reports print times (ISO 8601 UTC, milliseconds)."""
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).isoformat(timespec="milliseconds")


def env(tmp_path: Path, state: str = "state") -> dict[str, str]:
    return {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / state),
        "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}",
        "WATTLINE_AGENT_BATCH_INTERVAL": "0.2",
        ENV_HEARTBEAT: str(HEARTBEAT_S),
        "COLUMNS": "250",
    }


#: The split by windows alone (see the module doc).
EQUAL = ReportSettings(share_rule="equal")


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A read-only command (report, jobs) under rule "equal"."""
    ruled = [*args, "--share-rule", "equal"] if args[0] in ("report", "jobs") else list(args)
    out = subprocess.run([*WATTLINE, *ruled], capture_output=True, text=True, timeout=120, env=env(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def start_run(
    tmp_path: Path, job_id: str, tree: PowerAdvancer, *extra: str, seconds: float = 60
) -> subprocess.Popen[str]:
    """`wattline run` of ``sleep`` in its own process group (so SIGKILL takes the command too),
    its holder record out of the other processes' reach."""
    return subprocess.Popen(
        [*WATTLINE, "run", "--job-id", job_id, "--no-report", "--host-id", HOST, *extra, "--", "sleep", str(seconds)],
        env=env(tmp_path, state=f"state-{job_id}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def embedded(tree: PowerAdvancer) -> list[str]:
    return ["--sysfs-root", str(tree.root), "--source", "rapl", "--interval", "0.1"]


def total_j(report: dict[str, Any]) -> float:
    return float(report["measured"]["energy_j"] + report["warmup"]["energy_j"])


def window(events: list[StoredJobEvent]) -> tuple[int, int]:
    """(open, close) of a closed one-host job from its stored events: the truth's window."""
    times = {e.event: e.time_ns for e in events if e.event in ("open", "close")}
    return times["open"], times["close"]


def kill_after_heartbeats(proc: subprocess.Popen[str], heard: Any, covered: Any, beats: int = 3) -> None:
    """SIGKILL ``proc``'s group once ``beats`` heartbeats are stored and the samples stored
    reach past the last of them (frozen with SIGSTOP while the store is looked at)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.2)  # a poll, not wait_until's: each look stops the run, so not too often
        os.killpg(proc.pid, signal.SIGSTOP)
        beat = [e.time_ns for e in heard() if e.event == "heartbeat"]
        if len(beat) >= beats and covered(max(beat)):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            return
        os.killpg(proc.pid, signal.SIGCONT)
    raise AssertionError("no heartbeats stored within 60 s")


def test_killed_run_is_abandoned_at_its_last_heartbeat_and_the_next_job_is_charged_in_full(
    tmp_path: Path, tree: PowerAdvancer
) -> None:
    db = tmp_path / "w.db"
    dead = start_run(tmp_path, "dead", tree, *embedded(tree))
    try:
        wait_until(lambda: db.exists() or dead.poll() is not None, "wattline run creating its store")
        assert dead.poll() is None, "wattline run ended before creating its store"
        with SqliteStore(db) as store:
            kill_after_heartbeats(
                dead,
                lambda: store.job_events("dead"),
                lambda t: any(s.end_ns >= t for s in store.first_after(HOST, t)),
            )
            last_heard = max(e.time_ns for e in store.job_events("dead"))
            opened = min(e.time_ns for e in store.job_events("dead"))
    finally:
        if dead.poll() is None:
            os.killpg(dead.pid, signal.SIGKILL)
    time.sleep(LEASE_S + 0.5)  # the dead job's lease expires
    cli(tmp_path, "run", "--job-id", "next", "--no-report", "--host-id", HOST, *embedded(tree), "--", "sleep", "5")

    # the next job shares nothing with the dead one: charged P x its own window
    with SqliteStore(db) as store:
        t_open, t_close = window(store.job_events("next"))
    nxt = json.loads(cli(tmp_path, "report", "next", "--json").stdout)
    assert total_j(nxt) == pytest.approx(POWER_W * (t_close - t_open) / 1e9, rel=0.01)
    assert not any("shared" in n for n in nxt["notes"]), nxt["notes"]

    # the dead job is abandoned at its last heartbeat, in `jobs` and in its report
    rows = {r["id"]: r for r in json.loads(cli(tmp_path, "jobs", "--json").stdout)}
    assert rows["dead"]["status"] == "abandoned" and rows["dead"]["last_heard_ns"] == last_heard
    assert rows["next"]["status"] == "closed"
    status = f"abandoned (no close; last heard at {utc_iso(last_heard)})"
    assert status in cli(tmp_path, "jobs").stdout
    first = json.loads(cli(tmp_path, "report", "dead", "--json").stdout)
    assert first["job"]["status"] == "abandoned" and first["job"]["end"] == utc_iso(last_heard)
    assert status in first["notes"]
    assert total_j(first) == pytest.approx(POWER_W * (last_heard - opened) / 1e9, rel=0.01)
    time.sleep(1.0)  # "now" moves on; the abandoned job's figures do not
    again = json.loads(cli(tmp_path, "report", "dead", "--json").stdout)
    assert total_j(again) == pytest.approx(total_j(first), rel=1e-12)
    assert again["durations_s"] == first["durations_s"]


def stored_events(store: InfluxV1Store, job_id: str) -> list[StoredJobEvent]:
    """``job_id``'s events; none while the database does not exist yet (nothing written)."""
    try:
        return store.job_events(job_id)
    except QueryError:
        return []


def covered(store: InfluxV1Store, t_ns: int) -> bool:
    """The agent's samples stored reach ``t_ns``."""
    try:
        return any(s.end_ns >= t_ns for s in store.first_after(HOST, t_ns))
    except QueryError:
        return False


def test_over_the_wire_a_live_job_keeps_sharing_and_a_killed_one_stops(
    tmp_path: Path, tree: PowerAdvancer, influxd: Influxd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host agent + collector into InfluxDB; three `wattline run --collector` jobs: "live"
    (runs throughout), "dead" (SIGKILL) and, after dead's lease, "short" (5 s). Short shares
    its window with live only: charged half of P x its window (rule "equal")."""
    monkeypatch.setenv(ENV_HEARTBEAT, str(HEARTBEAT_S))  # this process reads the store
    store = InfluxV1Store(influxd.url, influxd.new_database())
    server = CollectorServer(store, "127.0.0.1:0")
    server.start()
    collector = ["--collector", f"127.0.0.1:{server.port}"]
    agent = Proc(
        ["agent", "--host-id", HOST, "--sysfs-root", str(tree.root), "--source", "rapl", "--interval", "0.1",
         "--batch-interval", "0.2", *collector],
        tmp_path / "agent.log",
    )  # fmt: skip
    live = start_run(tmp_path, "live", tree, *collector)
    dead = start_run(tmp_path, "dead", tree, *collector)
    try:
        kill_after_heartbeats(dead, lambda: stored_events(store, "dead"), lambda t: covered(store, t))
        time.sleep(LEASE_S + 0.5)  # time, not a state: the dead job's lease expires
        cli(tmp_path, "run", "--job-id", "short", "--no-report", "--host-id", HOST, *collector, "--", "sleep", "5")
        t_open, t_close = window(store.job_events("short"))
        wait_until(lambda: covered(store, t_close), "the agent's samples reaching the short job's close")
        now = time.time_ns()
        assert live.poll() is None
        report = build_report(store, "short", EQUAL, now_ns=now)  # type: ignore[arg-type]
        assert any("shared with 1 other job" in n for n in report.notes), report.notes
        charged = report.warmup.energy_j + report.saturated_window.energy_j
        assert charged == pytest.approx(POWER_W * (t_close - t_open) / 1e9 / 2, rel=0.01)
        views = {v.job_id: v for v in all_views(store)}
        assert views["live"].state(now) == "running" and views["short"].state(now) == "closed"  # heard < 1 s ago
        assert views["dead"].state(now) == "abandoned"
        # the dead job's own report ends at its last heartbeat
        last_heard = max(e.time_ns for e in store.job_events("dead"))
        assert views["dead"].last_heard_ns() == last_heard
        assert build_report(store, "dead", EQUAL, now_ns=now).end_ns == last_heard  # type: ignore[arg-type]
    finally:
        for proc in (live, dead):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        agent.terminate()
        server.stop()
        store.close()


def test_a_store_from_before_heartbeats_ends_an_unclosed_job_at_its_last_event(tmp_path: Path) -> None:
    """Events written before heartbeats existed: "old" opened at 0 s, last units at 10 s, no
    close; "b" ran 20-40 s and closed. Long past the lease, old is abandoned at 10 s (charged
    P x 10 s) and b shares nothing with it (charged P x 20 s; the 31-day rule gave b half)."""
    host = SyntheticHost(tmp_path / "h", "h1", [ZoneSpec("intel-rapl:0", "package-0", POWER_W)])
    old = EventBuilder(JobSpec("old", "old"))
    b = EventBuilder(JobSpec("b", "b"))
    host.spool.add_job_events([old.open(host.t_ns)])
    for second in range(60):
        host.advance(1.0, 2)
        if second == 9:
            host.spool.add_job_events([old.units(5.0, host.t_ns)])
        if second == 19:
            host.spool.add_job_events([b.open(host.t_ns)])
        if second == 39:
            host.spool.add_job_events([b.close(0, host.t_ns)])
    host.spool.seal()
    with SqliteStore(tmp_path / "w.db") as store:
        while (batch := host.spool.peek()) is not None:
            store.write(batch)
            host.spool.ack(batch.seq)
        rb = build_report(store, "b", EQUAL)
        assert rb.warmup.energy_j + rb.saturated_window.energy_j == pytest.approx(POWER_W * 20, rel=1e-9)
        ro = build_report(store, "old", EQUAL)
        assert ro.end_ns == T0_NS + 10 * 10**9 and ro.state == "abandoned"
        assert ro.warmup.energy_j + ro.saturated_window.energy_j == pytest.approx(POWER_W * 10, rel=1e-9)
        assert f"abandoned (no close; last heard at {utc_iso(T0_NS + 10 * 10**9)})" in ro.notes
    host.close()


def test_the_job_api_renews_its_lease_until_it_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Job that opens its own job heartbeats every period until its close; one joined
    through `wattline run`'s events file leaves that to `wattline run`."""
    monkeypatch.setenv(ENV_HEARTBEAT, "0.05")
    sent: list[Any] = []

    class Sink:
        host_id = "h"

        def send(self, events: list[Any]) -> None:
            sent.extend(events)

        def edge_tick(self) -> None:
            return None

        def close(self) -> None:
            sent.append("closed")

    with Job("api", job_id="api-1", sink=Sink()):
        time.sleep(0.5)  # time, not a state: the job's own run time (ten heartbeat periods)
    kinds = [e if e == "closed" else JobEvent.Kind.Name(e.kind) for e in sent]
    assert kinds[0] == "KIND_OPEN" and kinds[-2:] == ["KIND_CLOSE", "closed"]
    # between them heartbeats, and its CPU time (one USE event, the last, just before its close)
    assert set(kinds[1:-3]) == {"KIND_HEARTBEAT"} and kinds[-3] == "KIND_USE"
    # Two-sided, from the events' own stamps (not a count a slow thread could still meet): no
    # beat comes sooner than a period after the one before, and the typical spacing is the
    # period, not twice it (a beat waits a period after the one before, so a busy machine's
    # lateness adds to every gap, at this test's short period a large part of it; a lease
    # of several 30 s periods never notices).
    stamps = [e.time_ns for e in sent[:-3]]  # the open and the heartbeats
    gaps = sorted(b - a for a, b in itertools.pairwise(stamps))
    assert gaps[0] >= 0.05e9 * 0.99, gaps
    assert gaps[len(gaps) // 2] < 0.05e9 * 2, gaps
    # time, not a state: a window in which no beat may come (the close stopped the heartbeat's thread first)
    time.sleep(0.2)
    assert len(sent) == len(kinds)  # nothing after the close

    sent.clear()
    monkeypatch.setenv("WATTLINE_JOB_ID", "parent-job")
    monkeypatch.setenv("WATTLINE_EVENTS", str(Path(os.devnull)))
    with Job("joined", sink=Sink()):
        time.sleep(0.3)  # time, not a state: the job's own run time (six heartbeat periods)
    assert sent == ["closed"]


@pytest.mark.parametrize("after_last_s", [89.0, 91.0])
def test_one_late_heartbeat_never_ends_a_live_job(after_last_s: float) -> None:
    """docs/jobs.md: the lease is three heartbeat periods (90 s at 30 s); one late or lost beat never
    ends a live job. Beats at 30 and 60 s, the one due at 90 s lost, the next 25 s late (at
    145 s): running until 90 s after that beat, abandoned there only after."""
    assert wire_lease_s() == 90.0
    b, s = EventBuilder(JobSpec("late", "late")), 10**9
    events = [b.open(T0_NS), *(b.heartbeat(T0_NS + k * s) for k in (30, 60, 145))]
    stored = [
        StoredJobEvent("h", "late", JobEvent.Kind.Name(e.kind)[5:].lower(), e.time_ns, e.event_seq) for e in events
    ]
    now, last = T0_NS + round((145 + after_last_s) * s), T0_NS + 145 * s
    [view] = views_of(stored)
    # between beats 60 and 145 s (85 s) the job was never past its lease either
    assert view.state(last - 1) == "running"
    assert view.state(now) == ("running" if after_last_s < 90 else "abandoned")
    assert view.end_ns(now) == (now if after_last_s < 90 else last)


def wire_lease_s() -> float:
    """The default lease in seconds, whatever this process's environment says."""
    saved = os.environ.pop(ENV_HEARTBEAT, None)
    try:
        return lease_ns() / 1e9
    finally:
        if saved is not None:
            os.environ[ENV_HEARTBEAT] = saved
