"""SqliteStore: the embedded default back-end."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import T0, make_batch
from store_rows import energy_rows, job_event_rows

from wattline import wire
from wattline.stores.base import StoreUnavailable, WriteResult
from wattline.stores.schema import SAMPLE_FIELDS, host_tags
from wattline.stores.sqlite.schema import _ENERGY_COLUMNS
from wattline.stores.sqlite.store import SCHEMA_VERSION, SqliteStore, _json


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "sub" / "wattline.db") as opened:
        assert isinstance(opened, SqliteStore)
        yield opened


def test_samples_come_back_exactly(store: SqliteStore) -> None:
    result = store.write(make_batch(samples=4))
    assert (result.written, result.rejected, result.reasons) == (4, 0, [])
    rows = energy_rows(store)
    assert [r["time_ns"] for r in rows] == [T0 + (i + 1) * 10**9 for i in range(4)]
    assert rows[0] == {
        "host": "node-1",
        "source": "nvml",
        "component": "gpu",
        "device": "GPU-0",
        "quality": "counter",
        "labels": {"cluster": "c1", "region": "eu-west-1"},
        "time_ns": T0 + 10**9,
        "start_ns": T0,
        "energy_j": 250.125,
        "power_w": 250.125,
        "cumulative_j": 1000.5,
        "interval_s": 1.0,
        "utilization": 0.5,
        "healthy": True,
        "status": "",
        "energy_error_j": 0.25,
        "stream": "stream-a",
        "gauges": {"memory_used_bytes": 1.5e10},
    }
    last = rows[-1]
    assert (last["healthy"], last["status"], last["utilization"], last["energy_error_j"], last["gauges"]) == (
        False,
        "GPU is lost",
        None,
        None,
        {},
    )


def test_float_precision_is_exact(store: SqliteStore) -> None:
    batch = make_batch(samples=1)
    values = [0.1 + 0.2, 1 / 3, 123456789.12345679, 5e-324, 1.7976931348623157e308, -0.0]
    batch.samples[0].energy_j = values[0]
    for i, value in enumerate(values):
        batch.samples[0].gauges[f"g{i}"] = value
    store.write(batch)
    (row,) = energy_rows(store)
    assert row["energy_j"] == values[0]
    assert [row["gauges"][f"g{i}"] for i in range(len(values))] == values


def test_writing_a_batch_twice_leaves_one_copy_and_the_last_write_wins(store: SqliteStore) -> None:
    batch = make_batch(samples=6, job_id="job-1")
    assert store.write(batch).written == 10
    batch.samples[0].energy_j = 1.25
    batch.job_events[1].units = 7.0
    assert store.write(batch).written == 10
    rows = energy_rows(store)
    assert len(rows) == 6 and rows[0]["energy_j"] == 1.25
    events = job_event_rows(store)
    assert len(events) == 4 and events[1]["fields"]["units"] == 7.0


def test_job_events_are_stored(store: SqliteStore) -> None:
    store.write(make_batch(samples=0, job_id="job-1"))
    store.write(make_batch(host="node-2", samples=0, job_id="job-2"))
    rows = job_event_rows(store, "job-1")
    assert [(r["event"], r["event_seq"], r["time_ns"], r["host"]) for r in rows] == [
        ("open", 1, T0, "node-1"),
        ("units", 2, T0 + 1_500_000_000, "node-1"),
        ("phase", 3, T0 + 2_000_000_000, "node-1"),
        ("close", 4, T0 + 3_000_000_000, "node-1"),
    ]
    assert rows[0]["fields"] == {
        "name": "resnet 50, bs=64",
        "job_kind": "training",
        "unit_name": "images",
        "devices": "gpu:0,gpu:1",
        "label_team": "vision",
        "label_owner": 'a "quoted" name',
    }
    assert rows[0]["labels"] == {"cluster": "c1", "region": "eu-west-1"}
    assert rows[3]["fields"] == {"exit_code": 137}
    assert len(job_event_rows(store)) == 8


def test_energy_filters(store: SqliteStore) -> None:
    store.write(make_batch(host="a", samples=4))
    store.write(make_batch(host="b", samples=4))
    assert len(energy_rows(store, host="a")) == 4
    window = energy_rows(store, start_ns=T0 + 2 * 10**9, end_ns=T0 + 4 * 10**9)
    assert [(r["host"], r["time_ns"]) for r in window] == [
        ("a", T0 + 2 * 10**9),
        ("b", T0 + 2 * 10**9),
        ("a", T0 + 3 * 10**9),
        ("b", T0 + 3 * 10**9),
    ]


def test_points_influxdb_refuses_are_refused_here_too(store: SqliteStore) -> None:
    batch = make_batch(samples=3, job_id="job\n1")
    batch.samples[1].gauges["bad"] = float("inf")
    result = store.write(batch)
    assert (result.written, result.rejected) == (2, 5)
    assert "'bad' is inf" in result.reasons[0] and "line feed" in result.reasons[1]
    assert len(energy_rows(store)) == 2 and job_event_rows(store) == []


def test_schema_is_versioned_and_reopened(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    with SqliteStore(path) as store:
        store.write(make_batch(samples=2))
    with SqliteStore(path) as store:
        assert len(energy_rows(store)) == 2
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreUnavailable, match="newer"):
        SqliteStore(path)


def test_a_creator_stopped_midway_leaves_no_store_readers_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped while it creates the schema (kill -9, here an exception at that point), a
    writer leaves no file at the store's path: readers find "no store", and the next writer
    creates it whole. (In place, it left a SQLite file without tables that every reader
    refused as "not a wattline store".)"""
    path = tmp_path / "w.db"

    def stopped(self: SqliteStore, db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half (x)")
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(SqliteStore, "_migrate", stopped)
        with pytest.raises(KeyboardInterrupt):
            SqliteStore(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with SqliteStore(path) as store:
        store.write(make_batch(samples=2))
    with SqliteStore(path, read_only=True) as reader:
        assert len(energy_rows(reader)) == 2
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("w.db")) == []


def test_unusable_path_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreUnavailable):
        SqliteStore(tmp_path / "file" / "w.db")
    (tmp_path / "junk.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreUnavailable):
        SqliteStore(tmp_path / "junk.db")


def test_concurrent_writers(store: SqliteStore) -> None:
    errors: list[BaseException] = []

    def write(host: str) -> None:
        try:
            for seq in range(10):
                store.write(make_batch(host=host, samples=5, t0=T0 + seq * 10**10, seq=seq, job_id=f"j{seq}"))
                energy_rows(store, host=host)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(f"h{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(energy_rows(store)) == 200 and len(job_event_rows(store)) == 160


def test_in_memory() -> None:
    with SqliteStore(":memory:") as store:
        assert store.write(make_batch(samples=1)).written == 1
        assert len(energy_rows(store)) == 1


# -- group commit --------------------------------------------------------------------------


def test_a_group_is_written_at_once_with_a_result_per_batch(store: SqliteStore) -> None:
    good_a = make_batch(host="a", samples=3)
    bad_b = make_batch(host="b", samples=3, job_id="job-b")
    bad_b.samples[1].gauges["bad"] = float("nan")
    good_c = make_batch(host="c", samples=2, job_id="job-c")
    results = store.write_group([good_a, bad_b, good_c])
    assert [(r.written, r.rejected) for r in results] == [(3, 0), (6, 1), (6, 0)]
    assert results[0].reasons == [] and results[2].reasons == []
    (reason,) = results[1].reasons
    assert "host='b'" in reason and "'bad' is nan" in reason
    rows = energy_rows(store)
    assert sorted({r["host"] for r in rows}) == ["a", "b", "c"] and len(rows) == 7
    assert len(job_event_rows(store)) == 8
    # resending the whole group (its acknowledgement was lost) leaves one copy
    again = store.write_group([good_a, bad_b, good_c])
    assert [(r.written, r.rejected) for r in again] == [(3, 0), (6, 1), (6, 0)]
    assert len(energy_rows(store)) == 7 and len(job_event_rows(store)) == 8
    assert store.write_group([]) == []


def test_write_is_a_group_of_one(store: SqliteStore) -> None:
    batch = make_batch(samples=3, job_id="job\n1")
    (grouped,) = store.write_group([batch])
    with SqliteStore(":memory:") as other:
        single = other.write(batch)
    assert (grouped.written, grouped.rejected, grouped.reasons) == (single.written, single.rejected, single.reasons)
    assert (single.written, single.rejected) == (3, 4)


def _series_rows(path: Path) -> list[tuple[str, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT * FROM series ORDER BY 1, 2, 3, 4, 5").fetchall()
    finally:
        db.close()


def test_a_failed_group_writes_none_of_its_batches(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    with SqliteStore(path) as store:
        store._db.execute(
            "CREATE TRIGGER boom BEFORE INSERT ON job_events WHEN NEW.job_id = 'boom' "
            "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
        )
        group = [make_batch(host="a", samples=4), make_batch(host="b", samples=2, job_id="boom")]
        with pytest.raises(StoreUnavailable, match="injected failure"):
            store.write_group(group)
        assert energy_rows(store) == [] and job_event_rows(store) == []
        assert _series_rows(path) == []
        store._db.execute("DROP TRIGGER boom")
        # the retry writes everything, series included (a rolled-back series is not taken as known)
        assert [r.written for r in store.write_group(group)] == [4, 6]
        assert len(energy_rows(store)) == 6 and len(job_event_rows(store)) == 4
    assert _series_rows(path) == [
        ("a", "nvml", "gpu", "GPU-0", "counter"),
        ("a", "nvml", "gpu", "GPU-1", "counter"),
        ("b", "nvml", "gpu", "GPU-0", "counter"),
        ("b", "nvml", "gpu", "GPU-1", "counter"),
    ]


def test_a_locked_database_is_unavailable_and_the_store_recovers(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    with SqliteStore(path, timeout_s=0.05) as store:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
        with pytest.raises(StoreUnavailable, match="locked"):
            store.write_group([make_batch(samples=2), make_batch(host="b", samples=2)])
        other.execute("ROLLBACK")
        other.close()
        assert not store._db.in_transaction
        assert [r.written for r in store.write_group([make_batch(samples=2)])] == [2]


def test_known_series_are_read_at_open_and_only_new_ones_inserted(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    with SqliteStore(path) as store:
        store.write(make_batch(samples=2))
    with SqliteStore(path) as store:
        assert store._series == {("node-1", "nvml", "gpu", f"GPU-{i}", "counter") for i in range(2)}
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        store.write(make_batch(samples=2, t0=T0 + 10**10))
        assert not any("INTO series" in s for s in statements)
        store.write(make_batch(samples=3, t0=T0 + 10**11))  # GPU-0, GPU-1 again: still known
        assert not any("INTO series" in s for s in statements)
        store.write(make_batch(host="new", samples=1))
        assert any("INTO series" in s for s in statements)
    assert len(_series_rows(path)) == 3


# -- the fast per-sample path stores exactly what the checked path does ---------------------


def _odd_batch() -> wire.pb.Batch:
    """Samples that exercise every branch: gauges of reserved names, non-finite values,
    a bad gauge key, an unknown quality number, a host label InfluxDB refuses elsewhere."""
    batch = make_batch(samples=6)
    s = batch.samples
    s[0].gauges.update({"status": 1.0, "host": 2.0, "b": 3.0, "a%d": 4.0, 'é"q': 5.0})
    s[1].gauges["bad\\key"] = 1.0
    s[2].energy_j = float("inf")
    s[3].utilization = float("-inf")
    s[4].quality = 17  # type: ignore[assignment]  # an unknown quality number: stored as "unspecified"
    s[5].energy_error_j = 1e308
    s[5].cumulative_j = 1e308  # finite values whose sum overflows
    extra = batch.samples.add()
    extra.CopyFrom(s[0])
    extra.device = "ends with a backslash\\"
    extra.end_ns += 10**9
    return batch


def test_fast_path_rows_equal_checked_rows() -> None:
    with SqliteStore(":memory:") as store:
        for batch in (_odd_batch(), make_batch(samples=5), _odd_batch()):  # second time: caches warm
            prepared = store._prepare(batch)
            reference = WriteResult()
            host = host_tags(batch)
            labels = _json({k: v for k, v in host.items() if k != "host"})
            expected = [store._checked_row(host, labels, batch.stream_id, s, reference) for s in batch.samples]
            assert prepared.energy == [row for row in expected if row is not None]
            assert (prepared.result.rejected, prepared.result.reasons) == (reference.rejected, reference.reasons)
            assert [type(v) for row in prepared.energy for v in row] == [
                type(v) for row in expected if row is not None for v in row
            ]
        odd = store._prepare(_odd_batch())
        assert odd.result.rejected == 4  # bad key, inf, -inf, tag ending in a backslash; not the 1e308s
        assert odd.energy[2][8:11] == (255.125, 255.125, 1e308) and odd.energy[2][15] == 1e308
        assert json.loads(odd.energy[0][-1]) == {"memory_used_bytes": 1.5e10, "b": 3.0, "a%d": 4.0, 'é"q': 5.0}
        assert odd.energy[1][4] == "unspecified"


def test_every_sample_field_has_a_column() -> None:
    """A field added to SAMPLE_FIELDS needs a column (and the fast path reading it)."""
    assert {f.name for f in SAMPLE_FIELDS} <= set(_ENERGY_COLUMNS.split(", "))
