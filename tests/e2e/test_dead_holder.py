"""A dead wrapper's job ends at once (issue #27, item 1): a `wattline run` killed with SIGKILL,
and the next job on the host started 5 s later (a scheduler's kill after its grace period,
then the next job at once). The next job finds the dead holder (pid, start time, boot id in
its record) and ends its job where it was last alive, so the next job's report printed at
its end and its stored summary are its own: P x its window, not half of it. Through an
agent and a collector the same, the summary written by the collector; and where no process
could check the holder (its record elsewhere), the stored summaries converge once one does.

Real processes on a fake powercap tree advanced at a known power; the truth is P times the
window the stored open and close events give (never a figure of the report). The jobs'
windows are under test, not their CPU time (their commands sleep): every report and summary
here splits the host by rule "equal".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import Proc, start_collector
from servers import free_port
from sysfs_trees import PowerAdvancer, Zone, powercap_tree
from waits import wait_sampled, wait_until

from wattline.agent.holders.registry import HolderRecord
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.stores.sqlite.store import SqliteStore
from wattline.wire import Batch, Host, JobEvent

WATTLINE = [sys.executable, "-m", "wattline.cli.main"]
POWER_W = 40.0
START_UJ = 10**11
HOST = "holder-host"
BATCH_S = 0.5


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[PowerAdvancer]:
    root = powercap_tree(tmp_path / "host", [Zone("intel-rapl:0", "package-0", START_UJ)])
    powered = PowerAdvancer(root, {"intel-rapl:0": POWER_W}, START_UJ)
    yield powered
    powered.close()


def env(tmp_path: Path, state: str = "state") -> dict[str, str]:
    """Default heartbeat (a 90 s lease): only the holder check can end the dead job in time."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("WATTLINE_")},
        "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}",
        "WATTLINE_AGENT_BATCH_INTERVAL": str(BATCH_S),
        "XDG_STATE_HOME": str(tmp_path / state),
        "COLUMNS": "250",
    }


#: The split by windows alone (see the module doc): the reports', the embedded runs' summaries
#: and, in the environment, the collector's.
EQUAL = ["--share-rule", "equal"]
EQUAL_ENV = {"WATTLINE_COLLECTOR_SUMMARY_SHARE_RULE": "equal"}


def cli(tmp_path: Path, *args: str, state: str = "state") -> subprocess.CompletedProcess[str]:
    """A command; report, jobs and run under rule "equal"."""
    ruled = [args[0], *EQUAL, *args[1:]] if args[0] in ("report", "jobs", "run") else list(args)
    out = subprocess.run([*WATTLINE, *ruled], capture_output=True, text=True, timeout=120, env=env(tmp_path, state))
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def embedded(tree: PowerAdvancer) -> list[str]:
    return ["--host-id", HOST, "--sysfs-root", str(tree.root), "--source", "rapl"]


