"""Jobs end to end: two synthetic hosts, known power and a known ramp, through a real
collector into InfluxDB 1.x and into the SQLite default; reports within 0.1 % of the
truth with the warm-up apart, conservation, and the study-style comparison.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pipeline import T0_NS, SyntheticHost, ZoneSpec
from servers import Influxd
from typer.testing import CliRunner

from wattline.accounting.saturation import SaturationParams
from wattline.cli.main import app
from wattline.collector.server import CollectorServer
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.reports import economics
from wattline.reports.build import build_report
from wattline.reports.model import ReportSettings
from wattline.stores.base import Store
from wattline.stores.factory import open_store

TICK_S = 0.5
RAMP_S, RUN_S = 20.0, 90.0  # units ramp linearly for 20 s, then a plateau until 90 s


@dataclass
class Truth:
    """What really happened on the synthetic hosts."""

    energy: dict[str, list[tuple[int, int, float]]]  # host -> (start_ns, end_ns, J) per tick
    units: list[tuple[int, int, float]]  # (start_ns, end_ns, units) per tick, all hosts

    def energy_between(self, t0: int, t1: int) -> float:
        return sum(_overlap(s, e, j, t0, t1) for ticks in self.energy.values() for s, e, j in ticks)

    def units_between(self, t0: int, t1: int) -> float:
        return sum(_overlap(s, e, u, t0, t1) for s, e, u in self.units)


def _overlap(s: int, e: int, v: float, t0: int, t1: int) -> float:
    return v * max(0, min(e, t1) - max(s, t0)) / (e - s)


def run_job(tmp: Path, collector: str, job_id: str, hosts: list[str], power_w: float, rate: float) -> Truth:
    """Hosts draw ``power_w`` each on package-0 (plus 10 % on dram) while units ramp to ``rate``/s per host."""
    truth = Truth({}, [])
    synthetic = [
        SyntheticHost(
            tmp / h,
            h,
            [ZoneSpec("intel-rapl:0", "package-0", power_w), ZoneSpec("intel-rapl:0:1", "dram", power_w / 10)],
            collector,
            labels={"instance_type": "synthetic"},
        )
        for h in hosts
    ]
    spec = JobSpec(job_id, f"job-{job_id}", "inference", "inferences", {"suite": "e2e"})
    builders = [EventBuilder(spec) for _ in synthetic]
    for host, builder in zip(synthetic, builders, strict=True):
        host.spool.add_job_events([builder.open(host.t_ns)])
    ticks = int(RUN_S / TICK_S)
    for i in range(ticks):
        for host, builder in zip(synthetic, builders, strict=True):
            start = host.t_ns
            before = dict(host.energy_j)
            host.advance(TICK_S)
            joules = sum(host.energy_j[z] - before[z] for z in before)
            truth.energy.setdefault(host.host_id, []).append((start, host.t_ns, joules))
            t_mid = (i + 0.5) * TICK_S
            units = rate * TICK_S * min(1.0, t_mid / RAMP_S)
            truth.units.append((start, host.t_ns, units))
            host.spool.add_job_events([builder.units(units, host.t_ns)])
    for host, builder in zip(synthetic, builders, strict=True):
        host.spool.add_job_events([builder.close(0, host.t_ns)])
        host.ship()
        host.close()
    return truth


@pytest.fixture
def collector_into(tmp_path: Path) -> Iterator[object]:
    servers: list[CollectorServer] = []

    def start(store: Store) -> str:
        server = CollectorServer(store, "127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{server.port}"

    yield start
    for s in servers:
        s.stop()


def check_report(store: Store, job_id: str, truth: Truth) -> economics.Figures:
    report = build_report(store, job_id)  # type: ignore[arg-type]
    assert report.saturated, report.saturation.reason
    sat = report.saturated_from_ns
    end = T0_NS + int(RUN_S * 1e9)
    assert T0_NS + RAMP_S * 1e9 * 0.85 <= sat <= T0_NS + RAMP_S * 1e9 * 1.1, (sat - T0_NS) / 1e9
    assert report.saturated_window.energy_j == pytest.approx(truth.energy_between(sat, end), rel=1e-3)
    assert report.warmup.energy_j == pytest.approx(truth.energy_between(T0_NS, sat), rel=1e-3)
    assert report.units_saturated == pytest.approx(truth.units_between(sat, end), rel=1e-3)
    j_per_unit = truth.energy_between(sat, end) / truth.units_between(sat, end)
    assert report.figures.j_per_unit == pytest.approx(j_per_unit, rel=1e-3)
    # conservation: the node energy over the job = warm-up + measured (no other job ran)
    assert report.warmup.energy_j + report.saturated_window.energy_j == pytest.approx(
        truth.energy_between(T0_NS, end), rel=1e-9
    )
    assert set(report.saturated_window.components) == {"cpu_package", "dram"}
    assert sorted(report.job.hosts) == sorted(truth.energy)
    return report.figures


def test_two_hosts_through_collector_and_influxdb(tmp_path: Path, influxd: Influxd, collector_into: object) -> None:
    db = influxd.new_database()
    with open_store(influxd.url, database=db) as store:
        address = collector_into(store)  # type: ignore[operator]
        truth_a = run_job(tmp_path / "a", address, "job-a", ["a1", "a2"], power_w=300.0, rate=100.0)
        truth_b = run_job(tmp_path / "b", address, "job-b", ["b1", "b2"], power_w=150.0, rate=630.0)
        fa = check_report(store, "job-a", truth_a)
        fb = check_report(store, "job-b", truth_b)
    cmp = economics.compare(fa.window, fb.window, sla_units_per_hour=1_000_000)
    assert cmp.throughput_ratio == pytest.approx(6.3, rel=1e-3)
    assert cmp.sla is not None and (cmp.sla.instances.a, cmp.sla.instances.b) == (3, 1)
    runner = CliRunner()
    out = runner.invoke(
        app,
        ["compare", "job-a", "job-b", "--sla", "1000000", "--store", influxd.url, "--json"],
        env={"WATTLINE_COLLECTOR_INFLUX_DATABASE": db},
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["throughput_ratio"] == pytest.approx(6.3, rel=1e-3)
    assert data["sla"]["instances"]["change_pct"] == pytest.approx(-200 / 3, rel=1e-6)
    table = runner.invoke(
        app,
        ["compare", "job-a", "job-b", "--sla", "1000000", "--store", influxd.url],
        env={"WATTLINE_COLLECTOR_INFLUX_DATABASE": db, "COLUMNS": "200"},
    )
    assert table.exit_code == 0, table.output
    assert "6.3x" in table.output and "-67 %" in table.output


def test_same_job_in_the_embedded_sqlite_store_gives_the_same_figures(
    tmp_path: Path, influxd: Influxd, collector_into: object
) -> None:
    db = influxd.new_database()
    with open_store(influxd.url, database=db) as influx, open_store(f"sqlite:///{tmp_path / 'w.db'}") as sqlite:
        truth_i = run_job(tmp_path / "i", collector_into(influx), "job", ["h1", "h2"], 200.0, 50.0)  # type: ignore[operator]
        truth_s = run_job(tmp_path / "s", collector_into(sqlite), "job", ["h1", "h2"], 200.0, 50.0)  # type: ignore[operator]
        assert truth_i == truth_s
        fi = check_report(influx, "job", truth_i)
        fs = check_report(sqlite, "job", truth_s)
    assert fi.j_per_unit == pytest.approx(fs.j_per_unit, rel=1e-12)
    assert (fi.window.units, fi.window.seconds, fi.window.instances) == (
        fs.window.units,
        fs.window.seconds,
        2,
    )
    assert fi.window.energy_j == pytest.approx(fs.window.energy_j, rel=1e-12)


def test_concurrent_jobs_on_one_host_never_share_a_joule(tmp_path: Path) -> None:
    """X runs 0-60 s, Y 20-80 s on one host at 110 W: each is charged its own time plus
    half of the overlap (rule "equal"), and X + Y = the node's energy exactly."""
    host = SyntheticHost(
        tmp_path / "h", "h1", [ZoneSpec("intel-rapl:0", "package-0", 100.0), ZoneSpec("intel-rapl:0:1", "dram", 10.0)]
    )
    x = EventBuilder(JobSpec("x", "x", "training", "steps"))
    y = EventBuilder(JobSpec("y", "y", "training", "steps"))
    host.spool.add_job_events([x.open(host.t_ns)])
    for second in range(80):
        if second == 20:
            host.spool.add_job_events([y.open(host.t_ns)])
        host.advance(1.0, 2)
        active = [b for b, (lo, hi) in ((x, (0, 60)), (y, (20, 80))) if lo <= second < hi]
        host.spool.add_job_events([b.units(10.0, host.t_ns) for b in active])
        if second == 59:
            host.spool.add_job_events([x.close(0, host.t_ns)])
    host.spool.add_job_events([y.close(0, host.t_ns)])
    host.spool.seal()
    with open_store(f"sqlite:///{tmp_path / 'w.db'}") as store:
        while (batch := host.spool.peek()) is not None:
            store.write(batch)
            host.spool.ack(batch.seq)
        totals = {}
        for job in ("x", "y"):
            r = build_report(store, job)  # type: ignore[arg-type]
            totals[job] = r.warmup.energy_j + r.saturated_window.energy_j
            assert r.units_warmup + r.units_saturated == pytest.approx(600.0)
            assert any("shared with 1 other job" in n for n in r.notes)
    host.close()
    assert totals["x"] == pytest.approx(110.0 * (20 + 40 / 2), rel=1e-9)
    assert totals["y"] == pytest.approx(110.0 * (40 / 2 + 20), rel=1e-9)
    assert totals["x"] + totals["y"] == pytest.approx(110.0 * 80, rel=1e-12)


