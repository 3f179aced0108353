"""open_store: the back-end from a URL, InfluxDB's API from its /ping."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from servers import Daemon, Influxd, VictoriaMetrics, free_port, make_batch

from wattline.stores.base import StoreUnavailable
from wattline.stores.factory import api_for_version, detect_api, open_store
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.influxdb.v2 import InfluxV2Store
from wattline.stores.prometheus.store import PrometheusStore
from wattline.stores.sqlite.store import SqliteStore
from wattline.stores.victoria.store import VictoriaStore


@pytest.mark.parametrize(
    ("url", "relative"),
    [("sqlite://{tmp}/a.db", "a.db"), ("sqlite:////{tmp}/b.db", "b.db"), ("{tmp}/c.db", "c.db")],
)
def test_sqlite_urls_and_paths(tmp_path: Path, url: str, relative: str) -> None:
    with open_store(url.format(tmp=tmp_path)) as store:
        assert isinstance(store, SqliteStore) and store.kind == "sqlite"
        assert store.write(make_batch(samples=1)).written == 1
    assert (tmp_path / relative).exists()


def test_relative_sqlite_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:data/w.db") as store:
        assert isinstance(store, SqliteStore)
    assert (tmp_path / "data" / "w.db").exists()
    with open_store(":memory:") as store:
        assert isinstance(store, SqliteStore) and store.path == ":memory:"


def test_influxdb_1_is_detected(influxd: Influxd) -> None:
    assert detect_api(influxd.url) == "v1"
    with open_store(influxd.url, database=influxd.new_database()) as store:
        assert isinstance(store, InfluxV1Store) and store.kind == "influxdb1"
        assert store.write(make_batch(samples=2)).written == 2
        assert len(store.query("SELECT energy_j FROM energy")) == 2


def test_victoria_metrics_is_detected_and_an_api_forced_writes_it_as_influxdb(
    victoria_metrics: VictoriaMetrics,
) -> None:
    assert detect_api(victoria_metrics.url) == "victoriametrics"
    with open_store(victoria_metrics.url) as detected:
        assert isinstance(detected, VictoriaStore) and detected.kind == "victoriametrics"
    with open_store(victoria_metrics.url, api="v2", org="o", bucket="b", token="t") as store:
        assert isinstance(store, InfluxV2Store) and store.kind == "influxdb2"
        assert store.write(make_batch(host="factory-v2", samples=2)).written == 2
    series = victoria_metrics.export('{__name__="energy_energy_j", host="factory-v2"}', expect=2)
    assert sorted(v for s in series for v in s["values"]) == [250.125, 251.125]


def test_prometheus_is_detected_and_named(prometheus: Daemon) -> None:
    """Prometheus answers no /ping but serves the Prometheus API: found from its URL; the
    prometheus+ form names it (Mimir and Thanos are named so, never guessed)."""
    assert detect_api(prometheus.url) == "prometheus"
    for url in (prometheus.url, "prometheus+" + prometheus.url):
        with open_store(url) as store:
            assert isinstance(store, PrometheusStore) and store.kind == "prometheus"
            assert store.url == prometheus.url
            assert store.write(make_batch(host="factory-prom", samples=2, t0=time.time_ns())).written == 2


@pytest.mark.parametrize(
    ("version", "api"), [("1.6.7~rc0", "v1"), ("1.8.10", "v1"), ("v2.7.4", "v2"), ("2.0.0", "v2"), ("3.0.1", "v2")]
)
def test_api_for_version(version: str, api: str) -> None:
    assert api_for_version(version) == api


def test_bad_urls() -> None:
    with pytest.raises(ValueError, match="unsupported store URL"):
        open_store("ftp://example.invalid/x")
    with pytest.raises(ValueError, match="v1 or v2"):
        api_for_version("0.13")
    with pytest.raises(ValueError, match="no path"):
        open_store("sqlite://")
    with pytest.raises(ValueError, match="the one URL parameter is write=PATH or write=URL"):
        open_store("prometheus+http://127.0.0.1:9?write=/a&write=/b")
    with pytest.raises(ValueError, match="is neither a path nor an http"):
        open_store("prometheus+http://127.0.0.1:9?write=ftp://x/y")
    with pytest.raises(ValueError, match="influx_api v1 is for InfluxDB"):
        open_store("prometheus+http://127.0.0.1:9", api="v1")


def test_a_server_that_is_neither_is_refused_in_one_line(tmp_path: Path) -> None:
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ValueError, match=r"neither InfluxDB .* nor VictoriaMetrics or Prometheus"):
            open_store(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()


def test_unreachable_influxdb_is_unavailable() -> None:
    with pytest.raises(StoreUnavailable):
        open_store(f"http://127.0.0.1:{free_port()}", timeout_s=2)
