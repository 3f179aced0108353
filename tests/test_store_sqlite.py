"""SqliteStore: the embedded default back-end."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import T0, make_batch

from wattline.collector.stores.base import StoreUnavailable
from wattline.collector.stores.sqlite import SCHEMA_VERSION, SqliteStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "sub" / "wattline.db") as opened:
        assert isinstance(opened, SqliteStore)
        yield opened


def test_samples_come_back_exactly(store: SqliteStore) -> None:
    result = store.write(make_batch(samples=4))
    assert (result.written, result.rejected, result.reasons) == (4, 0, [])
    rows = store.query_energy()
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
    (row,) = store.query_energy()
    assert row["energy_j"] == values[0]
    assert [row["gauges"][f"g{i}"] for i in range(len(values))] == values


def test_writing_a_batch_twice_leaves_one_copy_and_the_last_write_wins(store: SqliteStore) -> None:
    batch = make_batch(samples=6, job_id="job-1")
    assert store.write(batch).written == 10
    batch.samples[0].energy_j = 1.25
    batch.job_events[1].units = 7.0
    assert store.write(batch).written == 10
    rows = store.query_energy()
    assert len(rows) == 6 and rows[0]["energy_j"] == 1.25
    events = store.query_job_events()
    assert len(events) == 4 and events[1]["fields"]["units"] == 7.0


def test_job_events_are_stored(store: SqliteStore) -> None:
    store.write(make_batch(samples=0, job_id="job-1"))
    store.write(make_batch(host="node-2", samples=0, job_id="job-2"))
    rows = store.query_job_events("job-1")
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
    assert len(store.query_job_events()) == 8


def test_energy_filters(store: SqliteStore) -> None:
    store.write(make_batch(host="a", samples=4))
    store.write(make_batch(host="b", samples=4))
    assert len(store.query_energy(host="a")) == 4
    window = store.query_energy(start_ns=T0 + 2 * 10**9, end_ns=T0 + 4 * 10**9)
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
    assert len(store.query_energy()) == 2 and store.query_job_events() == []


def test_schema_is_versioned_and_reopened(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    with SqliteStore(path) as store:
        store.write(make_batch(samples=2))
    with SqliteStore(path) as store:
        assert len(store.query_energy()) == 2
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreUnavailable, match="newer"):
        SqliteStore(path)


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
                store.query_energy(host=host)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(f"h{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(store.query_energy()) == 200 and len(store.query_job_events()) == 160


def test_in_memory() -> None:
    with SqliteStore(":memory:") as store:
        assert store.write(make_batch(samples=1)).written == 1
        assert len(store.query_energy()) == 1