def start_dead(tmp_path: Path, where: list[str], state: str = "state") -> subprocess.Popen[str]:
    """`wattline run` of a long sleep in its own session, so SIGKILL of its group takes both."""
    return subprocess.Popen(
        [*WATTLINE, "run", "--job-id", "dead", "--no-report", *where, "--", "sleep", "120"],
        env=env(tmp_path, state),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def kill_after(proc: subprocess.Popen[str], seconds: float) -> int:
    """SIGKILL ``proc``'s group after ``seconds``; the kill's time (ns)."""
    time.sleep(seconds)  # time, not a state: the wrapper's own run time before its kill
    assert proc.poll() is None, "the wrapper ended by itself"
    killed = time.time_ns()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    return killed


def events(db: Path, job_id: str) -> dict[str, list[dict[str, Any]]]:
    """The stored events of ``job_id`` by kind: {kind: [{time_ns, fields}]}."""
    out: dict[str, list[dict[str, Any]]] = {}
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT event, time_ns, fields FROM job_events WHERE job_id = ?", (job_id,)).fetchall()
    for kind, t, fields in rows:
        out.setdefault(kind, []).append({"time_ns": t, **json.loads(fields)})
    return out


def truth_j(db: Path, job_id: str) -> float:
    """P x the job's window (its stored open and close)."""
    ev = events(db, job_id)
    return POWER_W * (ev["close"][0]["time_ns"] - ev["open"][0]["time_ns"]) / 1e9


def summarised(db: Path) -> set[str]:
    """The jobs with a stored summary."""
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT job_id FROM job_summary")}


def closed_summary(db: Path, job_id: str) -> bool:
    """A summary of ``job_id`` computed after its close (a running job's come first)."""
    return job_id in summarised(db) and summary(db, job_id)["status"] in ("closed", "abandoned")


def summary(db: Path, job_id: str) -> dict[str, Any]:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT fields FROM job_summary WHERE job_id = ?", (job_id,)).fetchone()
    assert row is not None, f"no summary of {job_id}"
    return dict(json.loads(row[0]))


def total_j(report: dict[str, Any]) -> float:
    return float(report["measured"]["energy_j"] + report["warmup"]["energy_j"])


@contextlib.contextmanager
def fleet(tmp_path: Path, tree: PowerAdvancer, env: dict[str, str] | None = None) -> Iterator[list[str]]:
    """`wattline collector` (SQLite, summaries on) and a host agent on ``tree``; yields the
    `wattline run` options that send a job there."""
    db = tmp_path / "w.db"
    port = free_port()
    collector = start_collector(
        port, ["--store", f"sqlite:///{db}"], tmp_path / "collector.log", env={**(env or {}), **EQUAL_ENV}
    )
    started = time.time_ns()
    agent = Proc(
        ["agent", "--host-id", HOST, "--sysfs-root", str(tree.root), "--source", "rapl",
         "--batch-interval", str(BATCH_S), f"--collector=127.0.0.1:{port}"],
        tmp_path / "agent.log",
    )  # fmt: skip
    try:
        with SqliteStore(db) as store:  # the agent's first batches: samples before the jobs open
            wait_sampled(store, HOST, started)
        yield ["--host-id", HOST, f"--collector=127.0.0.1:{port}", "--store", f"sqlite:///{db}"]
    finally:
        agent.terminate()
        collector.terminate()


def last_sample_end(db: Path, before_ns: int) -> int:
    """The end of the host's last stored sample at or before ``before_ns``."""
    with sqlite3.connect(db) as conn:
        (end,) = conn.execute("SELECT max(time_ns) FROM energy WHERE time_ns <= ?", (before_ns,)).fetchone()
    return int(end)


def check_dead(db: Path, tmp_path: Path, killed_ns: int, embedded: bool) -> None:
    """The dead job ends once, where its holder was last known alive, marked abandoned, and its
    figures are P x that window. Embedded, that is where its stored samples end (what it held
    in memory died with it); with an agent, its record's last renewal (every second) before
    the kill."""
    ev = events(db, "dead")
    assert len(ev["close"]) == 1, ev["close"]
    close = ev["close"][0]
    assert close["abandoned"].startswith("wrapper gone: pid ")
    assert "exit_code" not in close  # nobody saw the command end
    assert close["time_ns"] <= killed_ns
    if embedded:
        assert close["time_ns"] == pytest.approx(last_sample_end(db, killed_ns), abs=0.05e9)
    else:
        assert close["time_ns"] >= killed_ns - 3e9  # a renewal a second, late under load
    report = json.loads(cli(tmp_path, "report", "dead", "--json", "--store", f"sqlite:///{db}").stdout)
    assert report["job"]["status"] == "abandoned"
    assert report["job"]["status_text"].startswith("abandoned (wrapper gone: pid ")
    assert total_j(report) == pytest.approx(truth_j(db, "dead"), rel=0.01)
    rows = {r["id"]: r for r in json.loads(cli(tmp_path, "jobs", "--json", "--store", f"sqlite:///{db}").stdout)}
    assert rows["dead"]["status"] == "abandoned"
    dead_summary = summary(db, "dead")
    assert dead_summary["status"] == "abandoned"
    assert dead_summary["energy_total_j"] == pytest.approx(truth_j(db, "dead"), rel=0.01)


def test_embedded_next_job_5_s_after_a_killed_run_is_its_own(tmp_path: Path, tree: PowerAdvancer) -> None:
    db = tmp_path / "w.db"
    dead = start_dead(tmp_path, embedded(tree))
    killed = kill_after(dead, 6.0)
    time.sleep(5.0)  # time, not a state: the next job starts 5 s after the kill (the scenario)
    run = cli(tmp_path, "run", "--job-id", "next", "--json", *embedded(tree), "--", "sleep", "4")
    printed = json.loads(run.stdout)
    # The one line naming the sources; ending the dead job says nothing here (`jobs` shows it).
    assert [line.split(":")[:2] for line in run.stderr.splitlines()] == [["wattline", " sources"]], run.stderr

    truth = truth_j(db, "next")
    assert truth == pytest.approx(POWER_W * 4.0, rel=0.05)  # the window is the command's
    assert total_j(printed) == pytest.approx(truth, rel=0.01)  # today: -50 %, shared with the dead job
    assert not any("shared" in n for n in printed["notes"]), printed["notes"]
    assert summary(db, "next")["energy_total_j"] == pytest.approx(truth, rel=0.01)
    check_dead(db, tmp_path, killed, embedded=True)


def test_fleet_next_job_5_s_after_a_killed_run_is_its_own(tmp_path: Path, tree: PowerAdvancer) -> None:
    """Host agent + `wattline collector` (SQLite, summaries on): the agent or the next run ends
    the dead job, the collector writes the summaries."""
    db = tmp_path / "w.db"
    with fleet(tmp_path, tree) as where:
        dead = start_dead(tmp_path, where)
        killed = kill_after(dead, 6.0)
        time.sleep(5.0)  # time, not a state: the next job starts 5 s after the kill (the scenario)
        printed = json.loads(cli(tmp_path, "run", "--job-id", "next", "--json", *where, "--", "sleep", "4").stdout)
        truth = truth_j(db, "next")
        assert total_j(printed) == pytest.approx(truth, rel=0.01)
        assert not any("shared" in n for n in printed["notes"]), printed["notes"]
        wait_until(lambda: closed_summary(db, "next") and closed_summary(db, "dead"), "the collector's summaries")
        assert summary(db, "next")["energy_total_j"] == pytest.approx(truth, rel=0.01)
        check_dead(db, tmp_path, killed, embedded=False)


def test_stored_summaries_converge_once_the_dead_holder_is_found(tmp_path: Path, tree: PowerAdvancer) -> None:
    """The dead run kept its record where neither the agent nor the next run looks (another
    state home), so the next job's summary is first computed with the dead job still inside its
    lease: half. A later run of the dead one's home ends it; the collector then computes the
    next job's summary again: its own figure."""
    db = tmp_path / "w.db"
    with fleet(tmp_path, tree) as where:
        dead = start_dead(tmp_path, where, state="elsewhere")
        kill_after(dead, 4.0)
        time.sleep(2.0)  # time, not a state: the next job starts 2 s after the kill, inside dead's lease
        printed = json.loads(cli(tmp_path, "run", "--job-id", "next", "--json", *where, "--", "sleep", "4").stdout)
        truth = truth_j(db, "next")
        assert total_j(printed) == pytest.approx(truth / 2, rel=0.02)  # the lease: nobody could check
        wait_until(lambda: closed_summary(db, "next"), "next's first summary after its close")
        first = summary(db, "next")
        assert first["energy_total_j"] == pytest.approx(truth / 2, rel=0.02)

        cli(tmp_path, "run", "--job-id", "later", "--no-report", *where, "--", "true", state="elsewhere")
        wait_until(lambda: summary(db, "next")["computed_ns"] != first["computed_ns"], "next's summary again")
        assert events(db, "dead")["close"][0]["abandoned"].startswith("wrapper gone")
        assert summary(db, "next")["energy_total_j"] == pytest.approx(truth, rel=0.01)


def test_two_processes_finding_one_dead_holder_store_one_close(tmp_path: Path, tree: PowerAdvancer) -> None:
    db = tmp_path / "w.db"
    dead = start_dead(tmp_path, embedded(tree))
    kill_after(dead, 3.0)
    runs = [
        subprocess.Popen(
            [*WATTLINE, "run", *EQUAL, "--job-id", f"next{i}", "--no-report", *embedded(tree), "--", "sleep", "1"],
            env=env(tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(3)
    ]
    assert [r.wait(timeout=60) for r in runs] == [0, 0, 0]
    assert len(events(db, "dead")["close"]) == 1


def test_the_wrappers_own_close_wins_over_one_made_for_it(tmp_path: Path) -> None:
    """A wrapper killed between sending its close and dropping its record: the close a later
    process makes for it (earlier or later) must not turn an ended job into an abandoned one."""
    db = tmp_path / "w.db"
    builder = EventBuilder(JobSpec("both", "both"))
    t0 = 1_800_000_000 * 10**9
    opened = builder.open(t0)
    own = builder.close(3, t0 + 10 * 10**9)
    made = JobEvent(job_id="both", kind=JobEvent.KIND_CLOSE, time_ns=t0 + 11 * 10**9,
                    event_seq=builder.reserved_seq, abandoned="wrapper gone: pid 1 no longer runs")  # fmt: skip
    for order in ([opened, made, own], [opened, own, made]):
        with SqliteStore(db) as store:
            store.write(Batch(host=Host(host_id=HOST), job_events=order))
        rows = {r["id"]: r for r in json.loads(cli(tmp_path, "jobs", "--json", "--store", f"sqlite:///{db}").stdout)}
        assert rows["both"]["status"] == "closed" and rows["both"]["exit_code"] == 3
        assert rows["both"]["duration_s"] == pytest.approx(10.0)


def test_a_summary_that_counted_a_job_as_running_is_computed_again_when_its_lease_ends(
    tmp_path: Path, tree: PowerAdvancer
) -> None:
    """Where no process can check the holder, the lease decides: "next" closes while "dead"
    (killed a moment before, its record out of reach) is still inside its lease, so next's
    first summary splits its last moments with dead. When dead's lease ends, the collector
    computes next's summary again: dead's window ends at its last heartbeat."""
    # a 6 s lease, for the collector and the runs alike: longer than the collector takes to write
    # next's first summary after its close (its last samples), so that one counts dead as running
    heartbeat = {"WATTLINE_HEARTBEAT_S": "2.0"}
    db = tmp_path / "w.db"
    with fleet(tmp_path, tree, heartbeat) as where:
        dead = subprocess.Popen(
            [*WATTLINE, "run", "--job-id", "dead", "--no-report", *where, "--", "sleep", "120"],
            env={**env(tmp_path, "elsewhere"), **heartbeat},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        # next opens while dead runs: the truth below takes dead's window as opened before next's
        wait_until(lambda: "open" in events(db, "dead"), "dead's open stored")
        nxt = subprocess.Popen(
            [*WATTLINE, "run", "--job-id", "next", "--no-report", *where, "--", "sleep", "5"],
            env={**env(tmp_path), **heartbeat},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        kill_after(dead, 4.3)  # next closes about 0.7 s later, dead still inside its lease
        assert nxt.wait(timeout=60) == 0
        wait_until(lambda: closed_summary(db, "next"), "next's summary after its close")
        ev_dead, ev_next = events(db, "dead"), events(db, "next")
        dead_end = max(e["time_ns"] for kind in ev_dead.values() for e in kind)  # its last heartbeat
        lease_end = dead_end + 3 * 2.0e9
        n_open, n_close = ev_next["open"][0]["time_ns"], ev_next["close"][0]["time_ns"]
        shared_s = (dead_end - n_open) / 1e9
        truth = POWER_W * ((n_close - n_open) / 1e9 - shared_s / 2)  # rule "equal" while both ran
        first = summary(db, "next")
        if first["computed_ns"] < lease_end:  # computed while dead still counted as running
            assert first["energy_total_j"] < truth * 0.99  # it shared the moments after dead's death
            wait_until(lambda: summary(db, "next")["computed_ns"] > lease_end, "next's summary never computed again")
        # else the writer's wait for next's last samples outlasted dead's lease: right at once
        assert summary(db, "next")["energy_total_j"] == pytest.approx(truth, rel=0.01)


@pytest.mark.parametrize("planted", ["valid", "symlink", "world-writable"])
def test_a_record_that_is_not_a_plain_private_file_ends_nothing(
    tmp_path: Path, tree: PowerAdvancer, planted: str
) -> None:
    """Records of dead holders in a state home: a valid one ends its job (the control); one
    behind a symbolic link, or one others may write, is not trusted and ends nothing."""
    db = tmp_path / "w.db"
    cli(tmp_path, "run", "--job-id", "victim", "--no-report", *embedded(tree), "--", "true")
    before = len(events(db, "victim")["close"])
    record = HolderRecord(
        job_id="victim",
        host_id=HOST,
        sink=f"store:sqlite:{os.path.realpath(db)}",
        pid=2**22 + 1,  # above any pid_max: no such process
        start_ticks=1,
        boot_id=Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        pid_ns=os.stat("/proc/self/ns/pid").st_ino,
        open_ns=time.time_ns() - 10**9,
        close_seq=(7 << 32) | (2**32 - 1),
    )
    held = tmp_path / "state" / "wattline" / "outbox" / "holders"
    held.mkdir(parents=True, exist_ok=True)  # the first run made it
    target = tmp_path / "elsewhere.json" if planted == "symlink" else held / "j1-0123456789ab.json"
    target.write_text(json.dumps(dataclasses.asdict(record)))
    if planted == "symlink":
        (held / "j1-0123456789ab.json").symlink_to(target)
    if planted == "world-writable":
        target.chmod(0o666)
    cli(tmp_path, "run", "--job-id", "next", "--no-report", *embedded(tree), "--", "true")
    closes = events(db, "victim")["close"]
    if planted == "valid":
        assert len(closes) == before + 1 and any(c.get("abandoned") for c in closes)
    else:
        assert len(closes) == before and not any(c.get("abandoned") for c in closes)
