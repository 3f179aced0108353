"""A failed read costs no joule: the next good read counts the whole gap, marked.

RAPL counters on a sysfs tree advance at a known power on a synthetic clock; for a few
ticks the zone's ``energy_uj`` is empty, ``N/A`` or unreadable (EIO) while the hardware
counter keeps counting. The samples go through the real pipeline (sampler, spool, gRPC,
collector) into SQLite, and the energy over windows that start and end inside the gap,
computed from the stored samples as reports do, must equal power x time.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pipeline import SyntheticHost, ZoneSpec
from store_rows import energy_rows
from sysfs_trees import set_energy

from wattline.accounting.window_energy import EdgeSample, cumulative_window_energy, find_edges
from wattline.collector.server import CollectorServer
from wattline.stores.factory import open_store
from wattline.stores.sqlite.store import SqliteStore

PACKAGE_W, DRAM_W = 47.0, 6.5
ZONES = [ZoneSpec("intel-rapl:0", "package-0", PACKAGE_W, start_uj=10**9), ZoneSpec("intel-rapl:0:0", "dram", DRAM_W)]
FAILED_TICKS = 4
STEP_S = 0.5


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with open_store(f"sqlite:///{tmp_path / 'w.db'}") as s:
        assert isinstance(s, SqliteStore)
        yield s


def fail_package(host: SyntheticHost, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make package-0's energy_uj fail to read in the way ``how`` names."""
    path = host.root / "sys/class/powercap/intel-rapl:0/energy_uj"
    if how == "unreadable":
        inode = path.stat().st_ino
        real = os.pread

        def eio(fd: int, n: int, offset: int) -> bytes:
            if os.fstat(fd).st_ino == inode:
                raise OSError(errno.EIO, "Input/output error")
            return real(fd, n, offset)

        monkeypatch.setattr(os, "pread", eio)
    else:
        set_energy(host.root, "intel-rapl:0", "" if how == "empty" else "N/A")


def advance_failing(host: SyntheticHost, ticks: int, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Advance time and the hardware counters while package-0 cannot be read."""
    for _ in range(ticks):
        with monkeypatch.context() as m:
            host.t_ns += round(STEP_S * 1e9)
            for z in host.zones:
                host.counters[z.zone] += round(z.power_w * STEP_S * 1e6)
                host.energy_j[z.zone] += z.power_w * STEP_S
                set_energy(host.root, z.zone, host.counters[z.zone])
            fail_package(host, how, m)
            host.sampler.tick()


def rows(store: SqliteStore, device: str) -> list[dict[str, Any]]:
    return [r for r in energy_rows(store, "gap-host") if r["device"] == device]


def window_j(samples: list[dict[str, Any]], t0: int, t1: int) -> float | None:
    edges = [EdgeSample(r["start_ns"], r["time_ns"], r["energy_j"], r["cumulative_j"], r["stream"]) for r in samples]
    return cumulative_window_energy(*find_edges(edges, t0), *find_edges(edges, t1), t0, t1)


@pytest.mark.parametrize("how", ["empty", "N/A", "unreadable"])
def test_gap_of_failed_reads_costs_no_joule(
    tmp_path: Path, store: SqliteStore, how: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="wattline.agent.sampler")
    server = CollectorServer(store, "127.0.0.1:0")
    server.start()
    host = SyntheticHost(tmp_path / "host", "gap-host", ZONES, f"127.0.0.1:{server.port}")
    try:
        host.advance(3 * STEP_S, 3)
        gap_start = host.t_ns
        advance_failing(host, FAILED_TICKS, how, monkeypatch)
        gap_end = host.t_ns + round(STEP_S * 1e9)
        host.advance(3 * STEP_S, 3)
        host.ship()
    finally:
        host.close()
        server.stop()

    package = rows(store, "package-0")
    # No sample closes during the gap; the first good read spans it from the last good read, marked.
    assert [r["time_ns"] - r["start_ns"] for r in package] == [round(STEP_S * 1e9)] * 3 + [gap_end - gap_start] + [
        round(STEP_S * 1e9)
    ] * 2
    failed = [r.getMessage() for r in caplog.records if "read failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].startswith("rapl cpu_package package-0: read failed (")  # one line a gap
    spanning = package[3]
    assert (spanning["start_ns"], spanning["time_ns"]) == (gap_start, gap_end)
    assert spanning["status"] == f"gap: {(FAILED_TICKS + 1) * STEP_S:.1f} s without a reading"
    assert spanning["healthy"] and spanning["energy_j"] == pytest.approx(PACKAGE_W * (FAILED_TICKS + 1) * STEP_S)

    truth = host.energy_j["intel-rapl:0"]
    assert sum(r["energy_j"] for r in package) == pytest.approx(truth, rel=1e-3)
    assert package[-1]["cumulative_j"] == pytest.approx(truth, rel=1e-3)
    # Windows with edges inside the gap, as reports compute them: power x time.
    t_first = package[0]["start_ns"]
    for t0, t1 in [
        (t_first, gap_start + 10**9),
        (gap_start + 3 * 10**8, gap_end - 10**8),
        (gap_start + 10**9, host.t_ns),
    ]:
        assert window_j(package, t0, t1) == pytest.approx(PACKAGE_W * (t1 - t0) / 1e9, rel=1e-3)
    # The zone that kept reading is untouched.
    dram = rows(store, "package-0/dram")
    assert len(dram) == 3 + FAILED_TICKS + 3 and all(r["status"] == "" for r in dram)
    assert sum(r["energy_j"] for r in dram) == pytest.approx(host.energy_j["intel-rapl:0:0"], rel=1e-9)
