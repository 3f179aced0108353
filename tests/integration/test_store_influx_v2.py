"""InfluxV2Store (``/api/v2/write`` via influxdb_client) against a real VictoriaMetrics.

VictoriaMetrics stores each numeric field as the metric ``<measurement>_<field>`` with
the tags as labels, at millisecond resolution; string fields are not stored as text.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from influxdb_client.rest import ApiException
from servers import T0, VictoriaMetrics, free_port, make_batch

from wattline.stores.base import StoreUnavailable
from wattline.stores.influxdb.v2 import InfluxV2Store, map_api_error

TOKEN = "secret-token-1234"


@pytest.fixture
def store(victoria_metrics: VictoriaMetrics) -> Iterator[InfluxV2Store]:
    with InfluxV2Store(victoria_metrics.url, "org", "bucket", TOKEN) as opened:
        assert isinstance(opened, InfluxV2Store)
        yield opened


def by_metric(series: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{s['metric']['__name__']}/{s['metric'].get('device', '')}": s for s in series}


def test_samples_come_back_exactly(store: InfluxV2Store, victoria_metrics: VictoriaMetrics) -> None:
    host = "vm-samples, host=1"
    assert store.write(make_batch(host=host, samples=4)).written == 4
    series = by_metric(victoria_metrics.export(f'{{host="{host}"}}', expect=21))
    energy = series["energy_energy_j/GPU-0"]
    assert energy["metric"] == {
        "__name__": "energy_energy_j",
        "host": host,
        "cluster": "c1",
        "region": "eu-west-1",
        "source": "nvml",
        "component": "gpu",
        "device": "GPU-0",
        "quality": "counter",
    }
    assert energy["values"] == [250.125, 252.125]
    assert energy["timestamps"] == [(T0 + 10**9) // 10**6, (T0 + 3 * 10**9) // 10**6]
    assert series["energy_cumulative_j/GPU-1"]["values"] == [1000.5 + 250.125, 1000.5 + 250.125 * 3]
    assert series["energy_power_w/GPU-1"]["values"] == [251.125, 253.125]
    assert series["energy_utilization/GPU-0"]["values"] == [0.5, 0.75]
    assert series["energy_memory_used_bytes/GPU-1"]["values"] == [1.5e10 + 1]
    assert series["energy_healthy/GPU-1"]["values"] == [1, 0]
    assert series["energy_start_ns/GPU-0"]["values"] == [T0, T0 + 2 * 10**9]


def test_job_events_numbers_arrive(store: InfluxV2Store, victoria_metrics: VictoriaMetrics) -> None:
    host = "vm-jobs"
    assert store.write(make_batch(host=host, samples=0, job_id="job=1 a,b")).written == 4
    exported = victoria_metrics.export(f'{{host="{host}"}}', expect=6)
    series = {(s["metric"]["__name__"], s["metric"]["event"]): s for s in exported}
    assert {s["metric"]["job_id"] for s in exported} == {"job=1 a,b"}
    seqs = {event: series["job_events_event_seq", event]["values"] for event in ("open", "units", "phase", "close")}
    assert seqs == {"open": [1], "units": [2], "phase": [3], "close": [4]}
    assert series["job_events_units", "units"]["values"] == [512]
    assert series["job_events_exit_code", "close"]["values"] == [137]
    assert series["job_events_units", "units"]["timestamps"] == [(T0 + 1_500_000_000) // 10**6]


def test_resending_leaves_one_copy_with_dedup(store: InfluxV2Store, victoria_metrics: VictoriaMetrics) -> None:
    """VictoriaMetrics keeps one copy of a resent point when run with ``-dedup.minScrapeInterval=1ms``."""
    batch = make_batch(host="vm-twice", samples=4)
    assert store.write(batch).written == 4
    assert store.write(batch).written == 4
    (series,) = victoria_metrics.export('{__name__="energy_energy_j", host="vm-twice", device="GPU-0"}')
    assert series["values"] == [250.125, 252.125]


def test_unencodable_points_are_rejected_before_sending(store: InfluxV2Store) -> None:
    batch = make_batch(host="vm-bad", samples=2)
    batch.samples[0].device = "a\nb"
    result = store.write(batch)
    assert (result.written, result.rejected) == (1, 1) and "line feed" in result.reasons[0]


def test_unreachable_server_is_unavailable_and_the_token_stays_secret(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with InfluxV2Store(f"http://127.0.0.1:{free_port()}", "org", "bucket", TOKEN, timeout_s=2) as store:
        assert TOKEN not in repr(store)
        with pytest.raises(StoreUnavailable) as raised:
            store.write(make_batch(samples=1))
    assert TOKEN not in str(raised.value) and TOKEN not in caplog.text


def api_error(status: int, body: str) -> ApiException:
    exc = ApiException(status=status, reason="Bad Request")  # type: ignore[no-untyped-call]
    exc.body = body.encode()
    return exc


@pytest.mark.parametrize(
    ("status", "body", "written", "rejected"),
    [
        (400, '{"code":"invalid","message":"partial write: field type conflict ... dropped=2"}', 8, 2),
        (422, '{"code":"unprocessable entity","message":"failure writing points: partial write dropped=1"}', 9, 1),
        (400, '{"code":"invalid","message":"unable to parse \'x\': missing fields"}', 9, 1),
        (400, '{"code":"invalid","message":"no points were written"}', 0, 10),
    ],
)
def test_rejections_are_counted(status: int, body: str, written: int, rejected: int) -> None:
    result = map_api_error(api_error(status, body), 10, "http://x")
    assert (result.written, result.rejected) == (written, rejected) and result.reasons


@pytest.mark.parametrize("status", [0, 401, 403, 404, 413, 429, 500, 503])
def test_other_errors_mean_retry_later(status: int) -> None:
    with pytest.raises(StoreUnavailable, match=str(status or "no response")):
        map_api_error(api_error(status, '{"message":"nope"}'), 10, "http://x")
