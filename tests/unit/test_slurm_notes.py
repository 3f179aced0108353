"""The agent's side of the Slurm hooks, without a cluster: the notes the real prolog and epilog
leave become the job's events (labels from the hook's environment and the controller, GPUs by
UUID, the events file's lines, the exit status), with the holder record in between; a note read
again stores nothing twice, one the outbox refused waits, and a note anyone but root could
have written counts for nothing."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from slurm_node_files import node_config, slurmd_proc

from wattline import wire
from wattline.agent.holders import registry as holders
from wattline.agent.holders.slurm import node as slurm_node
from wattline.agent.holders.slurm import records as slurm_records
from wattline.agent.holders.slurm import watch as slurm_watch
from wattline.agent.holders.slurm.jobs import HookNotes
from wattline.agent.holders.slurm.watch import SlurmWatcher
from wattline.jobs.wrappers import slurm_hooks
from wattline.stores.sqlite.store import SqliteStore

K = wire.pb.JobEvent
UID = os.getuid()


@pytest.fixture
def controller(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """What the controller answers (the test fills it in); no scontrol runs."""
    view: dict[str, str] = {}
    monkeypatch.setattr(slurm_node, "ask_controller", lambda *a, **k: slurm_node.Asked(None, 0.0))
    monkeypatch.setattr(slurm_node, "answer", lambda asked: dict(view))
    return view


def job_env(job_id: str = "41", **more: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": job_id, "SLURM_JOB_UID": str(UID), "SLURM_JOB_GID": str(os.getgid()), "SLURMD_NODENAME": "n1",
            "SLURM_JOB_USER": "alice", "SLURM_JOB_PARTITION": "gpu", **more}  # fmt: skip


def agent(tmp_path: Path, sent: list[wire.pb.JobEvent], gpus: dict[int, str] | None = None) -> HookNotes:
    return HookNotes(
        tmp_path / "outbox", tmp_path / "slurm", wire.Host(host_id="n1"), lambda _h, ev: sent.extend(ev),
        gpus=lambda: dict(gpus or {}),
    )  # fmt: skip


def test_a_jobs_events_come_from_its_hooks_notes(tmp_path: Path, controller: dict[str, str]) -> None:
    config, proc = node_config(tmp_path), slurmd_proc(tmp_path / "proc")
    env = job_env(SLURM_JOB_GPUS="1,0")
    controller.update(name="train bert", account="ml")
    sent: list[wire.pb.JobEvent] = []
    notes = agent(tmp_path, sent, gpus={0: "GPU-aaa", 1: "GPU-bbb"})

    before = time.time_ns()
    assert slurm_hooks.prolog(env, config, proc) == []
    opened_by = time.time_ns()
    assert notes.take() == 1
    (opened,) = sent
    assert opened.kind == K.KIND_OPEN and before <= opened.time_ns <= opened_by
    assert opened.name == "train bert" and list(opened.devices) == ["gpu:GPU-bbb", "gpu:GPU-aaa"]
    assert dict(opened.labels) == {"user": "alice", "partition": "gpu", "account": "ml"}
    assert opened.holder_pid == os.getppid()  # the slurmd of the fake /proc: the test's parent
    (record,) = [r for _, r in holders.records(tmp_path / "outbox")]
    assert (record.job_id, record.holder_name, record.owner_uid, record.pid) == ("41", "slurmd", UID, os.getppid())

    events = tmp_path / "slurm/41.events"
    stamp_s = before // 10**9 + 1  # whole seconds: exact in a float
    events.write_text(f"units 3 {stamp_s}\nunits 2\nno such line\n")
    sent.clear()
    controller.clear()  # the controller forgot the job: the epilog's own status counts
    closing = time.time_ns()
    assert slurm_hooks.epilog({**env, "SLURM_JOB_EXIT_CODE2": "3:0"}, config) == []
    closed_by = time.time_ns()
    time.sleep(0.05)  # the agent takes the note later: the note's instant counts, not the agent's
    assert notes.take() == 1
    units, late, close = sent
    assert (units.kind, units.units, units.time_ns) == (K.KIND_UNITS, 3, stamp_s * 10**9)
    assert late.units == 2 and late.time_ns == close.time_ns  # no time: at the epilog's instant
    assert close.kind == K.KIND_CLOSE and closing <= close.time_ns <= closed_by and close.exit_code == 3
    assert not close.end_state and (tmp_path / "slurm/41.ending").exists()  # asked again later
    assert holders.records(tmp_path / "outbox") == []
    assert sorted(p.name for p in (tmp_path / "slurm").iterdir()) == ["41.ending"]
    base = slurm_node.seq_base("41", "n1")
    assert [e.event_seq - base for e in (opened, units, late, close)] == [
        slurm_node.OPEN_AT, slurm_node.LINES_AT, slurm_node.LINES_AT + 1, slurm_node.CLOSE_AT
    ]  # fmt: skip


def test_notes_wait_for_the_agent_and_a_note_read_again_stores_nothing_twice(
    tmp_path: Path, controller: dict[str, str]
) -> None:
    """The agent was down for the whole job: both notes wait, and give the job its own times.
    It died before removing them: read again, they give the same events (one per identity)."""
    config, proc = node_config(tmp_path), slurmd_proc(tmp_path / "proc")
    env = job_env("42")
    slurm_hooks.prolog(env, config, proc)
    open_note = (tmp_path / "slurm/42.open").read_bytes()
    time.sleep(0.02)
    slurm_hooks.epilog({**env, "SLURM_JOB_EXIT_CODE2": "0:0"}, config)
    close_note = (tmp_path / "slurm/42.close").read_bytes()
    runs: list[list[wire.pb.JobEvent]] = [[], []]
    for sent in runs:
        (tmp_path / "slurm/42.open").write_bytes(open_note)
        (tmp_path / "slurm/42.close").write_bytes(close_note)
        (tmp_path / "slurm/42.open").chmod(0o600)
        (tmp_path / "slurm/42.close").chmod(0o600)
        assert agent(tmp_path, sent).take() == 2
    assert [(e.kind, e.event_seq, e.time_ns, e.exit_code) for e in runs[0]] == [
        (e.kind, e.event_seq, e.time_ns, e.exit_code) for e in runs[1]
    ]
    opened, close = runs[0]
    assert opened.kind == K.KIND_OPEN and close.kind == K.KIND_CLOSE and close.time_ns - opened.time_ns >= 2 * 10**7
    assert opened.name == "42" and not (tmp_path / "slurm/42.ending").exists()  # exit 0: nothing to ask


def test_a_note_the_outbox_refused_waits(tmp_path: Path, controller: dict[str, str]) -> None:
    config, proc = node_config(tmp_path), slurmd_proc(tmp_path / "proc")
    slurm_hooks.prolog(job_env("43"), config, proc)
    refusing = HookNotes(tmp_path / "outbox", tmp_path / "slurm", wire.Host(host_id="n1"),
                         lambda _h, _e: (_ for _ in ()).throw(OSError("outbox full")))  # fmt: skip
    assert refusing.take() == 0 and (tmp_path / "slurm/43.open").exists()
    sent: list[wire.pb.JobEvent] = []
    assert agent(tmp_path, sent).take() == 1 and [e.kind for e in sent] == [K.KIND_OPEN]


@pytest.mark.parametrize("how", ["link", "writable", "foreign-shape"])
def test_a_note_anyone_else_could_have_written_counts_for_nothing(
    tmp_path: Path, controller: dict[str, str], how: str, caplog: pytest.LogCaptureFixture
) -> None:
    config, proc = node_config(tmp_path), slurmd_proc(tmp_path / "proc")
    slurm_hooks.prolog(job_env("44"), config, proc)
    note = tmp_path / "slurm/44.open"
    if how == "link":
        target = tmp_path / "elsewhere.json"
        note.rename(target)
        note.symlink_to(target)
    elif how == "writable":
        note.chmod(0o666)
    else:
        note.write_text('{"time_ns": "soon", "env": {"SLURM_JOB_ID": "44"}}')
    sent: list[wire.pb.JobEvent] = []
    notes = agent(tmp_path, sent)
    with caplog.at_level(logging.WARNING):
        assert notes.take() == 0 and notes.take() == 0
    assert sent == [] and note.is_symlink() == (how == "link")
    assert len([r for r in caplog.records if "44.open" in r.getMessage()]) == 1  # said once


def test_a_time_limit_says_timeout(tmp_path: Path, controller: dict[str, str]) -> None:
    """The controller's recorded answer for a job it ended at its time limit (a real 22.05:
    tests/fixtures/scontrol/SOURCE.md): the close says ``timeout``, exit 143 (SIGTERM)."""
    config, proc = node_config(tmp_path), slurmd_proc(tmp_path / "proc")
    recorded = (Path(__file__).parents[1] / "fixtures/scontrol/timeout-22.05.txt").read_text()
    env = job_env("1")
    slurm_hooks.prolog(env, config, proc)
    slurm_hooks.epilog({**env, "SLURM_JOB_EXIT_CODE2": "0:15"}, config)
    controller.update(slurm_node.parse_show_job(recorded))
    sent: list[wire.pb.JobEvent] = []
    assert agent(tmp_path, sent).take() == 2
    close = sent[-1]
    assert (close.kind, close.end_state, close.exit_code, close.name) == (K.KIND_CLOSE, "timeout", 143, "wrap")
    assert not (tmp_path / "slurm/1.ending").exists()  # settled: nothing to ask again
    db = tmp_path / "w.db"
    with SqliteStore(db) as store:
        store.write(wire.Batch(host=wire.Host(host_id="n1"), job_events=sent))
    listed = subprocess.run(
        [sys.executable, "-m", "wattline.cli.main", "jobs", "--no-energy", "--store", f"sqlite:///{db}"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert listed.returncode == 0 and "timed out (exit 143, SIGTERM)" in listed.stdout, listed.stdout + listed.stderr


def test_an_idle_node_looks_only_at_the_directory_and_takes_a_new_note_at_once(
    tmp_path: Path, controller: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no job open and nothing waiting, a pass is one lstat of the directory (it listed the
    directory and the holder records twice a second on every node); the prolog's note changes
    the directory, so the next pass takes it; a note the directory's mtime does not show (a
    coarse clock) is taken by the whole pass that runs every QUIET_MAX_S."""
    config, proc = node_config(tmp_path), slurmd_proc(tmp_path / "proc")
    sent: list[wire.pb.JobEvent] = []
    watcher = SlurmWatcher(
        tmp_path / "outbox", tmp_path / "slurm", wire.Host(host_id="n1"), lambda _h, ev: sent.extend(ev)
    )
    looks: list[Path] = []
    listing = slurm_records.pending
    monkeypatch.setattr(slurm_records, "pending", lambda d: looks.append(d) or listing(d))

    def age_directory() -> None:  # made more than a second ago: its mtime tells every later file
        os.utime(tmp_path / "slurm", ns=(time.time_ns() - 5 * 10**9,) * 2)

    (tmp_path / "slurm").mkdir(mode=0o755)
    age_directory()
    watcher.poll()
    assert len(looks) == 1  # the first pass is whole
    for _ in range(5):
        watcher.poll()
    assert len(looks) == 1 and sent == []  # idle: nothing listed

    assert slurm_hooks.prolog(job_env("77"), config, proc) == []
    watcher.poll()
    assert [(e.job_id, e.kind) for e in sent] == [("77", K.KIND_OPEN)] and len(looks) == 2
    watcher.poll()
    assert len(looks) == 3  # a job open: every pass is whole
    assert slurm_hooks.epilog({**job_env("77"), "SLURM_JOB_EXIT_CODE2": "0:0"}, config) == []
    watcher.poll()
    assert [e.kind for e in sent if e.job_id == "77"][-1] == K.KIND_CLOSE
    age_directory()
    watcher.poll()  # whole: the close's pass left nothing open, this one sees the aged directory
    settled = len(looks)
    watcher.poll()
    assert len(looks) == settled

    # a note whose directory change the mtime does not show (a coarse clock): the whole pass
    # that runs every QUIET_MAX_S takes it; the watcher's clock is the test's from here
    clock = [time.monotonic()]
    monkeypatch.setattr(slurm_watch, "time", SimpleNamespace(time_ns=time.time_ns, monotonic=lambda: clock[0]))
    seen = os.stat(tmp_path / "slurm").st_mtime_ns
    assert slurm_hooks.prolog(job_env("78"), config, proc) == []
    os.utime(tmp_path / "slurm", ns=(seen, seen))
    watcher.poll()
    assert not any(e.job_id == "78" for e in sent) and len(looks) == settled
    clock[0] += slurm_watch.QUIET_MAX_S
    watcher.poll()
    assert [(e.job_id, e.kind) for e in sent if e.job_id == "78"] == [("78", K.KIND_OPEN)]
