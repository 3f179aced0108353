"""UNITS events that carry their process's running total (``units_total``): a report takes a
span's units as the difference of two totals, and gives exactly the figures of every event.

Truth: the unit counts written (whole numbers, so every sum and difference is exact),
apportioned by the documented rule, and the ramp's knee, as tests/unit/test_units_flat.py takes
them; the saturation point and plateau rate found from totals must also be those found from
every stored event. Hard cases, each on its own host of one job: one process with events at one instant,
resent batches and events on the grid's edges (totals used); two processes (two event_seq
bases); stamps out of order (the builder stops giving totals); an older writer (no totals);
a writer whose first events the store never got (their units count at its first stored
event, whose total says them).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest
from servers import T0, Influxd, sqlite_or_influxdb1_store  # noqa: F401 (fixture store)
from test_units_flat import PLATEAU, Written, builder, knee_window_ns, saturation_from_every_event, write
from typer.testing import CliRunner

from wattline import wire
from wattline.accounting.saturation import SaturationParams, grid_bins
from wattline.cli.main import app
from wattline.reports.build import build_report
from wattline.reports.model import Report
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.reader import UnitCuts, counts_from_totals, reduce_units
from wattline.stores.sqlite.store import SqliteStore

S = 10**9
Store = SqliteStore | InfluxV1Store
SECONDS = 1800


def test_builder_totals_count_its_units_until_a_stamp_goes_back() -> None:
    b = builder("j")
    events = [b.units(u, T0 + t * S) for u, t in ((3.0, 1), (4.0, 2), (5.0, 2), (6.0, 5))]
    assert [e.units_total for e in events] == [3.0, 7.0, 12.0, 18.0]
    later = [b.units(1.0, T0 + 4 * S), b.units(2.0, T0 + 9 * S)]  # 4 s: before the previous one
    assert not any(e.HasField("units_total") for e in later)
    assert builder("j").units(2.0, T0).units_total == 2.0  # another process counts its own
    bad = builder("j")  # a count the collector refuses: the totals after it would count it
    assert [bad.units(u, T0).HasField("units_total") for u in (1.0, float("inf"), 1.0)] == [True, False, False]
    assert not b.open(T0).HasField("units_total")


def _units(b: object, start: int, every_s: int, rng: random.Random, *, ordered: bool = True) -> list[wire.pb.JobEvent]:
    """A ramp to a plateau of UNITS events from builder ``b``, some at one instant, some on the grid's edges."""
    events = []
    for k, t in enumerate(range(start + every_s * S, start + SECONDS * S, every_s * S)):
        if not ordered and k % 7 == 3:
            t -= 2 * every_s * S
        events.append(b.units(float(min(k, 20) * 3 + rng.randrange(3)), t))  # type: ignore[attr-defined]
        if k % 11 == 5:
            events.append(b.units(4.0, t))  # type: ignore[attr-defined]
    return events


def fill(store: Store, job_id: str) -> Written:
    """``job_id`` on six hosts, one hard case each (module docstring); returns what was written."""
    rng = random.Random(job_id)
    start, end = T0, T0 + SECONDS * S
    written = Written()
    grid = UnitCuts(start, end, grid_bins(start, end, SaturationParams())).instants
    for host in ("one", "edges", "two", "unordered", "old", "late"):
        main = builder(job_id)
        write(store, host, [main.open(start)])
        written.add(host, [main.open(start)])
        events = _units(main, start, 5 if host != "edges" else 60, rng, ordered=host != "unordered")
        if host == "edges":  # on every grid edge and 1 ns either side of it
            events = [main.units(float(k % 5), t + d) for k, t in enumerate(grid[1:-1]) for d in (-1, 0, 1)]
        if host == "two":
            events += _units(builder(job_id), start, 7, rng)
        if host == "old":
            for e in events:
                e.ClearField("units_total")
        lost = []
        if host == "late":  # its first events never reached the store
            lost, events = events[:10], events[10:]
        assert events
        write(store, host, events[::2])
        write(store, host, events[1::2], times=2)  # resent
        write(store, host, [main.close(0, end)])
        written.add(host, events)
        if lost:  # their units count at its first stored event: its total says them
            at = written.units.index((host, events[0].time_ns, events[0].event_seq, events[0].units))
            written.units[at] = (*written.units[at][:3], events[0].units + sum(e.units for e in lost))
            assert written.units[at][3] == events[0].units_total
    return written


#: fill's saturation point: within a bin of the knee of its processes reporting every 5 s and
#: of the one reporting every 7 s; its plateau: five processes' PLATEAU units per 5 s and one's
#: per 7 s (the edges host's few units add 0.3 %)
FILL_KNEE = (knee_window_ns(SECONDS, 5)[0], knee_window_ns(SECONDS, 7)[1])
FILL_RATE = PLATEAU * (5 / 5 + 1 / 7)


def check_units(report: Report, written: Written, knee_ns: tuple[int, int], rate: float) -> None:
    """The report's units figures are those written, its saturation point within ``knee_ns``
    and its plateau rate within 2 % of ``rate`` (as tests/unit/test_units_flat.py checks them)."""
    at = report.saturation.at_ns
    assert at is not None and knee_ns[0] <= at <= knee_ns[1], (at - T0) / S
    assert report.saturation.plateau_rate == pytest.approx(rate, rel=0.02)
    warm = written.between(T0, at)
    assert report.job.units_total == written.total
    assert report.units_warmup == pytest.approx(warm, rel=1e-12) and 0 < warm < written.total
    assert report.units_saturated == pytest.approx(written.total - warm, rel=1e-12)


