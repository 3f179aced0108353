"""End to end: RAPL sysfs tree -> agent pipeline -> gRPC -> collector -> real storage.

Counters advance with known power (one zone wraps past max_energy_range_uj, an
intel-rapl-mmio mirror sits beside package-0); the joules per zone read back from
InfluxDB 1.x (InfluxQL), VictoriaMetrics (written through /api/v2/write) and the
SQLite default must be exact.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from pipeline import SyntheticHost, ZoneSpec
from prometheus_client import generate_latest
from servers import Influxd, VictoriaMetrics
from store_rows import energy_rows
from sysfs_trees import INTEL_RANGE_UJ

from wattline.collector.server import CollectorServer
from wattline.stores.base import Store
from wattline.stores.factory import open_store

ZONES = [
    ZoneSpec("intel-rapl:0", "package-0", 50.0),
    ZoneSpec("intel-rapl:0:0", "core", 20.0),
    ZoneSpec("intel-rapl:0:1", "dram", 6.5),
    # package-1 starts 300 J below the wrap: it wraps during the run.
    ZoneSpec("intel-rapl:1", "package-1", 42.0, start_uj=INTEL_RANGE_UJ - 300_000_000),
    # The MMIO mirror of package-0: must not be counted a second time.
    ZoneSpec("intel-rapl-mmio:0", "package-0", 50.0),
]
DEVICES = {
    "package-0": "intel-rapl:0",
    "package-0/core": "intel-rapl:0:0",
    "package-0/dram": "intel-rapl:0:1",
    "package-1": "intel-rapl:1",
}
SECONDS, TICKS = 10.0, 20


def run_pipeline(tmp_path: Path, store: Store) -> SyntheticHost:
    server = CollectorServer(store, "127.0.0.1:0")
    server.start()
    host = SyntheticHost(tmp_path / "host-a", "host-a", ZONES, f"127.0.0.1:{server.port}", labels={"cluster": "ci"})
    try:
        host.advance(SECONDS, TICKS)
        host.ship()
        metrics = generate_latest(server.registry).decode()
        assert f"wattline_collector_points_written_total {float(TICKS * len(DEVICES))}" in metrics
        assert "wattline_collector_connected_agents 1.0" in metrics
        assert "wattline_collector_unacked_batches 0.0" in metrics
        assert "wattline_collector_write_errors_total 0.0" in metrics
        assert "wattline_collector_write_seconds_count" in metrics
    finally:
        host.close()
        server.stop()
    return host


def expected(host: SyntheticHost) -> dict[str, float]:
    return {device: host.energy_j[zone] for device, zone in DEVICES.items()}


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'w.db'}") as store:
        yield store


def test_exact_joules_in_influxdb_v1(tmp_path: Path, influxd: Influxd) -> None:
    db = influxd.new_database()
    with open_store(influxd.url, database=db) as store:
        host = run_pipeline(tmp_path, store)
    rows = influxd.query(
        "SELECT sum(energy_j) AS e, count(energy_j) AS n, last(cumulative_j) AS c FROM energy GROUP BY device, quality, host, cluster",
        db,
    )
    got = {r["device"]: r for r in rows}
    want = expected(host)
    assert set(got) == set(want), "mmio mirror double counted or zone missing"
    for device, joules in want.items():
        assert got[device]["e"] == pytest.approx(joules, rel=1e-12), device
        assert got[device]["c"] == pytest.approx(joules, rel=1e-12)
        assert got[device]["n"] == TICKS
        assert got[device]["quality"] == "counter"
        assert (got[device]["host"], got[device]["cluster"]) == ("host-a", "ci")
    assert want["package-1"] == pytest.approx(42.0 * SECONDS)  # the wrap was counted, not lost


def test_exact_joules_through_v2_write_api(tmp_path: Path, victoria_metrics: VictoriaMetrics) -> None:
    with open_store(victoria_metrics.url, api="v2", org="wattline", bucket="wattline", token="unused") as store:
        host = run_pipeline(tmp_path, store)
    series = victoria_metrics.export('energy_energy_j{host="host-a"}', expect=len(DEVICES))
    sums: dict[str, float] = defaultdict(float)
    for s in series:
        sums[s["metric"]["device"]] += math.fsum(s["values"])
        assert s["metric"]["quality"] == "counter"
        assert len(s["values"]) == TICKS
    assert sums == pytest.approx(expected(host), rel=1e-12)


def test_exact_joules_in_sqlite_default(tmp_path: Path, sqlite_store: Store) -> None:
    host = run_pipeline(tmp_path, sqlite_store)
    sums: dict[str, float] = defaultdict(float)
    for row in energy_rows(sqlite_store, host="host-a"):
        sums[str(row["device"])] += float(row["energy_j"])
        assert row["quality"] == "counter"
    assert sums == pytest.approx(expected(host), rel=1e-12)


def test_replayed_batches_leave_one_copy(tmp_path: Path, sqlite_store: Store) -> None:
    """A batch resent after a lost acknowledgement is stored once (idempotent writes)."""
    host = SyntheticHost(tmp_path / "h", "host-a", ZONES[:1])
    host.advance(2.0, 4)
    host.spool.seal()
    batch = host.spool.peek()
    assert batch is not None
    sqlite_store.write(batch)
    sqlite_store.write(batch)
    rows = energy_rows(sqlite_store, host="host-a")
    assert len(rows) == 4
    assert math.fsum(r["energy_j"] for r in rows) == pytest.approx(100.0)
    host.close()
