"""InfluxV1Store against a real influxd 1.x."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from servers import T0, Influxd, free_port, make_batch

from wattline.stores.base import StoreUnavailable
from wattline.stores.influxdb import v1 as influx_v1
from wattline.stores.influxdb.http import rejected_points
from wattline.stores.influxdb.influxql import QueryError, quote_literal
from wattline.stores.influxdb.v1 import InfluxV1Store


@pytest.fixture
def store(influxd: Influxd) -> Iterator[InfluxV1Store]:
    with InfluxV1Store(influxd.url, influxd.new_database()) as opened:
        assert isinstance(opened, InfluxV1Store)
        yield opened


def count(store: InfluxV1Store, measurement: str = "energy") -> int:
    rows = store.query(f"SELECT COUNT(*) FROM {measurement}")
    return max((v for k, v in rows[0].items() if k.startswith("count_")), default=0) if rows else 0


def test_samples_come_back_exactly(store: InfluxV1Store) -> None:
    result = store.write(make_batch(samples=4))
    assert (result.written, result.rejected, result.reasons) == (4, 0, [])
    rows = store.query("SELECT * FROM energy WHERE host = 'node-1' ORDER BY time")
    assert [r["time"] for r in rows] == [T0 + (i + 1) * 10**9 for i in range(4)]
    first = rows[0]
    assert {k: first[k] for k in ("host", "cluster", "region", "source", "component", "device", "quality")} == {
        "host": "node-1",
        "cluster": "c1",
        "region": "eu-west-1",
        "source": "nvml",
        "component": "gpu",
        "device": "GPU-0",
        "quality": "counter",
    }
    assert first["energy_j"] == 250.125 and first["power_w"] == 250.125 and first["cumulative_j"] == 1000.5
    assert first["interval_s"] == 1.0 and first["start_ns"] == T0 and first["healthy"] is True
    assert first["utilization"] == 0.5 and first["energy_error_j"] == 0.25 and first["memory_used_bytes"] == 1.5e10
    assert first["stream"] == "stream-a" and first["status"] is None
    last = rows[-1]
    assert last["healthy"] is False and last["status"] == "GPU is lost" and last["utilization"] is None
    assert [r["cumulative_j"] for r in rows] == [1000.5 + 250.125 * i for i in range(4)]


def test_float_precision_is_exact(store: InfluxV1Store) -> None:
    batch = make_batch(samples=1)
    values = [0.1 + 0.2, 1 / 3, 123456789.12345679, 5e-324, 1.7976931348623157e308]
    for i, value in enumerate(values):
        batch.samples[0].gauges[f"g{i}"] = value
    store.write(batch)
    (row,) = store.query("SELECT g0, g1, g2, g3, g4 FROM energy")
    assert [row[f"g{i}"] for i in range(5)] == values


def test_writing_a_batch_twice_leaves_one_copy(store: InfluxV1Store) -> None:
    batch = make_batch(samples=6, job_id="job-1")
    assert store.write(batch).written == 10
    assert store.write(batch).written == 10
    assert count(store) == 6 and count(store, "job_events") == 4


def test_last_write_wins(store: InfluxV1Store) -> None:
    batch = make_batch(samples=1)
    store.write(batch)
    batch.samples[0].energy_j = 99.5
    store.write(batch)
    assert [r["energy_j"] for r in store.query("SELECT energy_j FROM energy")] == [99.5]


def test_job_events_are_stored(store: InfluxV1Store) -> None:
    store.write(make_batch(samples=0, job_id="job 1,x=y"))
    rows = store.query(f"SELECT * FROM job_events WHERE job_id = {quote_literal('job 1,x=y')} ORDER BY time")
    # the true time is the field time_ns; the point time is its millisecond + event_seq (identity)
    assert [(r["event"], r["event_seq"], r["time_ns"], r["time"], r["seq_block"]) for r in rows] == [
        ("open", 1, T0, T0 + 1, "0"),
        ("units", 2, T0 + 1_500_000_000, T0 + 1_500_000_002, "0"),
        ("phase", 3, T0 + 2_000_000_000, T0 + 2_000_000_003, "0"),
        ("close", 4, T0 + 3_000_000_000, T0 + 3_000_000_004, "0"),
    ]
    opened, units, phase, closed = rows
    assert (opened["name"], opened["job_kind"], opened["unit_name"]) == ("resnet 50, bs=64", "training", "images")
    assert (opened["devices"], opened["label_team"], opened["label_owner"]) == (
        "gpu:0,gpu:1",
        "vision",
        'a "quoted" name',
    )
    assert opened["host"] == "node-1" and opened["cluster"] == "c1"
    assert units["units"] == 512.0 and phase["phase"] == "saturated" and closed["exit_code"] == 137


def test_database_is_created_on_first_use_and_again_if_dropped(influxd: Influxd) -> None:
    database = influxd.new_database()
    with InfluxV1Store(influxd.url, database) as first, InfluxV1Store(influxd.url, database) as second:
        assert first.write(make_batch(samples=1)).written == 1
        assert second.write(make_batch(samples=2)).written == 2  # CREATE DATABASE is idempotent
        influxd.query(f'DROP DATABASE "{database}"')
        assert first.write(make_batch(samples=3)).written == 3
        assert count(first) == 3


def test_field_type_conflict_rejects_only_that_point(store: InfluxV1Store) -> None:
    store.write(make_batch(samples=2))
    good = store.encoder.line("energy", {"host": "node-2"}, {"energy_j": 5.5}, T0)
    bad = store.encoder.line("energy", {"host": "node-3"}, {"energy_j": "five"}, T0)
    result = store.write_lines([good, bad, good.replace(str(T0), str(T0 + 1))])
    assert (result.written, result.rejected) == (2, 1)
    (reason,) = result.reasons
    assert "field type conflict" in reason and '"energy_j"' in reason
    assert count(store) == 4
    assert store.query("SELECT energy_j FROM energy WHERE host = 'node-3'") == []


def test_unencodable_points_are_rejected_with_the_reason(store: InfluxV1Store) -> None:
    batch = make_batch(samples=3, job_id="job\n1")
    batch.samples[1].gauges["bad"] = float("nan")
    result = store.write(batch)
    assert (result.written, result.rejected) == (2, 5)
    assert "'bad' is nan" in result.reasons[0] and all("line feed" in r for r in result.reasons[1:])
    assert count(store) == 2


def test_unparsable_lines_count_as_rejected(store: InfluxV1Store) -> None:
    good = store.encoder.line("energy", {"host": "a"}, {"energy_j": 1.0}, T0)
    result = store.write_lines([good, "energy,host=b energy_j=", "energy,host=c"])
    assert (result.written, result.rejected) == (1, 2) and "unable to parse" in result.reasons[0]


def test_rejected_points_parsing() -> None:
    assert rejected_points("partial write: field type conflict: ... dropped=3", 10) == 3
    assert rejected_points("unable to parse 'x': a\nunable to parse 'y': b", 2) == 2
    assert rejected_points("partial write: unable to parse 'x': bad dropped=0", 5) == 1
    assert rejected_points("database is required", 4) is None


def test_big_batches_go_in_several_requests(store: InfluxV1Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(influx_v1, "MAX_BODY_BYTES", 2000)
    assert store.write(make_batch(samples=40)).written == 40
    assert count(store) == 40


def test_concurrent_writers_share_the_store(store: InfluxV1Store) -> None:
    """Four threads, five batches of four samples each, through one store: every batch is
    acknowledged in full and every point comes back. (Once, beside two busy loops, 76 of 80
    came back with no error raised; each write's result is now checked, and the count read
    again for 2 s, so a failure says whether a write was refused, or acknowledged and lost.)"""
    errors: list[BaseException] = []
    results: list[tuple[str, int, int, list[str]]] = []

    def write(host: str) -> None:
        try:
            for seq in range(5):
                r = store.write(make_batch(host=host, samples=4, t0=T0 + seq * 10**10, seq=seq))
                results.append((f"{host}#{seq}", r.written, r.rejected, r.reasons))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(f"h{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(r for r in results if r[1:] != (4, 0, [])) == [] and len(results) == 20
    deadline = time.monotonic() + 2.0
    while (n := count(store)) < 80 and time.monotonic() < deadline:
        time.sleep(0.1)  # poll: a lost point and a late one read differently
    per_host = store.query("SELECT COUNT(energy_j) FROM energy GROUP BY host")
    assert n == 80, f"{n} of 80 acknowledged points came back: {per_host}"


def test_retention_policy(influxd: Influxd) -> None:
    database = influxd.new_database()
    with InfluxV1Store(influxd.url, database, retention_policy="autogen") as store:
        assert store.write(make_batch(samples=1)).written == 1
    with InfluxV1Store(influxd.url, database, retention_policy="nope") as store, pytest.raises(StoreUnavailable):
        store.write(make_batch(samples=1))


def test_ping_and_query_errors(store: InfluxV1Store) -> None:
    assert store.ping().startswith("1.")
    with pytest.raises(QueryError, match="error parsing query"):
        store.query("SELEC nothing")
    with pytest.raises(QueryError, match="database not found"):
        store.query("SELECT * FROM energy")  # nothing written yet: no database


def test_unreachable_server_is_unavailable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with InfluxV1Store(url, "db", timeout_s=2) as store:
        with pytest.raises(StoreUnavailable, match=r"127\.0\.0\.1"):
            store.write(make_batch(samples=1))
        with pytest.raises(StoreUnavailable):
            store.query("SHOW DATABASES")
        with pytest.raises(StoreUnavailable):
            store.ping()


def test_a_dropped_keepalive_connection_is_replaced(influxd: Influxd) -> None:
    with InfluxV1Store(influxd.url, influxd.new_database()) as store:
        store.write(make_batch(samples=1))
        assert store._http._idle
        for conn in store._http._idle:
            assert conn.sock is not None
            conn.sock.close()  # as if the server had closed it
        assert store.write(make_batch(samples=2)).written == 2


def test_credentials_are_sent_but_never_shown(influxd: Influxd) -> None:
    url = influxd.url.replace("http://", "http://writer:s3cret@")
    with InfluxV1Store(url, influxd.new_database()) as store:
        assert "s3cret" not in repr(store) and store.url == influxd.url
        assert store.write(make_batch(samples=1)).written == 1  # auth is off: the header is ignored
    with InfluxV1Store(f"http://127.0.0.1:{free_port()}", "db", "writer", "s3cret") as store:
        with pytest.raises(StoreUnavailable) as raised:
            store.write(make_batch(samples=1))
        assert "s3cret" not in str(raised.value)