def test_report_figures_from_totals_are_the_written_ones(store: Store) -> None:
    written = fill(store, "j")
    report = build_report(store, "j")
    check_units(report, written, FILL_KNEE, FILL_RATE)
    found = (report.saturation.at_ns, report.saturation.plateau_rate)
    assert found == saturation_from_every_event(store, "j", report.end_ns)
    assert report.saturation.method == "throughput-plateau"
    every = [e for e in store.job_events("j") if e.event == "units"]
    if isinstance(store, SqliteStore):  # the totals are stored (InfluxDB: see the last test)
        rows = store._db.execute("SELECT fields FROM job_events WHERE event = 'units'").fetchall()
        assert sum('"units_total":' in fields for (fields,) in rows) > len(rows) / 2
    start, end = report.job.start_ns, report.end_ns
    for cuts in (UnitCuts(start, end, 60, (start + 123_456_789,)), UnitCuts(0, 0), UnitCuts(start, end, 13)):
        assert store.unit_events("j", cuts) == reduce_units(every, cuts)


def test_sqlite_sums_no_rows_where_the_totals_tell(tmp_path: Path) -> None:
    """One process per host with totals: SQLite answers from index lookups, no SUM over the rows;
    the same job with one host of an older writer sums that host's rows, and only those."""
    with SqliteStore(tmp_path / "w.db") as store:
        rng = random.Random(1)
        written = Written()
        for host in ("a", "b"):
            b = builder("j")
            events = [b.open(T0), *_units(b, T0, 3, rng), b.close(0, T0 + SECONDS * S)]
            write(store, host, events)
            written.add(host, events)
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        report = build_report(store, "j")
        assert not [s for s in statements if "SUM(" in s]
        check_units(report, written, knee_window_ns(SECONDS, 3), 2 * PLATEAU / 3)
        old = builder("j")
        events = [old.open(T0), *_units(old, T0, 3, rng)]
        for e in events:
            e.ClearField("units_total")
        write(store, "c", events)
        written.add("c", events)
        statements.clear()
        report = build_report(store, "j")
        summed = [s for s in statements if "SUM(" in s]
        assert summed and all("('c', " in s and "('a', " not in s and "('b', " not in s for s in summed)
        check_units(report, written, knee_window_ns(SECONDS, 3), 3 * PLATEAU / 3)


def test_totals_that_do_not_add_up_are_not_used(store: Store) -> None:
    """A writer whose totals fall (not as wattline writes them): the rows are summed instead."""
    b = builder("j")
    events = [b.open(T0), *(b.units(5.0, T0 + k * S) for k in range(1, 200)), b.close(0, T0 + 200 * S)]
    for e in events[150:-1]:
        e.units_total = 1.0
    write(store, "h", events[:100] + events[101:])  # one lost: the sum cannot know it
    assert build_report(store, "j").job.units_total == 5.0 * 198


def test_counts_from_totals() -> None:
    """Each event counts its total less the previous one's; its own count where that is it (to
    the totals' rounding); None where the totals cannot say it."""
    tenth = [0.1] * 10
    totals = list(itertools.accumulate(tenth))  # float sums: 0.30000000000000004...
    assert counts_from_totals(tenth, totals) == tenth  # nothing lost: the own counts, as stored
    assert counts_from_totals(tenth[1:], totals[1:]) == [totals[1], *tenth[2:]]  # the first lost
    lost = counts_from_totals([1.0, None, 2.0], [1.0, 4.0, 6.0], before=0.0)
    assert lost == [1.0, 3.0, 2.0]  # units events of 3 lost before the second (a 0 as stored: None)
    assert counts_from_totals([2.0], [5.0], before=3.0) == [2.0]
    for units, totals_ in (([3.0], [2.0]), ([1.0, 1.0], [1.0, None]), ([1.0], [math.nan]), ([1.0], [math.inf])):
        assert counts_from_totals(units, totals_) is None


def test_a_bad_total_is_refused_at_the_door(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "w.db") as store:
        event = builder("j").units(1.0, T0)
        event.units_total = float("nan")
        batch = wire.Batch(stream_id="s", seq=1)
        batch.host.host_id = "h"
        batch.job_events.append(event)
        result = store.write(batch)
        assert result.rejected == 1 and "units must be finite and >= 0" in result.reasons[0]


def test_wattline_report_json_from_totals(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    with SqliteStore(path) as store:
        written = fill(store, "cli-j")
    out = CliRunner().invoke(app, ["report", "cli-j", "--json", "--store", f"sqlite:///{path}"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    at = T0 + round(data["durations_s"]["warmup"] * S)
    assert FILL_KNEE[0] <= at <= FILL_KNEE[1]
    warm = written.between(T0, at)
    saturated = written.total - warm  # under its name and its deprecated one ("measured")
    assert data["units"] == pytest.approx(
        {"total": written.total, "warmup": warm, "saturated": saturated, "measured": saturated}
    )


def test_influxdb_stores_the_total_as_a_float_field(influxd: Influxd) -> None:
    store = InfluxV1Store(influxd.url, influxd.new_database())
    b = builder("j")
    write(store, "h", [b.open(T0), b.units(2.0, T0 + S), b.units(3.0, T0 + 2 * S)])
    rows = store.query("SELECT units, units_total FROM job_events WHERE event = 'units'")
    assert [(r["units"], r["units_total"]) for r in rows] == [(2, 2), (3, 5)]
    fields = store.query("SHOW FIELD KEYS FROM job_events")
    assert {"fieldKey": "units_total", "fieldType": "float"} in fields
