"""A report reads a job's UNITS events only at the instants it needs them, with the figures of
every event (InfluxDB 1.x and SQLite).

Truth: what the test wrote, never a figure of the code under test. Unit counts are whole
numbers (so every sum is exact); each UNITS event covers the time since its host's previous
one (or the host's open) and its units apportion pro rata, an event at the same instant as
its predecessor counting at that instant (README "Jobs", ``jobs_view``'s rule), which
:class:`Written` applies to the events as written. The workload ramps 3 units per event per
report up to 60-62 units per event from its 21st report on (the knee), so the saturation
point and plateau rate are known from the construction. The reduced read must also equal
the read of every event (its point). Hard cases: several hosts, two processes of one job on
one host (each its own event_seq base), events at one instant, a resent batch, time stamps
given out of order, events exactly on the edges of the saturation grid, rows an older
version wrote.
"""

from __future__ import annotations

import itertools
import json
import random
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from servers import T0, sqlite_or_influxdb1_store  # noqa: F401 (fixture store)
from typer.testing import CliRunner

from wattline import wire
from wattline.accounting.saturation import (
    SaturationParams,
    _bin_rates,
    cumulative_from_events,
    detect_saturation,
    grid_bins,
)
from wattline.accounting.window_energy import window_energy
from wattline.cli.main import app
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.jobs.jobs_view import BadJob, build_view
from wattline.reports.build import build_report
from wattline.reports.timeline import build_timeline
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.reader import StoredJobEvent, UnitCuts, reduce_units
from wattline.stores.sqlite.store import SqliteStore

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


#: The workload's ramp: a report's count is RAMP x its index, up to the plateau's 60-62 units
#: from report KNEE on (median PLATEAU), per process; PROCESSES processes in all (two on h1).
RAMP, KNEE, PLATEAU, PROCESSES = 3, 20, 61, 3
KIND = wire.pb.JobEvent


@dataclass
class Written:
    """What a test wrote: each host's open and its UNITS events (once each, however often resent)."""

    opens: dict[str, int] = field(default_factory=dict)
    units: list[tuple[str, int, int, float]] = field(default_factory=list)  #: host, time_ns, event_seq, count

    def add(self, host: str, events: Iterable[wire.pb.JobEvent]) -> None:
        for e in events:
            if e.kind == KIND.KIND_OPEN:
                self.opens[host] = min(self.opens.get(host, e.time_ns), e.time_ns)
            elif e.kind == KIND.KIND_UNITS:
                self.units.append((host, e.time_ns, e.event_seq, e.units))

    @classmethod
    def stored(cls, events: Iterable[StoredJobEvent]) -> Written:
        """The same of events as a store returns them."""
        written = cls()
        for e in events:
            if e.event == "open":
                written.opens[e.host] = min(written.opens.get(e.host, e.time_ns), e.time_ns)
            elif e.event == "units":
                written.units.append((e.host, e.time_ns, e.event_seq, float(e.fields["units"])))
        return written

    @property
    def total(self) -> float:
        return sum(u[3] for u in self.units)

    def between(self, t0: int, t1: int) -> float:
        """Units in ``[t0, t1]`` by the rule of the module doc, from the events as written."""
        got = 0.0
        for host in sorted({u[0] for u in self.units}):
            prev = self.opens.get(host)
            for _host, t, _seq, count in sorted(u for u in self.units if u[0] == host):
                lo = t if prev is None else min(prev, t)
                if lo == t:  # a point: counts where it lies
                    got += count if t0 < t <= t1 else 0.0
                else:
                    got += count * max(0, min(t, t1) - max(lo, t0)) / (t - lo)
                prev = t
        return got


