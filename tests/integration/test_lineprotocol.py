"""The line-protocol encoder: escaping rules, values, caches, and the real influxd round trip."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from servers import T0, Influxd, make_batch
from store_rows import energy_rows, job_event_rows

from wattline import wire
from wattline.stores.influxdb.influxql import quote_literal
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.lineprotocol import (
    LineEncoder,
    LineProtocolError,
    escape_field_key,
    escape_measurement,
    escape_tag,
    quote_string,
)
from wattline.stores.schema import SAMPLE_FIELD_NAMES
from wattline.stores.sqlite.store import SqliteStore


def test_escaping_per_position() -> None:
    assert escape_measurement("a b,c=d") == "a\\ b\\,c=d"
    assert escape_tag('a b,c=d"e\\f') == 'a\\ b\\,c\\=d"e\\f'
    assert escape_field_key("a b,c=d") == "a\\ b\\,c\\=d"
    assert quote_string('say "hi"\\ \n') == '"say \\"hi\\"\\\\ \n"'


def test_one_point() -> None:
    line = LineEncoder().line("m", {"b": "x y", "a": "1", "empty": ""}, {"f": 0.1, "i": -3, "t": True, "s": 'q"'}, 5)
    assert line == 'm,a=1,b=x\\ y f=0.1,i=-3i,t=true,s="q\\"" 5'


@pytest.mark.parametrize("value", [0.1, 1e-300, 5e-324, 1.7976931348623157e308, -0.0, 1e16, 123456789.12345679])
def test_floats_are_exact(value: float) -> None:
    text = LineEncoder().line("m", {}, {"f": value}, 0).split(" ")[1].removeprefix("f=")
    assert float(text) == value and math.copysign(1, float(text)) == math.copysign(1, value)


@pytest.mark.parametrize(
    ("tags", "fields", "reason"),
    [
        ({"k": "a\nb"}, {"f": 1.0}, "line feed"),
        ({"k\n": "a"}, {"f": 1.0}, "line feed"),
        ({"k": "a\rb"}, {"f": 1.0}, "carriage return"),
        ({"k": "\x00"}, {"f": 1.0}, "NUL"),
        ({}, {"a\rb": 1.0}, "carriage return"),
        ({"k": "a\\"}, {"f": 1.0}, "backslash"),
        ({"": "a"}, {"f": 1.0}, "tag key"),
        ({"time": "a"}, {"f": 1.0}, "tag key"),
        ({}, {"f": math.nan}, "nan"),
        ({}, {"f": math.inf}, "inf"),
        ({}, {"f": -math.inf}, "inf"),
        ({}, {"i": 2**63}, "int64"),
        ({}, {"a\\b": 1.0}, "backslash"),
        ({}, {"\tx": 1.0}, "tab"),
        ({}, {"": 1.0}, "field key"),
        ({}, {"time": 1.0}, "field key"),
        ({}, {}, "at least one field"),
    ],
)
def test_refused_points(tags: dict[str, str], fields: dict[str, float], reason: str) -> None:
    encoder = LineEncoder()
    for _ in range(2):  # the second time goes through the caches
        with pytest.raises(LineProtocolError, match=reason):
            encoder.line("m", tags, fields, 0)
        with pytest.raises(LineProtocolError, match=reason):
            encoder.check("m", tags, fields, 0)


def test_caches_give_the_same_lines_and_still_check() -> None:
    encoder = LineEncoder()
    fields: dict[str, float | int | str | bool] = {"a": 1.5, "b": 2, "c": "x\\", "d": False, "e%": 0.25}
    first = encoder.line("m", {"t": "v"}, fields, 1)
    assert first == 'm,t=v a=1.5,b=2i,c="x\\\\",d=false,e%=0.25 1'
    assert encoder.line("m", {"t": "v"}, fields, 1) == first
    assert encoder.line("m", {"t": "v"}, {**fields, "b": "s"}, 1) == first.replace("b=2i", 'b="s"')
    with pytest.raises(LineProtocolError):
        encoder.line("m", {"t": "v"}, {**fields, "a": math.nan}, 1)
    with pytest.raises(LineProtocolError):
        encoder.line("m", {"t": "v"}, {**fields, "b": -(2**63) - 1}, 1)


def test_series_cache_is_bounded() -> None:
    encoder = LineEncoder(max_series=10)
    for i in range(100):
        encoder.line("m", {"k": str(i)}, {"f": 1.0}, i)
    assert len(encoder._prefixes) == 10


def test_batch_lines_and_rejections() -> None:
    batch = make_batch(samples=2, job_id="job-1")
    batch.samples[1].device = "bad\ndevice"
    encoded = LineEncoder().batch(batch)
    assert encoded.lines[0] == (
        "energy,cluster=c1,component=gpu,device=GPU-0,host=node-1,quality=counter,region=eu-west-1,source=nvml "
        "energy_j=250.125,power_w=250.125,cumulative_j=1000.5,interval_s=1.0,start_ns=1780000000000000000i,"
        'healthy=true,stream="stream-a",utilization=0.5,energy_error_j=0.25,memory_used_bytes=15000000000.0 '
        "1780000001000000000"
    )
    assert len(encoded.lines) == 1 + 4
    assert encoded.lines[1].startswith(
        "job_events,cluster=c1,event=open,host=node-1,job_id=job-1,region=eu-west-1,seq_block=0 event_seq=1i,"
        "time_ns=1780000000000000000i,"
    )
    assert encoded.lines[1].endswith(" 1780000000000000001")  # the time's millisecond + event_seq
    assert 'name="resnet 50, bs=64"' in encoded.lines[1] and 'label_owner="a \\"quoted\\" name"' in encoded.lines[1]
    (reason,) = encoded.rejected
    assert "device='bad\\ndevice'" in reason and "line feed" in reason


# -- what users type comes back exactly: real influxd and SQLite ------------------------

TRICKY = st.sampled_from(
    [",", "=", " ", '"', "'", "\\", "\n", "\r", "\t", "\x00", "#", "%", "é", "日", "😀", "a", "Z", "0"]
)
USER_TEXT = st.text(TRICKY, max_size=6) | st.text(max_size=4)
LABEL_KEY = st.text(TRICKY, min_size=1, max_size=5).filter(lambda k: k not in SAMPLE_FIELD_NAMES)


def tag_ok(text: str) -> bool:
    return not {"\n", "\r", "\x00"} & set(text) and not text.endswith("\\")


def field_key_ok(key: str) -> bool:
    return bool(key) and not {"\n", "\r", "\x00", "\\"} & set(key) and not key.startswith("\t")


def absent_as_empty(value: object) -> object:
    return "" if value is None else value


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    host=USER_TEXT,
    labels=st.dictionaries(LABEL_KEY, USER_TEXT, max_size=2),
    device=USER_TEXT,
    status=USER_TEXT,
    job_id=USER_TEXT,
    name=USER_TEXT,
    job_labels=st.dictionaries(USER_TEXT, USER_TEXT, max_size=2),
)
def test_user_strings_round_trip(
    influxd: Influxd,
    tmp_path: Path,
    host: str,
    labels: dict[str, str],
    device: str,
    status: str,
    job_id: str,
    name: str,
    job_labels: dict[str, str],
) -> None:
    assume(host)  # the collector refuses an empty host id before any store sees it
    labels = {k: v for k, v in labels.items() if k not in ("host", "source", "component", "device", "quality")}
    batch = make_batch(host=host, labels={**labels, "example": "x"}, samples=1, job_id="placeholder")
    batch.samples[0].device = device
    batch.samples[0].status = status
    del batch.job_events[1:]
    event = batch.job_events[0]
    event.job_id, event.name = job_id, name
    event.labels.clear()
    event.labels.update(job_labels)
    host_ok = all(tag_ok(k) and tag_ok(v) for k, v in labels.items() if v) and tag_ok(host)
    sample_ok = host_ok and tag_ok(device)
    event_ok = host_ok and bool(job_id) and tag_ok(job_id) and all(field_key_ok(f"label_{k}") for k in job_labels)

    influx = InfluxV1Store(influxd.url, influxd.new_database())
    influx.create_database()  # a batch whose points are all refused sends nothing
    sqlite = SqliteStore(tmp_path / f"{influx.database}.db")
    for store in (influx, sqlite):
        result = store.write(batch)
        assert (result.written, result.rejected) == (sample_ok + event_ok, 2 - sample_ok - event_ok), result

    where = " WHERE example = 'x'"
    energy = influx.query("SELECT * FROM energy" + where)
    rows = energy_rows(sqlite)
    assert len(energy) == len(rows) == sample_ok
    if sample_ok:
        (point,) = energy
        assert {k: absent_as_empty(point.get(k)) for k in (*labels, "host", "device", "status")} == {
            **labels,
            "host": host,
            "device": device,
            "status": status,
        }
        (row,) = rows
        assert (row["host"], row["device"], row["status"]) == (host, device, status)
        assert row["labels"] == {**labels, "example": "x"}
        assert influx.query(f"SELECT energy_j FROM energy WHERE host = {quote_literal(host)}")[0]["energy_j"] == 250.125

    events = influx.query("SELECT * FROM job_events" + where)
    rows = job_event_rows(sqlite)
    assert len(events) == len(rows) == event_ok
    if event_ok:
        (point,) = events
        expected_fields = {"name": name, **{f"label_{k}": v for k, v in job_labels.items()}}
        assert absent_as_empty(point.get("job_id")) == job_id
        assert {k: point[k] for k in expected_fields} == expected_fields
        (row,) = rows
        assert row["job_id"] == job_id
        assert {k: row["fields"][k] for k in expected_fields} == expected_fields
    influx.close()
    sqlite.close()


def test_tabs_quotes_backslashes_control_characters_and_unicode_in_tags(influxd: Influxd) -> None:
    store = InfluxV1Store(influxd.url, influxd.new_database())
    values = ["\x01\x7f", "\tlead", "日本 語", "a\\b", "x\\,y", '"q"', "a\\\\b", "\\ \\=\\"[:-1]]
    lines = [store.encoder.line("m", {"k": v, "i": str(i)}, {"f": 1.0}, T0) for i, v in enumerate(values)]
    assert store.write_lines(lines).written == len(lines)
    got = {int(r["i"]): r["k"] for r in store.query("SELECT f, k, i FROM m")}
    assert got == dict(enumerate(values))
    for refused in ("\\", "a\nb", "a\rb", "nul\x00"):
        with pytest.raises(LineProtocolError):
            store.encoder.line("m", {"k": refused}, {"f": 1.0}, T0)
    store.close()


def test_batches_reuse_the_series_prefixes() -> None:
    encoder = LineEncoder()
    batch = make_batch(samples=1000)
    first = encoder.batch(batch)
    assert len(first.lines) == 1000 and len(encoder._prefixes) == 2  # GPU-0 and GPU-1
    assert encoder.batch(batch).lines == first.lines
    assert len(encoder._prefixes) == 2


def test_empty_tag_values_are_omitted() -> None:
    batch = make_batch(samples=1, labels={"rack": ""})
    batch.samples[0].device = ""
    (line,) = LineEncoder().batch(batch).lines
    assert line.startswith("energy,component=gpu,host=node-1,quality=counter,source=nvml ")
    assert wire.QUALITY_NAMES[batch.samples[0].quality] == "counter"
