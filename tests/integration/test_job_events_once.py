"""Job events exactly once, and one validation for the wire, the events file and the Python API.

- Identity is (host, job id, event_seq) in both stores: units events that share a time
  stamp all count (events file of a real ``wattline run``; the wire into SQLite and into
  a real ``influxd``), and a resent batch changes nothing.
- Units must be finite and >= 0; a bad one is refused on the wire with its reason (the batch
  is acknowledged) and ``wattline jobs`` still lists; a bad job already stored is a row with
  its error, and ``wattline report`` of it is one line.
- Job ids no store can hold stop ``wattline run`` before the command starts (exit 2).
- InfluxDB's limits (series key size, time range) are the encoder's, so SQLite refuses what
  InfluxDB refuses; a 10 MiB tag gives a short refusal, acknowledged normally.
- A v3 SQLite file upgrades in place to v4 with nothing lost.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from servers import Influxd, make_batch, sqlite_or_influxdb1_store  # noqa: F401 (fixture store)
from store_rows import energy_rows
from test_run_cli import run

from wattline import wire
from wattline.collector.server import CollectorServer
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.jobs.wrappers.job import Job
from wattline.point_limits import MAX_JOB_ID_BYTES, MAX_TIME_NS
from wattline.stores.base import Store
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.lineprotocol import MAX_SERIES_KEY_BYTES
from wattline.stores.sqlite import store as sqlite_module
from wattline.stores.sqlite.store import SqliteStore

S = 10**9
T = 1_780_000_000 * S  # a whole second, as `units 1 <unix second>` gives


@pytest.fixture
def collector() -> Iterator[Any]:
    """``collector(store)``: a real CollectorServer on ``store``; a Push client for it."""
    servers: list[CollectorServer] = []

    def start(store: Store) -> Any:
        server = CollectorServer(store, "127.0.0.1:0")
        server.start()
        servers.append(server)
        return wire.telemetry_stub(grpc.insecure_channel(f"127.0.0.1:{server.port}"))

    yield start
    for server in servers:
        server.stop()


def batch_of(events: list[wire.pb.JobEvent], host: str = "node-1", seq: int = 1) -> wire.pb.Batch:
    batch = wire.Batch(stream_id=f"events-{host}", seq=seq)
    batch.host.host_id = host
    batch.job_events.extend(events)
    return batch


def v3_file(path: Path, rows: list[tuple[str, str, str, int, int, str]]) -> None:
    """A SQLite file as wattline 3 (schema v3) wrote it: ``rows`` of (host, job_id, event,
    time_ns, event_seq, fields JSON)."""
    db = sqlite3.connect(path)
    for version in (1, 2, 3):
        db.executescript(sqlite_module._MIGRATIONS[version])
    db.execute("PRAGMA user_version = 3")
    db.executemany(
        "INSERT INTO job_events (host, labels, job_id, event, time_ns, event_seq, fields) VALUES (?, '{}', ?, ?, ?, ?, ?)",
        rows,
    )
    db.commit()
    db.close()


def units_of(store: SqliteStore | InfluxV1Store, job_id: str) -> list[float]:
    return [float(e.fields["units"]) for e in store.job_events(job_id) if e.event == "units"]


# -- identity: every units event counts, a resent one overwrites itself ---------------------


def test_units_lines_sharing_one_stamp_in_the_events_file_all_count(tmp_path: Path) -> None:
    now = int(time.time())
    script = (
        # three lines at one instant, then thirty at whole seconds over three seconds
        f'for i in 1 2 3; do echo "units 1 {now}.5" >> "$WATTLINE_EVENTS"; done; '
        f'for s in 0 1 2; do for i in 1 2 3 4 5 6 7 8 9 10; do echo "units 1 $(({now} + $s))" >> "$WATTLINE_EVENTS"; '
        "done; done; sleep 0.5"
    )
    out = run(tmp_path, "run", "--job-id", "stamps-1", "--no-report", "--", "sh", "-c", script)
    assert out.returncode == 0, out.stderr
    report = run(tmp_path, "report", "stamps-1", "--json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["units"]["total"] == 33


def test_units_events_at_one_instant_over_the_wire_all_count_and_a_resend_changes_nothing(
    store: SqliteStore | InfluxV1Store, collector: Any
) -> None:
    client = collector(store)
    spec = JobSpec("wire-1", "wire", "training", "steps")
    one, other = EventBuilder(spec), EventBuilder(spec)  # two processes of one job on one host
    events = [one.open(T)] + [one.units(1.0, T + S) for _ in range(30)]
    events += [other.units(1.0, T + S) for _ in range(30)]
    # two events whose point times coincide (same millisecond, same seq % 10**6): two series
    events += [wire.JobEvent(job_id="wire-1", kind=wire.pb.JobEvent.KIND_UNITS, time_ns=T + S, units=1.0)]
    events += [wire.JobEvent(job_id="wire-1", kind=wire.pb.JobEvent.KIND_UNITS, time_ns=T + S, units=1.0)]
    events[-2].event_seq, events[-1].event_seq = 10**6 + 7, 2 * 10**6 + 7
    events.append(one.close(0, T + 2 * S))
    batch = batch_of(events)
    for _ in range(2):  # the agent resends a batch whose Ack it did not get
        ack = client.Push(batch, timeout=30)
        assert (ack.written, ack.rejected) == (len(events), 0), ack.message
        assert units_of(store, "wire-1") == [1.0] * 62
    stored = store.job_events("wire-1")
    assert {e.time_ns for e in stored if e.event == "units"} == {T + S}  # the true time, not the point's


def test_a_v3_file_upgrades_in_place_with_nothing_lost(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    rows = [  # two processes of one job on host a both numbered from 1; a job on host b
        ("a", "j", "open", T, 1, '{"name":"j"}'),
        ("a", "j", "units", T + S, 2, '{"units":5.0}'),
        ("a", "j", "units", T + S + 1, 1, '{"units":7.0}'),
        ("a", "j", "units", T + 2 * S, 2, '{"units":11.0}'),
        ("a", "j", "close", T + 3 * S, 3, '{"exit_code":0}'),
        ("b", "k", "open", T, 1, '{"name":"k"}'),
    ]
    v3_file(path, rows)
    with SqliteStore(path) as store:
        events = store.job_events()
        assert sorted((e.host, e.job_id, e.event, e.time_ns, json.dumps(e.fields)) for e in events) == sorted(
            (h, j, ev, t, json.dumps(json.loads(f), sort_keys=True)) for h, j, ev, t, _, f in rows
        )
        assert units_of(store, "j") == [5.0, 7.0, 11.0]
        assert len({(e.host, e.job_id, e.event_seq) for e in events}) == len(rows)
        # v4: two events at one instant are two events
        b = EventBuilder(JobSpec("j", "j"))
        assert store.write(batch_of([b.units(1.0, T), b.units(1.0, T)], host="a")).written == 2
        assert len(units_of(store, "j")) == 5
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (sqlite_module.SCHEMA_VERSION,)


def test_event_seq_of_processes_of_one_job_never_meet_and_fit_int64() -> None:
    spec = JobSpec("torch-1", "rank")
    firsts = {EventBuilder(spec).units(1.0).event_seq for _ in range(1000)}
    assert len(firsts) == 1000
    assert all(0 < seq < 2**63 - 2**32 for seq in firsts)


# -- one validation: units, job ids ---------------------------------------------------------


@pytest.mark.parametrize("units", [-1.0, math.nan, math.inf])
def test_bad_units_refused_on_the_wire_and_jobs_still_lists(tmp_path: Path, collector: Any, units: float) -> None:
    db = tmp_path / "w.db"
    client = collector(SqliteStore(db))
    b = EventBuilder(JobSpec("units-1", "u"))
    events = [b.open(T), b.units(units, T + S), b.units(4.0, T + S), b.close(0, T + 2 * S)]
    ack = client.Push(batch_of(events), timeout=30)
    assert (ack.written, ack.rejected) == (3, 1)
    assert "units must be finite and >= 0" in ack.message
    listed = run(tmp_path, "jobs", "--json", "--no-energy")
    assert listed.returncode == 0, listed.stderr
    (job,) = json.loads(listed.stdout)
    assert (job["id"], job["units"], job.get("error")) == ("units-1", 4.0, None)


def test_bad_lines_in_the_events_file_are_ignored_with_a_short_reason(tmp_path: Path) -> None:
    lines = [
        "units inf",
        "units -1",
        "units nan",
        "units 1 inf",
        "units 1 1e30",
        "units 1 -5",
        "units 7",
        "units 1e400",
    ]
    script = "".join(f'echo "{line}" >> "$WATTLINE_EVENTS"; ' for line in lines) + "sleep 0.5; exit 4"
    out = run(tmp_path, "run", "--job-id", "lines-1", "--no-report", "--", "sh", "-c", script)
    assert out.returncode == 4, out.stderr  # the command's own status
    assert "ignored line" in out.stderr and "Traceback" not in out.stderr
    report = run(tmp_path, "report", "lines-1", "--json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["units"]["total"] == 7


def test_a_bad_job_already_stored_is_a_row_with_its_error_and_a_one_line_report(tmp_path: Path) -> None:
    events = [  # as an older wattline, which took negative units, wrote them
        ("bad-1", "open", T, 1, '{"name":"bad"}'),
        ("bad-1", "units", T + S, 2, '{"units":-1000.0}'),
        ("bad-1", "close", T + 2 * S, 3, '{"exit_code":0}'),
        ("good-1", "open", T + 3 * S, 1, '{"name":"good"}'),
        ("good-1", "units", T + 4 * S, 2, '{"units":8.0}'),
        ("good-1", "close", T + 5 * S, 3, '{"exit_code":0}'),
    ]
    v3_file(tmp_path / "w.db", [("h", *event) for event in events])
    listed = run(tmp_path, "jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    bad, good = json.loads(listed.stdout)
    assert bad["id"] == "bad-1" and "units -1000.0 is negative" in bad["error"]
    assert good["id"] == "good-1" and good["units"] == 8.0 and "error" not in good
    table = run(tmp_path, "jobs")
    assert table.returncode == 0 and "bad-1" in table.stdout and "good-1" in table.stdout, table.stderr
    report = run(tmp_path, "report", "bad-1")
    assert report.returncode == 1
    assert report.stderr.count("\n") == 1 and "units -1000.0 is negative" in report.stderr, report.stderr


@pytest.mark.parametrize("job_id", ["a\nb", "bad\\", "cr\rhere", "x" * (MAX_JOB_ID_BYTES + 1)])
@pytest.mark.parametrize("where", [[], ["--collector", "127.0.0.1:9"]])
def test_bad_job_ids_stop_wattline_run_before_the_command_starts(tmp_path: Path, job_id: str, where: list[str]) -> None:
    out = run(tmp_path, "run", "--job-id", job_id, *where, "--", sys.executable, "-c", "open('started', 'w')")
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("wattline: error: job id ") and out.stderr.count("\n") == 1, out.stderr
    assert len(out.stderr) < 300
    assert not (tmp_path / "started").exists()


@pytest.mark.parametrize(
    "option",
    [["--host-id", "node\\"], ["--host-id", "a\rb"], ["--config", "labels.toml"]],
    ids=["host-backslash", "host-cr", "label-lf"],
)
def test_a_host_whose_events_no_store_keeps_stops_wattline_run_before_the_command(
    tmp_path: Path, option: list[str]
) -> None:
    (tmp_path / "labels.toml").write_text('[agent]\nlabels = { rack = "r1\\n" }\n')
    out = run(tmp_path, "run", "--job-id", "host-1", *option, "--", sys.executable, "-c", "open('started', 'w')")
    assert out.returncode == 2, out.stderr
    assert "job events from this host cannot be stored" in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert not (tmp_path / "started").exists()


@pytest.mark.parametrize("job_id", ["a\nb", "bad\\", "x" * (MAX_JOB_ID_BYTES + 1)])
def test_the_job_api_refuses_bad_job_ids(job_id: str) -> None:
    with pytest.raises(ValueError, match="job id"):
        Job("x", job_id=job_id)


# -- InfluxDB's limits, the same in every store; short refusals ------------------------------


def test_sqlite_refuses_exactly_what_influxdb_refuses(tmp_path: Path, influxd: Influxd) -> None:
    batch = make_batch(samples=3, labels={}, job_id="limits-1")
    prefix = len("energy,component=gpu,device=,host=node-1,quality=counter,source=nvml")
    batch.samples[0].device = "d" * (MAX_SERIES_KEY_BYTES - prefix)  # the longest series key
    batch.samples[1].device = "d" * (MAX_SERIES_KEY_BYTES - prefix + 1)  # one byte more
    batch.samples[2].start_ns, batch.samples[2].end_ns = MAX_TIME_NS, MAX_TIME_NS + 1  # time outside the range
    # a point time (the event's millisecond + event_seq % 10**6) past the range
    batch.job_events[1].time_ns, batch.job_events[1].event_seq = MAX_TIME_NS, 999_999
    influx = InfluxV1Store(influxd.url, influxd.new_database())
    with SqliteStore(tmp_path / "w.db") as sqlite, influx:
        results = [store.write(batch) for store in (sqlite, influx)]
        assert [(r.written, r.rejected) for r in results] == [(1 + 3, 3)] * 2, results
        for r in results:
            assert "longer than" in r.reasons[0] and all("outside InfluxDB's range" in x for x in r.reasons[1:])
        assert len(influxd.query("SELECT energy_j FROM energy", influx.database)) == 1  # influxd took the longest
        assert len(energy_rows(sqlite)) == 1


def test_a_10_mib_tag_is_refused_with_a_short_message_and_acknowledged(
    tmp_path: Path, collector: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = collector(SqliteStore(tmp_path / "w.db"))
    batch = make_batch(samples=2, job_id="big-1")
    batch.samples[0].device = "x" * (10 << 20)
    batch.job_events[1].job_id = "y" * (4 << 20)  # both under the collector's 16 MiB
    with caplog.at_level(logging.INFO):
        ack = client.Push(batch, timeout=60)  # a reply over gRPC's 4 MiB would fail here
    assert (ack.written, ack.rejected) == (1 + 3, 2)
    assert len(ack.message) < 1000 and "10485760 characters" in ack.message
    assert max(len(r.getMessage()) for r in caplog.records) < 2000


def test_influxdb_points_written_before_time_ns_read_as_before(influxd: Influxd) -> None:
    with InfluxV1Store(influxd.url, influxd.new_database()) as influx:
        old = [  # as wattline 3 wrote them: no seq_block tag, point time = event time, no time_ns field
            f'job_events,event=open,host=h,job_id=old-1 event_seq=1i,name="old" {T}',
            f"job_events,event=units,host=h,job_id=old-1 event_seq=2i,units=5.0 {T + S}",
        ]
        assert influx.write_lines(old).written == 2
        b = EventBuilder(JobSpec("old-1", "old"))
        assert influx.write(batch_of([b.units(1.0, T + S + 1), b.close(0, T + 2 * S)], host="h")).written == 2
        events = influx.job_events("old-1")
        assert [(e.event, e.time_ns) for e in events] == [
            ("open", T),
            ("units", T + S),
            ("units", T + S + 1),
            ("close", T + 2 * S),
        ]
        assert units_of(influx, "old-1") == [5.0, 1.0]


def test_an_unclosed_job_is_last_heard_at_its_true_event_time(store: SqliteStore | InfluxV1Store) -> None:
    b = EventBuilder(JobSpec("heard-1", "heard"))
    last = T + 30 * S + 123_456  # inside a millisecond: the InfluxDB point lies later in it
    assert store.write(batch_of([b.open(T), b.units(2.0, T + S), b.heartbeat(last)])).written == 3
    heard = [e for e in store.job_events_between(T, T + 60 * S, ["node-1"]) if e.event == "heartbeat"]
    assert [(e.job_id, e.time_ns) for e in heard] == [("heard-1", last)]


def test_a_bad_count_on_stdout_never_stops_the_pump(tmp_path: Path) -> None:
    # the pump died on a count add_units refuses, and the command then blocked on a full pipe
    script = 'echo "nan done"; echo "-3 done"; echo "inf done"; echo "5 done"; seq 30000'
    out = run(
        tmp_path,
        *("run", "--job-id", "pump-1", "--no-report", "--units-from-stdout", r"^(\S+) done"),
        *("--", "sh", "-c", script),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n") == 4 + 30000  # every line passed through
    report = run(tmp_path, "report", "pump-1", "--json")
    assert json.loads(report.stdout)["units"]["total"] == 5
