"""Two agents under one host id, and a plain restart, through the wire into a real collector.

Each agent is the real pipeline (RAPL source on a powercap tree, sampler, spool, uplink) on
a synthetic clock (tests/helpers/pipeline.py), drawing a known constant power, so a job's truth is
``power x its length``. Two agents sampling one host measured the same joules: every job
must get them once, the collector must say so once (log line and metric), and the reports
that touch it must carry a note. A restart (one stream stops, the next starts) adds up and
is no duplicate; its note says how long neither stream measured the host.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from pipeline import T0_NS, SyntheticHost, ZoneSpec, equal_share_truth
from servers import Influxd

from wattline.collector.server import CollectorServer
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.reports.build import build_report
from wattline.stores.base import Store
from wattline.stores.factory import open_store

HOST = "host-d"
POWER_W = 50.0
TICK_S = 0.5
S = 10**9
DUPLICATE = f"{HOST}: 2 streams overlapped in time (two agents under one host id?); counted once"


def restart(gap: str) -> str:
    """The note of a job its host's agent restarted in, ``gap`` unmeasured between the streams."""
    return f"{HOST}: agent restarted during the job; {gap} s between its streams not measured, the rest summed"


@pytest.fixture(params=["sqlite", "influxdb"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, CollectorServer]]:
    """A real collector writing to the SQLite default or to a real influxd (1.x API)."""
    if request.param == "sqlite":
        store = open_store(f"sqlite:///{tmp_path / 'w.db'}")
    else:
        influxd: Influxd = request.getfixturevalue("influxd")
        store = open_store(influxd.url, database=influxd.new_database())
    server = CollectorServer(store, "127.0.0.1:0")
    server.start()
    yield store, server
    server.stop()
    store.close()


def agent(tmp_path: Path, name: str, server: CollectorServer, t_ns: int) -> SyntheticHost:
    """An agent of HOST with its own counter (same power: the same host, measured again)."""
    zones = [ZoneSpec("intel-rapl:0", "package-0", POWER_W)]
    return SyntheticHost(tmp_path / name, HOST, zones, f"127.0.0.1:{server.port}", t_ns=t_ns)


class Jobs:
    """Job windows (synthetic times), their events sent through one agent's spool as time passes."""

    def __init__(self, windows: dict[str, tuple[float, float]]) -> None:
        self.windows = {j: (T0_NS + int(a * S), T0_NS + int(b * S)) for j, (a, b) in windows.items()}
        self.builders = {j: EventBuilder(JobSpec(j, j, "inference", "items")) for j in windows}
        self.sent: set[tuple[str, str]] = set()

    def send_due(self, via: SyntheticHost) -> None:
        for job, (open_ns, close_ns) in self.windows.items():
            for kind, at in (("open", open_ns), ("close", close_ns)):
                if at <= via.t_ns and (job, kind) not in self.sent:
                    b = self.builders[job]
                    via.spool.add_job_events([b.open(at) if kind == "open" else b.close(0, at)])
                    self.sent.add((job, kind))

    def truth_j(self, job: str) -> float:
        return equal_share_truth(self.windows, POWER_W)[job]


def job_energy(store: Store, job: str) -> tuple[float, list[str]]:
    report = build_report(store, job, now_ns=T0_NS + 3600 * S)  # type: ignore[arg-type]
    return report.warmup.energy_j + report.saturated_window.energy_j, report.notes


def run_ticks(hosts: list[SyntheticHost], seconds: float, jobs: Jobs, ship_every: int = 4) -> None:
    """Advance every host TICK_S at a time, interleaved; ship every few ticks."""
    for n in range(1, int(seconds / TICK_S) + 1):
        for h in hosts:
            h.advance(TICK_S)
        jobs.send_due(hosts[0])
        if n % ship_every == 0:
            for h in hosts:
                h.ship()
    for h in hosts:
        h.ship()


def gauge(server: CollectorServer, name: str, **labels: str) -> float | None:
    return server.registry.get_sample_value(name, labels)


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


