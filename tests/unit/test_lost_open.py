"""A job whose open event was lost (issue #43): its window is taken from what is stored, it
reads incomplete with the missing event named, and its stored samples and units are counted.

Truth (tests/helpers/lost_events.py): RAPL counters at a known power over the whole time, one
process's events as a job's wrapper sends them, and a store that took only what came after
it restarted empty 5.2 s after the job opened: the open, the first units events and the
first CPU-time period are lost. The earliest stored evidence is then the CPU-time period
that ends at 10 s (it reaches back to 5 s, :data:`EVIDENCE_S`), so the window is [5 s,
close]: energy = power x that, and the units are the last stored ``units_total`` (every
unit the process counted, the lost ones included).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from lost_events import (
    EVIDENCE_S,
    LENGTH_S,
    POWER_W,
    RESTART_S,
    UNITS_EACH,
    UNITS_EVERY_S,
    job_events,
    samples,
    stored_after,
)
from servers import T0
from typer.testing import CliRunner

from wattline import wire
from wattline.cli.main import app
from wattline.jobs.jobs_view import build_view, utc_iso
from wattline.stores.sqlite.store import SqliteStore

S = 10**9


def write(store: SqliteStore, host: str, events: list[wire.pb.JobEvent]) -> None:
    batch = wire.Batch(stream_id=f"events-{host}-{events[0].event_seq}", seq=1)
    batch.host.host_id = host
    batch.job_events.extend(events)
    assert store.write(batch).rejected == 0


def cli(path: Path, *args: str) -> Any:
    out = CliRunner().invoke(app, [*args, "--json", "--store", f"sqlite:///{path}"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def test_a_job_whose_open_was_lost_reads_incomplete_with_its_stored_samples_and_units(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    sent = job_events("j")
    kept = stored_after(sent, T0 + round(RESTART_S * S))
    assert kept[0].kind != wire.pb.JobEvent.KIND_OPEN and sent[0].kind == wire.pb.JobEvent.KIND_OPEN
    with SqliteStore(path) as store:
        assert store.write(samples("h", T0, range(-10, LENGTH_S + 10))).rejected == 0
        write(store, "h", kept)
    window_s = LENGTH_S - EVIDENCE_S
    energy_j = sum(POWER_W.values()) * window_s
    units = UNITS_EACH * LENGTH_S / UNITS_EVERY_S  # the last stored units_total: every unit counted
    assert units == max(e.units_total for e in kept if e.kind == wire.pb.JobEvent.KIND_UNITS)

    report = cli(path, "report", "j")
    assert report["job"]["status"] == "closed" and report["job"]["exit_code"] == 0
    assert report["complete"] is False
    assert report["missing_events"] == {"h": ["open"]}
    start = utc_iso(T0 + EVIDENCE_S * S)
    assert report["job"]["start"] == start
    assert any(
        f"h: open not stored: the window starts at its first stored event, {start}" in n for n in report["notes"]
    )
    assert report["durations_s"]["total"] == pytest.approx(window_s, abs=1e-9)
    assert report["whole_run"]["energy_j"] == pytest.approx(energy_j, rel=1e-9)
    assert report["units"]["total"] == pytest.approx(units, abs=1e-9)
    assert report["whole_run"]["units"] == pytest.approx(units, abs=1e-9)

    (row,) = cli(path, "jobs")
    assert row["status"] == "closed" and row["complete"] is False and row["missing_events"] == {"h": ["open"]}
    assert row["duration_s"] == pytest.approx(window_s, abs=1e-9)
    assert row["units"] == pytest.approx(units, abs=1e-9)
    assert row["total_energy_j"] == pytest.approx(energy_j, rel=1e-9)
    (bare,) = cli(path, "jobs", "--no-energy")
    assert bare["missing_events"] == {"h": ["open"]} and bare["units"] == pytest.approx(units, abs=1e-9)


def test_a_complete_job_names_no_missing_event(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    with SqliteStore(path) as store:
        assert store.write(samples("h", T0, range(-10, LENGTH_S + 10))).rejected == 0
        write(store, "h", job_events("j"))
    report = cli(path, "report", "j")
    assert report["complete"] is True and report["missing_events"] == {}
    assert report["whole_run"]["energy_j"] == pytest.approx(sum(POWER_W.values()) * LENGTH_S, rel=1e-9)
    (row,) = cli(path, "jobs")
    assert row["complete"] is True and row["missing_events"] == {}


def stored(events: list[wire.pb.JobEvent], host: str = "h") -> list[Any]:
    """The events as a store gives them back (SQLite in memory)."""
    with SqliteStore(":memory:") as store:
        write(store, host, events)
        return store.job_events("j")


def test_without_an_open_the_window_starts_at_the_earliest_stored_evidence() -> None:
    sent = job_events("j")
    units = [e for e in sent if e.kind == wire.pb.JobEvent.KIND_UNITS]
    beats = [e for e in sent if e.kind == wire.pb.JobEvent.KIND_HEARTBEAT]
    use = [e for e in sent if e.kind == wire.pb.JobEvent.KIND_USE]
    close = sent[-1]
    cases = {  # what was stored -> where the window starts
        "close only": ([close], close.time_ns),
        "units and close": ([*units[20:], close], units[20].time_ns),
        "a use period reaches back": ([*units[20:], use[1], close], use[1].time_ns - use[1].use_period_ns),
        "a heartbeat first": ([beats[0], *units[70:], close], beats[0].time_ns),
    }
    for name, (events, start) in cases.items():
        view = build_view("j", stored(sorted(events, key=lambda e: e.event_seq)))
        window = view.hosts["h"]
        assert (window.open_ns, window.close_ns, view.missing_events) == (start, close.time_ns, {"h": ["open"]}), name
    view = build_view("j", stored(sent))
    assert view.missing_events == {} and view.hosts["h"].open_ns == T0


def test_units_and_use_without_open_or_close_run_then_are_abandoned() -> None:
    sent = job_events("j")[12:-1]  # no open, no close
    view = build_view("j", stored(sent))
    first, last = sent[0].time_ns, sent[-1].time_ns
    window = view.hosts["h"]
    assert window.open_ns <= first and window.close_ns is None and view.missing_events == {"h": ["open"]}
    assert view.state(last + S) == "running"
    assert view.state(last + wire.lease_ns() + S) == "abandoned" and view.end_ns(last + wire.lease_ns() + S) == last


def test_a_host_whose_open_was_lost_beside_one_whose_was_not() -> None:
    whole = job_events("j")
    late = stored_after(job_events("j"), T0 + 20 * S)
    with SqliteStore(":memory:") as store:
        write(store, "a", whole)
        write(store, "b", late)
        view = build_view("j", store.job_events("j"))
    assert view.start_ns == T0 and view.hosts["a"].open_ns == T0
    assert view.hosts["b"].open_ns == min(e.time_ns - e.use_period_ns if e.use_period_ns else e.time_ns for e in late)
    assert view.missing_events == {"b": ["open"]} and view.name == "lost-open" and view.unit_name == "documents"


def test_a_job_whose_open_was_lost_shares_its_host_from_its_first_stored_event(tmp_path: Path) -> None:
    """Its neighbour's report sees it from there too: the host's energy is counted once."""
    path = tmp_path / "w.db"
    whole = job_events("whole")  # the neighbour: every event stored, the same window [0, 60 s]
    with SqliteStore(path) as store:
        assert store.write(samples("h", T0, range(-10, LENGTH_S + 10))).rejected == 0
        write(store, "h", whole)
        write(store, "h", stored_after(job_events("j"), T0 + round(RESTART_S * S)))
    power = sum(POWER_W.values())
    alone_s, shared_s = EVIDENCE_S, LENGTH_S - EVIDENCE_S
    reports = {job: cli(path, "report", job, "--share-rule", "equal") for job in ("j", "whole")}
    assert reports["j"]["whole_run"]["energy_j"] == pytest.approx(power * shared_s / 2, rel=1e-9)
    assert reports["whole"]["whole_run"]["energy_j"] == pytest.approx(power * (alone_s + shared_s / 2), rel=1e-9)
    assert reports["whole"]["complete"] is True


def test_a_job_of_units_and_a_close_reports_from_its_first_units_event(tmp_path: Path) -> None:
    """No use period, no heartbeat stored: the report's window starts at its first stored units
    event, and the table says the open is missing."""
    path = tmp_path / "w.db"
    sent = job_events("j")
    kept = [
        e
        for e in stored_after(sent, T0 + 20 * S)
        if e.kind in (wire.pb.JobEvent.KIND_UNITS, wire.pb.JobEvent.KIND_CLOSE)
    ]
    with SqliteStore(path) as store:
        assert store.write(samples("h", T0, range(-10, LENGTH_S + 10))).rejected == 0
        write(store, "h", kept)
    first = kept[0].time_ns
    report = cli(path, "report", "j", "--share-rule", "exclusive")
    assert report["job"]["start"] == utc_iso(first) and report["missing_events"] == {"h": ["open"]}
    assert report["whole_run"]["energy_j"] == pytest.approx(sum(POWER_W.values()) * (T0 + LENGTH_S * S - first) / S)
    assert report["units"]["total"] == UNITS_EACH * LENGTH_S / UNITS_EVERY_S
    out = CliRunner().invoke(app, ["jobs", "--store", f"sqlite:///{path}"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "ok (exit 0), open not stored" in out.stdout and "incomplete" in out.stdout, out.stdout