def test_idle_policy_subtract_charges_energy_above_the_pre_job_baseline(tmp_path: Path) -> None:
    """60 s idle at 40 W before the job, then 100 W: "subtract" charges 60 W x the window,
    "none" the full 100 W; both totals are in the report."""
    host = SyntheticHost(tmp_path / "h", "h1", [ZoneSpec("intel-rapl:0", "package-0", 40.0)])
    host.advance(60.0, 60)
    host.zones[0].power_w = 100.0
    job = EventBuilder(JobSpec("j", "j", "inference", "items"))
    host.spool.add_job_events([job.open(host.t_ns)])
    for _ in range(40):
        host.advance(1.0)
        host.spool.add_job_events([job.units(5.0, host.t_ns)])
    host.spool.add_job_events([job.close(0, host.t_ns)])
    host.spool.seal()
    with open_store(f"sqlite:///{tmp_path / 'w.db'}") as store:
        while (batch := host.spool.peek()) is not None:
            store.write(batch)
            host.spool.ack(batch.seq)
        whole = build_report(store, "j", ReportSettings(saturation=SaturationParams(min_bins=5)))  # type: ignore[arg-type]
        dynamic = build_report(store, "j", ReportSettings(idle="subtract", saturation=SaturationParams(min_bins=5)))  # type: ignore[arg-type]
    host.close()
    seconds = dynamic.saturated_window.seconds
    assert (
        whole.saturated_window.energy_j == dynamic.saturated_window.energy_j == pytest.approx(100.0 * seconds, rel=1e-9)
    )
    assert dynamic.saturated_window.dynamic_j == pytest.approx(60.0 * seconds, rel=1e-9)
    assert dynamic.figures.window.energy_j == pytest.approx(60.0 * seconds, rel=1e-9)  # what J/unit uses
    assert whole.figures.window.energy_j == pytest.approx(100.0 * seconds, rel=1e-9)