def fill(store: Store, job_id: str, seconds: int, every_s: int, mark_s: float | None = None) -> Written:
    """``job_id`` on h1 (two processes) and h2 for ``seconds``, a report every ``every_s``: the
    ramp to a plateau (module doc) with the hard cases; returns what was written."""
    rng = random.Random(job_id)
    start, end = T0, T0 + seconds * S
    written = Written()
    for host, procs in (("h1", 2), ("h2", 1)):
        main = builder(job_id)
        marks = [main.open(start)] + ([main.phase("saturated", start + int(mark_s * S))] if mark_s else [])
        write(store, host, marks)
        written.add(host, marks)
        for p in range(procs):
            b = main if p == 0 else builder(job_id)
            events = []
            for k, t in enumerate(range(start + every_s * S, end, every_s * S)):
                count = float(min(k, KNEE) * RAMP + rng.randrange(3))
                stamp = t + rng.randrange(-every_s * S // 3, every_s * S // 3) if k % 7 == 3 else t
                events.append(b.units(count, stamp))
                if k % 11 == 5:  # another event at the same instant
                    events.append(b.units(4.0, stamp))
            write(store, host, events[::2])
            write(store, host, events[1::2], times=2)
            written.add(host, events)
        write(store, host, [main.close(0, end)])
    return written


def knee_window_ns(seconds: int, every_s: int) -> tuple[int, int]:
    """Where the detector may put a ramp's saturation point: the knee lies between the report
    that first comes within its 10 % of the plateau (RAMP x 18 = 54 of 61 units, covering the
    time from 18 x ``every_s``) and the plateau's first (from KNEE x ``every_s``), and the point
    is the start of a bin within one bin of it (the grid's bins: 60, at least 1 s)."""
    bin_ns = seconds * S // min(60, seconds)
    return T0 + 18 * every_s * S - bin_ns, T0 + KNEE * every_s * S + bin_ns


def plateau_rate(every_s: int) -> float:
    """Units/s on the plateau: the median report's PLATEAU units per ``every_s``, per process."""
    return PROCESSES * PLATEAU / every_s


def saturation_from_every_event(store: Store, job_id: str, end_ns: int) -> tuple[int | None, float | None]:
    """Saturation point and plateau rate detected from every stored event (as before the few reads)."""
    full = build_view(job_id, store.job_events(job_id))
    found = detect_saturation(full.start_ns, end_ns, unit_events=full.unit_events, mark_ns=full.saturation_mark_ns)
    return found.at_ns, found.plateau_rate


@pytest.mark.parametrize(("seconds", "every_s", "mark_s"), [(1800, 7, None), (1800, 5, 333.3), (40, 1, None)])
def test_report_units_figures_are_the_written_ones_read_at_a_few_instants(
    store: Store, seconds: int, every_s: int, mark_s: float | None
) -> None:
    written = fill(store, "j", seconds, every_s, mark_s)
    report = build_report(store, "j")
    at = report.saturation.at_ns
    assert at is not None
    if mark_s is None:  # detected from the ramp: within a bin of its knee
        lo, hi = knee_window_ns(seconds, every_s)
        assert lo <= at <= hi, ((at - T0) / S, (lo - T0) / S, (hi - T0) / S)
    else:
        assert at == T0 + int(mark_s * S)
    warm = written.between(T0, at)
    assert report.job.units_total == written.total
    assert report.units_warmup == pytest.approx(warm, rel=1e-12) and 0 < warm < written.total
    assert report.units_saturated == pytest.approx(written.total - warm, rel=1e-12)
    # counts are 60-62 units a report, and an extra 4 at every 11th is a lump the median mostly skips
    assert report.saturation.plateau_rate == pytest.approx(plateau_rate(every_s), rel=0.02)
    # the point and rate found from the few instants are those from every event, exactly
    assert (at, report.saturation.plateau_rate) == saturation_from_every_event(store, "j", report.end_ns)
    if mark_s is None and seconds > 60:
        assert report.saturation.method == "throughput-plateau"  # the grid was used
    stored = len([e for e in store.job_events("j") if e.event == "units"])
    if seconds > 60:  # read at the edges of the 60 grid bins, not every event
        assert len(report.job.unit_events) < stored / 2


def test_timeline_units_from_a_report_are_the_written_ones(store: Store) -> None:
    """Each of the timeline's bins holds the units written in it, apportioned."""
    written = fill(store, "j", 1800, 5, 333.3)
    report = build_report(store, "j")
    timeline = build_timeline(store, report)
    edges = timeline.edges_ns
    assert (edges[0], edges[-1], timeline.bins) == (T0, T0 + 1800 * S, len(edges) - 1)
    assert timeline.units_per_s is not None
    got = [u * timeline.width_s(i) for i, u in enumerate(timeline.units_per_s)]
    truth = [written.between(a, b) for a, b in itertools.pairwise(edges)]
    assert got == pytest.approx(truth, rel=1e-12, abs=1e-9) and sum(got) == pytest.approx(written.total)


def test_units_read_by_the_store_equal_the_reference_reduction(store: Store) -> None:
    """Events on every grid edge, 1 ns either side, and between: the store's reduction (SQL on
    SQLite) is the one :func:`reduce_units` makes of every event."""
    b, start, end = builder("edges"), T0, T0 + 600 * S
    cuts = UnitCuts(start, end, grid_bins(start, end, SaturationParams()), (start + 123_456_789,))
    times = sorted({t + d for t in cuts.instants for d in (-1, 0, 1)} | {start + k * 7 * S for k in range(90)})
    events = [b.open(start), *(b.units(float(i % 5), t) for i, t in enumerate(times)), b.close(0, end)]
    write(store, "h1", events)
    written = Written()
    written.add("h1", events)
    every = [e for e in store.job_events("edges") if e.event == "units"]
    for c in (cuts, UnitCuts(0, 0), UnitCuts(start, end, 13)):
        reduced = store.unit_events("edges", c)
        assert reduced == reduce_units(every, c)
        read = Written({"h1": start}, Written.stored(reduced).units)
        assert read.total == written.total
        for t in c.instants:  # the count at each cut is the one written
            assert read.between(start, t) == pytest.approx(written.between(start, t), rel=1e-12, abs=1e-9), t


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
    written = Written.stored(events)
    assert len(reduced.unit_events) < len(full.unit_events) / 2
    assert reduced.units_total == written.total
    for c in cuts.instants:
        assert window_energy(reduced.unit_intervals, 0, c) == window_energy(full.unit_intervals, 0, c)
        assert window_energy(reduced.unit_intervals, 0, c) == pytest.approx(written.between(0, c), rel=1e-12), c
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
        at = report.saturation.at_ns
        assert at is not None and knee_window_ns(600, 3)[0] <= at <= knee_window_ns(600, 3)[1]
        assert report.job.units_total == written.total
        assert report.units_warmup == pytest.approx(written.between(T0, at), rel=1e-12)
        db.execute("UPDATE job_events SET fields = '{\"units\": -1.0}' WHERE rowid = ?", [rows[20][0]])
        db.commit()
        with pytest.raises(BadJob) as bad:
            build_report(store, "j")
        with pytest.raises(BadJob) as before:
            build_view("j", store.job_events("j"))
        assert str(bad.value) == str(before.value)


def test_wattline_report_json_gives_the_units_written(tmp_path: Path) -> None:
    """Through the CLI (the job named by its id): the units figures a user sees."""
    path = tmp_path / "w.db"
    with SqliteStore(path) as store:
        written = fill(store, "cli-j", 1800, 7)
    out = CliRunner().invoke(app, ["report", "cli-j", "--json", "--store", f"sqlite:///{path}"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    at = T0 + round(data["durations_s"]["warmup"] * S)
    lo, hi = knee_window_ns(1800, 7)
    assert lo <= at <= hi
    warm = written.between(T0, at)
    saturated = written.total - warm  # under its name and its deprecated one ("measured")
    assert data["units"] == pytest.approx(
        {"total": written.total, "warmup": warm, "saturated": saturated, "measured": saturated}
    )
    assert data["units"]["total"] == written.total  # whole numbers: exact


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
    # h1 closed at the end; h2 last beat 30 s (less 7 ns) before it: within the 90 s lease 10 s later
    # (running until now), long past it 10**6 s later (abandoned, ended when last heard on h1)
    running = after_s == 10
    assert (report.state, report.end_ns) == (("running", now) if running else ("abandoned", end))
    assert {h: w.last_ns for h, w in report.job.hosts.items()} == {"h1": end, "h2": end - 30 * S + 7}
    full = build_view("beating", store.job_events("beating"))  # the few reads: those of every event
    assert (report.state, report.end_ns) == (full.state(now), full.end_ns(now))
    read = [e for e in store.job_events("beating", every=False) if e.event == "heartbeat"]
    assert len(read) == 4 and {e.host for e in read} == {"h1", "h2"}