def test_two_agents_under_one_host_id_count_each_joule_once(
    tmp_path: Path, served: tuple[Store, CollectorServer], caplog: pytest.LogCaptureFixture
) -> None:
    store, server = served
    # X samples alone for 10 s; Y (a second agent by mistake) starts then, ticking a quarter
    # period after X, until X is stopped at 70 s; Y runs on to 85 s.
    jobs = Jobs(
        {
            "alone": (2.2, 8.1),
            # job edges off the tick grid, as real job events are (another process's clock)
            **{f"dup-{i}": (12.06 + 7.3 * i, 12.06 + 7.3 * i + 5.13) for i in range(5)},
            "shared-a": (48.61, 58.33),  # two jobs at once: split by the equal-share rule
            "shared-b": (52.07, 63.91),
            "handover": (66.4, 78.9),
        }
    )
    caplog.set_level(logging.INFO)
    x = agent(tmp_path, "x", server, T0_NS)
    try:
        run_ticks([x], 10.0, jobs)
        y = agent(tmp_path, "y", server, x.t_ns + int(TICK_S * S / 4))
        try:
            run_ticks([x, y], 60.0, jobs)
            assert gauge(server, "wattline_collector_duplicate_streams", host=HOST) == 2
            assert gauge(server, "wattline_collector_hosts_with_duplicate_streams") == 1
            x.close()
            run_ticks([y], 15.0, Jobs({}))
            jobs.send_due(y)
            y.ship()
        finally:
            y.close()
    finally:
        x.close()
    assert len(warnings_about(caplog, f"host {HOST!r}: 2 agent streams")) == 1  # once, not per batch
    for job in jobs.windows:
        energy, notes = job_energy(store, job)
        assert energy == pytest.approx(jobs.truth_j(job), rel=1e-6), job
        assert not any("restarted" in n for n in notes), (job, notes)
        assert (DUPLICATE in notes) == (job != "alone"), (job, notes)


def test_restart_back_to_back_adds_up_and_is_no_duplicate(
    tmp_path: Path, served: tuple[Store, CollectorServer], caplog: pytest.LogCaptureFixture
) -> None:
    store, server = served
    jobs = Jobs({"before": (1.0, 9.0), "across": (12.3, 27.9), "after": (28.2, 29.8)})
    caplog.set_level(logging.INFO)
    old = agent(tmp_path, "old", server, T0_NS)
    run_ticks([old], 20.0, jobs)
    old.close()
    new = agent(tmp_path, "new", server, old.t_ns)  # starts where the old one stopped
    try:
        run_ticks([new], 10.0, jobs)
    finally:
        new.close()
    assert gauge(server, "wattline_collector_hosts_with_duplicate_streams") == 0
    assert gauge(server, "wattline_collector_duplicate_streams", host=HOST) is None
    assert not warnings_about(caplog, "agent streams")
    for job in jobs.windows:
        energy, notes = job_energy(store, job)
        assert energy == pytest.approx(jobs.truth_j(job), rel=1e-6), job
        assert not any("overlapped" in n for n in notes), (job, notes)
    assert restart("0") in job_energy(store, "across")[1]  # the new stream began where the old one ended


def test_restart_after_a_gap_says_how_long_nothing_was_measured(
    tmp_path: Path, served: tuple[Store, CollectorServer]
) -> None:
    """The agent is down ``gap_s`` inside a job: the report counts what both streams measured
    and says how many seconds neither did."""
    store, server = served
    gap_s, window = 7.5, (12.3, 35.4)
    jobs = Jobs({"across": window, "before": (1.0, 9.0)})
    old = agent(tmp_path, "old", server, T0_NS)
    run_ticks([old], 20.0, jobs)
    old.close()
    new = agent(tmp_path, "new", server, old.t_ns + int(gap_s * S))  # down meanwhile: nothing sampled
    try:
        run_ticks([new], 20.0, jobs)
    finally:
        new.close()
    energy, notes = job_energy(store, "across")
    assert energy == pytest.approx(POWER_W * (window[1] - window[0] - gap_s), rel=1e-6)
    assert [n for n in notes if "restarted" in n] == [restart(f"{gap_s:g}")]
    assert not any("restarted" in n for n in job_energy(store, "before")[1])
