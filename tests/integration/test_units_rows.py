"""InfluxDB reads a job's UNITS rows as columns (units and time_ns; event_seq from the
``seq_block`` tag and the point time, not read) and reduces each host's rows by slices; rows
an older version wrote (no ``seq_block``, no ``time_ns``) are read with their event_seq.

Truth: the unit counts written (whole numbers, so every sum is exact) and the reduction
:func:`reduce_units` makes of every stored event (``store.job_events``): equal, not close,
on both stores, for every shape a host's rows take (one writer; two writers interleaved;
events at one instant; events on the cuts; rows of wattline 3 beside new ones).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from typing import Any

import pytest
from servers import T0, Influxd, sqlite_or_influxdb1_store  # noqa: F401 (fixture store)

from wattline import wire
from wattline.accounting.saturation import SaturationParams, grid_bins
from wattline.accounting.window_energy import window_energy
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.jobs.jobs_view import BadJob, build_view
from wattline.reports.build import build_report
from wattline.stores.influxdb.http import loads
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.reader import UnitCuts, reduce_units
from wattline.stores.sqlite.store import SqliteStore

S = 10**9
END = T0 + 1200 * S
Store = SqliteStore | InfluxV1Store


def write(store: Store, host: str, events: list[wire.pb.JobEvent]) -> None:
    batch = wire.Batch(stream_id=f"s-{host}-{events[0].event_seq}", seq=1)
    batch.host.host_id = host
    batch.job_events.extend(events)
    assert store.write(batch).rejected == 0


def builder() -> EventBuilder:
    return EventBuilder(JobSpec("j", "j", "training", "steps"))


def cuts_of_the_job() -> list[UnitCuts]:
    grid = UnitCuts(T0, END, grid_bins(T0, END, SaturationParams()), (T0 + 333 * S + 7,))
    return [grid, UnitCuts(0, 0), UnitCuts(T0, END, 13)]


def fill(store: Store) -> float:
    """Three hosts of one job, each a shape of rows; returns the units written."""
    total = 0.0
    edges = cuts_of_the_job()[0].instants
    # h1: one writer, times strictly increasing, some exactly on a cut or 1 ns beside it
    b = builder()
    times = sorted({T0 + k * 7 * S for k in range(1, 170)} | {t + d for t in edges[1:-1:5] for d in (-1, 0, 1)})
    events = [b.units(float(k % 9), t) for k, t in enumerate(times)]
    write(store, "h1", [b.open(T0), *events, b.close(0, END)])
    total += sum(e.units for e in events)
    # h2: two processes, each its own event_seq base, interleaved in time
    main, other = builder(), builder()
    write(store, "h2", [main.open(T0)])
    for p, proc in enumerate((main, other)):
        events = [proc.units(float(3 + p), T0 + k * 5 * S + p * S) for k in range(1, 230)]
        write(store, "h2", events)
        total += sum(e.units for e in events)
    write(store, "h2", [main.close(0, END)])
    # h3: several events at one instant, every 11 s
    b = builder()
    events = [b.units(float(n), T0 + k * 11 * S) for k in range(1, 100) for n in (1, 2, 5)]
    write(store, "h3", [b.open(T0), *events, b.close(0, END)])
    return total + sum(e.units for e in events)


def test_every_shape_of_rows_reads_as_the_reduction_of_every_event(store: Store) -> None:
    written = fill(store)
    every = [e for e in store.job_events("j") if e.event == "units"]
    assert sum(e.fields["units"] for e in every) == written
    for cuts in cuts_of_the_job():
        assert store.unit_events("j", cuts) == reduce_units(every, cuts)
    report = build_report(store, "j")
    full = build_view("j", store.job_events("j"))
    split = report.saturation.at_ns if report.saturation.at_ns is not None else full.start_ns
    assert report.job.units_total == written
    assert report.units_warmup == window_energy(full.unit_intervals, full.start_ns, split)


def test_influxdb_rows_of_wattline_3_beside_new_ones_are_read_with_their_event_seq(influxd: Influxd) -> None:
    with InfluxV1Store(influxd.url, influxd.new_database()) as influx:
        total = fill(influx)
        old = [f'job_events,event=open,host=old,job_id=j event_seq=1i,name="j" {T0}']  # no seq_block, no time_ns
        old += [
            f"job_events,event=units,host=old,job_id=j event_seq={k + 1}i,units=2.0 {T0 + k * 3 * S}"
            for k in range(1, 300)
        ]
        assert influx.write_lines(old).written == 300
        every = [e for e in influx.job_events("j") if e.event == "units"]
        assert len([e for e in every if e.host == "old"]) == 299
        for cuts in cuts_of_the_job():
            assert influx.unit_events("j", cuts) == reduce_units(every, cuts)
        assert build_report(influx, "j").job.units_total == total + 2.0 * 299


def test_influxdb_a_bad_count_in_a_row_is_reported_as_from_every_event(influxd: Influxd) -> None:
    """A units value the encoder refuses, written around it (a new-layout row): the report says
    what is wrong, in the words the view of every event uses."""
    with InfluxV1Store(influxd.url, influxd.new_database()) as influx:
        fill(influx)
        t = T0 + 600 * S + 123
        line = f"job_events,event=units,host=h1,job_id=j,seq_block=77 event_seq=77000005i,time_ns={t}i,units=-1.0"
        assert influx.write_lines([f"{line} {t - t % 10**6 + 5}"]).written == 1
        with pytest.raises(BadJob) as got:
            build_report(influx, "j")
        with pytest.raises(BadJob) as truth:
            build_view("j", influx.job_events("j"))
        assert str(got.value) == str(truth.value) and "units" in str(got.value)


def collections_during(decode: Callable[[bytes], Any], data: bytes) -> tuple[Any, int]:
    """What ``decode(data)`` gives, and how many collections the cyclic GC started meanwhile."""
    started: list[dict[str, Any]] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(info)

    gc.callbacks.append(seen)
    try:
        return decode(data), len(started)
    finally:
        gc.callbacks.remove(seen)


@pytest.mark.parametrize("enabled", [True, False])
def test_an_answer_is_decoded_with_the_collector_paused_and_left_as_it_was(enabled: bool) -> None:
    data = json.dumps({"results": [{"series": [{"values": [[k, k / 2] for k in range(20_000)]}]}]}).encode()
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        got, paused = collections_during(loads, data)
        truth, plain = collections_during(json.loads, data)
        assert got == truth and gc.isenabled() is enabled
        assert paused <= 1  # at most one, once the collector is back on
        assert plain >= 10 if enabled else plain == 0  # 20,000 lists: json.loads alone collects
    finally:
        (gc.enable if was else gc.disable)()
