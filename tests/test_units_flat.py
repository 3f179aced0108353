"""A report reads a job's UNITS events only at the instants it needs them, with the figures of
every event (InfluxDB 1.x and SQLite).

Truth: the unit counts written (whole numbers, so every sum is exact), and the figures the
report computed before from every stored event (the saturation detected on the whole unit
timeline, warm-up units apportioned over every event's interval), recomputed here from
``store.job_events(job_id)``: they must be equal, not close. Hard cases: several hosts, two
processes of one job on one host (each its own event_seq base), events at one instant,
a resent batch, time stamps given out of order, events exactly on the edges of the
saturation grid, rows an older version wrote.
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest
from servers import T0, sqlite_or_influxdb1_store  # noqa: F401 (fixture store)
from typer.testing import CliRunner

from wattline import wire
from wattline.cli.main import app
from wattline.collector.stores.influx_v1 import InfluxV1Store
from wattline.collector.stores.reader import StoredJobEvent, UnitCuts, reduce_units
from wattline.collector.stores.sqlite import SqliteStore
from wattline.workloads.attribution import window_energy
from wattline.workloads.events import EventBuilder, JobSpec
from wattline.workloads.jobs_view import BadJob, build_view
from wattline.workloads.report import build_report
from wattline.workloads.saturation import (
    SaturationParams,
    _bin_rates,
    cumulative_from_events,
    detect_saturation,
    grid_bins,
)
from wattline.workloads.timeline import build_timeline, spread

S = 10**9
Store = SqliteStore | InfluxV1Store


def write(store: Store, host: str, events: list[wire.pb.JobEvent], times: int = 1) -> None:
    batch = wire.Batch(stream_id=f"s-{host}-{events[0].event_seq}", seq=1)
    batch.host.host_id = host
    batch.job_events.extend(events)
    for _ in range(times):  # a resent batch: its events overwrite themselves
        assert store.write(batch).rejected == 0


def builder(job_id: str) -> EventBuilder:
    return EventBuilder(JobSpec(job_id, job_id, "training", "steps"))


def fill(store: Store, job_id: str, seconds: int, every_s: int, mark_s: float | None = None) -> float:
    """``job_id`` on h1 (two processes) and h2 for ``seconds``: a ramp to a plateau of units,
    with the hard cases; returns the units written."""
    rng = random.Random(job_id)
    start, end = T0, T0 + seconds * S
    total = 0.0
    for host, procs in (("h1", 2), ("h2", 1)):
        main = builder(job_id)
        marks = [main.open(start)] + ([main.phase("saturated", start + int(mark_s * S))] if mark_s else [])
        write(store, host, marks)
        for p in range(procs):
            b = main if p == 0 else builder(job_id)
            events = []
            for k, t in enumerate(range(start + every_s * S, end, every_s * S)):
                count = float(min(k, 20) * 3 + rng.randrange(3))
                stamp = t + rng.randrange(-every_s * S // 3, every_s * S // 3) if k % 7 == 3 else t
                events.append(b.units(count, stamp))
                total += count
                if k % 11 == 5:  # another event at the same instant
                    events.append(b.units(4.0, stamp))
                    total += 4.0
            write(store, host, events[::2])
            write(store, host, events[1::2], times=2)
        write(store, host, [main.close(0, end)])
    return total


def old_figures(store: Store, job_id: str, end_ns: int) -> tuple[float, float, int | None, float | None]:
    """Units total, warm-up units, saturation point and plateau rate from every event (as before)."""
    full = build_view(job_id, store.job_events(job_id))
    found = detect_saturation(full.start_ns, end_ns, unit_events=full.unit_events, mark_ns=full.saturation_mark_ns)
    split = found.at_ns if found.saturated and found.at_ns is not None else full.start_ns
    return full.units_total, window_energy(full.unit_intervals, full.start_ns, split), found.at_ns, found.plateau_rate


@pytest.mark.parametrize(("seconds", "every_s", "mark_s"), [(1800, 7, None), (1800, 5, 333.3), (40, 1, None)])
def test_report_units_figures_equal_those_from_every_event(
    store: Store, seconds: int, every_s: int, mark_s: float | None
) -> None:
    written = fill(store, "j", seconds, every_s, mark_s)
    report = build_report(store, "j")
    total, warm, at_ns, rate = old_figures(store, "j", report.end_ns)
    assert report.job.units_total == total == written
    assert (report.saturation.at_ns, report.saturation.plateau_rate) == (at_ns, rate)
    assert report.units_warmup == warm and report.units_measured == written - warm
    if mark_s is None and seconds > 60:
        assert report.saturation.method == "throughput-plateau"  # the grid was used
    stored = len([e for e in store.job_events("j") if e.event == "units"])
    if seconds > 60:  # read at the edges of the 60 grid bins, not every event
        assert len(report.job.unit_events) < stored / 2


def test_timeline_units_from_a_report_equal_those_from_every_event(store: Store) -> None:
    written = fill(store, "j", 1800, 5, 333.3)
    report = build_report(store, "j")
    timeline = build_timeline(store, report)
    full = build_view("j", store.job_events("j"))
    units = [0.0] * timeline.bins
    spread(full.unit_intervals, report.job.start_ns, report.end_ns, timeline.edges_ns, units)
    assert timeline.units_per_s is not None
    got = [u * timeline.width_s(i) for i, u in enumerate(timeline.units_per_s)]
    assert got == pytest.approx(units, rel=1e-12, abs=1e-9) and sum(got) == pytest.approx(written)


def test_units_read_by_the_store_equal_the_reference_reduction(store: Store) -> None:
    """Events on every grid edge, 1 ns either side, and between: the store's reduction (SQL on
    SQLite) is the one :func:`reduce_units` makes of every event."""
    b, start, end = builder("edges"), T0, T0 + 600 * S
    cuts = UnitCuts(start, end, grid_bins(start, end, SaturationParams()), (start + 123_456_789,))
    times = sorted({t + d for t in cuts.instants for d in (-1, 0, 1)} | {start + k * 7 * S for k in range(90)})
    write(store, "h1", [b.open(start), *(b.units(float(i % 5), t) for i, t in enumerate(times)), b.close(0, end)])
    every = [e for e in store.job_events("edges") if e.event == "units"]
    for c in (cuts, UnitCuts(0, 0), UnitCuts(start, end, 13)):
        assert store.unit_events("edges", c) == reduce_units(every, c)


def test_reduced_units_give_the_same_count_at_every_cut() -> None:
    """The pure reduction on random events (many at one instant): the unit count apportioned
    up to each cut and the saturation grid's bin rates are those of every event."""
    rng = random.Random(5)
    end = 100 * S
    events = [StoredJobEvent(h, "j", "open", 0, 1) for h in ("a", "b")]
    events += [
        StoredJobEvent(rng.choice("ab"), "j", "units", rng.randrange(1, end // S) * S // 4, seq, {"units": float(k)})
        for seq, k in enumerate(rng.choices(range(9), k=1500), start=2)
    ]
    cuts = UnitCuts(0, end, grid_bins(0, end, SaturationParams()), (1234, 50 * S + 7))
    full = build_view("j", events)
    reduced = build_view("j", events[:2] + reduce_units(events[2:], cuts))
    assert len(reduced.unit_events) < len(full.unit_events) / 2
    assert reduced.units_total == full.units_total
    for c in cuts.instants:
        assert window_energy(reduced.unit_intervals, 0, c) == window_energy(full.unit_intervals, 0, c)
    grid = UnitCuts(0, end, cuts.bins).instants
    rates = [_bin_rates(grid, cumulative_from_events(v.unit_events)) for v in (full, reduced)]
    assert rates[0] == rates[1]


def test_sqlite_rows_of_an_older_version_are_read_as_before(tmp_path: Path) -> None:
    """Units fields another writer spelled differently are summed in Python; a bad one makes
    the report say what is wrong, as before."""
    path = f"{tmp_path}/old.db"
    with SqliteStore(path) as store:
        written = fill(store, "j", 600, 3)
    db = sqlite3.connect(path)
    rows = db.execute("SELECT rowid, fields FROM job_events WHERE event = 'units' ORDER BY time_ns").fetchall()
    for rowid, fields in rows[5:40]:
        db.execute("UPDATE job_events SET fields = ? WHERE rowid = ?", [json.dumps(json.loads(fields)), rowid])
    db.commit()
    with SqliteStore(path) as store:
        report = build_report(store, "j")
        total, warm, _at, _rate = old_figures(store, "j", report.end_ns)
        assert report.job.units_total == total == written and report.units_warmup == warm
        db.execute("UPDATE job_events SET fields = '{\"units\": -1.0}' WHERE rowid = ?", [rows[20][0]])
        db.commit()
        with pytest.raises(BadJob) as bad:
            build_report(store, "j")
        with pytest.raises(BadJob) as before:
            build_view("j", store.job_events("j"))
        assert str(bad.value) == str(before.value)


def test_wattline_report_json_gives_the_units_of_every_event(tmp_path: Path) -> None:
    """Through the CLI (the job named by its id): the units figures a user sees."""
    path = tmp_path / "w.db"
    with SqliteStore(path) as store:
        written = fill(store, "cli-j", 1800, 7)
        old = build_report(store, "cli-j")
        total, warm, _at, _rate = old_figures(store, "cli-j", old.end_ns)
    out = CliRunner().invoke(app, ["report", "cli-j", "--json", "--store", f"sqlite:///{path}"])
    assert out.exit_code == 0, out.output
    units = json.loads(out.stdout)["units"]
    assert units == {"total": written, "warmup": warm, "measured": written - warm} and total == written


@pytest.mark.parametrize("after_s", [10, 10**6])  # running (heard within the lease), abandoned
def test_heartbeats_are_read_at_each_hosts_first_and_last(store: Store, after_s: int) -> None:
    """A job beating every 30 s for 2 h on two hosts, closed on one: the report's window, state
    and last-heard times are those of every event, from two heartbeats per host."""
    end = T0 + 7200 * S
    for host in ("h1", "h2"):
        b = builder("beating")
        beats = [b.heartbeat(t + (host == "h2") * 7) for t in range(T0 + 30 * S, end, 30 * S)]
        write(
            store, host, [b.open(T0), b.units(5.0, T0 + 60 * S), *beats, *([b.close(0, end)] if host == "h1" else [])]
        )
    now = end + after_s * S
    report = build_report(store, "beating", now_ns=now)
    full = build_view("beating", store.job_events("beating"))
    assert (report.state, report.end_ns) == (full.state(now), full.end_ns(now))
    assert {h: w.last_ns for h, w in report.job.hosts.items()} == {h: w.last_ns for h, w in full.hosts.items()}
    assert report.state == ("running" if after_s == 10 else "abandoned")
    read = [e for e in store.job_events("beating", every=False) if e.event == "heartbeat"]
    assert len(read) == 4 and {e.host for e in read} == {"h1", "h2"}
