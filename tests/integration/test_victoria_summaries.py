"""Job summaries in VictoriaMetrics end to end (issue #30): a real ``wattline collector
--store http://127.0.0.1:PORT`` (detected as VictoriaMetrics, no other flag) writes the
summary of a job that closes, of a job ended for its dead holder, and writes a neighbour's
summary again once that dead job ends (convergence, as tests/e2e/test_dead_holder.py drives it on
SQLite). Each stored summary reads back with the figures ``wattline report --json`` gives from
the same store, and the energy is P x the window of the stored open and close events (the
jobs' windows are under test: every figure by rule "equal", as tests/e2e/test_dead_holder.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import Proc, start_collector
from servers import VictoriaMetrics, free_port, make_batch, searchable
from test_dead_holder import BATCH_S, EQUAL_ENV, HOST, POWER_W, cli, kill_after, start_dead, total_j, tree
from waits import wait_sampled, wait_until

from wattline.reports.summaries.summary import SummaryWriter
from wattline.stores.base import JobSummary, WriteResult
from wattline.stores.reader import StoredJobEvent
from wattline.stores.sqlite.store import SqliteStore
from wattline.stores.victoria.store import VictoriaStore

__all__ = ["tree"]  # the fixture, imported for pytest


class Lagging(SqliteStore):
    """A store that shows a job's events only ``job_lag_s`` after it was made, and its close
    ``close_lag_s`` after (as VictoriaMetrics shows rows about a second after it took them)."""

    def __init__(self, path: Path, job_lag_s: float, close_lag_s: float) -> None:
        super().__init__(path)
        self.made = time.monotonic()
        self.job_lag_s, self.close_lag_s = job_lag_s, close_lag_s

    def _shown(self, events: list[StoredJobEvent]) -> list[StoredJobEvent]:
        age = time.monotonic() - self.made
        return [e for e in events if age >= (self.close_lag_s if e.event == "close" else self.job_lag_s)]

    def job_events(self, job_id: str | None = None, every: bool = True) -> list[StoredJobEvent]:
        return self._shown(super().job_events(job_id, every))

    def job_events_between(self, start_ns: int, end_ns: int, hosts: Collection[str]) -> list[StoredJobEvent]:
        return self._shown(super().job_events_between(start_ns, end_ns, hosts))


class Kept:
    """A summary sink that keeps what it is given."""

    def __init__(self) -> None:
        self.written: list[JobSummary] = []

    def __call__(self, summary: JobSummary) -> WriteResult:
        self.written.append(summary)
        return WriteResult(written=1)


@pytest.mark.parametrize(("job_lag_s", "close_lag_s"), [(0.6, 0.6), (0.0, 0.6)])
def test_the_writer_waits_for_events_the_store_does_not_show_yet(
    tmp_path: Path, job_lag_s: float, close_lag_s: float
) -> None:
    """The collector notes a job's close once the store took it; a store that shows the job
    (or only its close) a moment later still gets the closed job's summary, once."""
    store = Lagging(tmp_path / "w.db", job_lag_s, close_lag_s)
    store.write(make_batch(host="lag-host", job_id="lag-job", samples=6))
    sink = Kept()
    writer = SummaryWriter(store, sink, wait_s=5.0, poll_s=0.05, running_every_s=60.0).start()
    try:
        writer.job_events([("lag-job", True)])
        wait_until(lambda: sink.written, "a summary")
        time.sleep(0.5)  # time, not a state: a window in which no second summary may come
    finally:
        writer.stop()
        store.close()
    assert [s.fields["status"] for s in sink.written] == ["closed"]
    assert sink.written[0].fields["exit_code"] == 137  # make_batch's close


@pytest.fixture
def vm(victoria_metrics: VictoriaMetrics) -> Iterator[VictoriaStore]:
    with VictoriaStore(victoria_metrics.url) as store:
        yield store


def summary(vm: VictoriaStore, job_id: str) -> JobSummary | None:
    searchable(vm.url)
    return vm.job_summary(job_id)


def field_of(vm: VictoriaStore, job_id: str, name: str) -> Any:
    """A field of ``job_id``'s summary; None while there is none (a rewrite is a delete and a
    write: a read in between finds none)."""
    found = summary(vm, job_id)
    return None if found is None else found.fields[name]


def settled(vm: VictoriaStore, job_id: str, status: str) -> bool:
    """A summary of ``job_id`` with ``status`` is stored."""
    found = summary(vm, job_id)
    return found is not None and found.fields["status"] == status


def truth_j(vm: VictoriaStore, job_id: str) -> float:
    """P x the job's window (its stored open and close)."""
    events = {e.event: e.time_ns for e in vm.job_events(job_id, every=False) if e.event in ("open", "close")}
    return POWER_W * (events["close"] - events["open"]) / 1e9


def report(tmp_path: Path, vm: VictoriaStore, job_id: str) -> dict[str, Any]:
    return dict(json.loads(cli(tmp_path, "report", job_id, "--json", "--store", vm.url).stdout))


def assert_reads_back(found: JobSummary | None, report: dict[str, Any]) -> None:
    """The stored summary holds the report's figures (relative 1e-9)."""
    assert found is not None
    f = found.fields
    assert f["status"] == report["job"]["status"]
    assert f["energy_j"] == pytest.approx(report["measured"]["energy_j"], rel=1e-9)
    assert f["energy_total_j"] == pytest.approx(total_j(report), rel=1e-9)
    assert f["hosts"] == len(report["job"]["hosts"]) == 1
    assert sum(found.hosts.values()) == pytest.approx(total_j(report), rel=1e-9)
    assert f["complete"] is report["complete"] is True


@pytest.mark.servers
def test_collector_into_victoria_metrics_writes_summaries_that_converge(
    tmp_path: Path, tree: Any, vm: VictoriaStore
) -> None:
    """The dead run keeps its record where neither the agent nor the next run looks, so next's
    first summary shares its window with the dead job (half); a later run from the dead one's
    state home ends it; the collector then writes dead's summary and next's again (its own)."""
    port = free_port()
    collector = start_collector(port, ["--store", vm.url], tmp_path / "collector.log", env=EQUAL_ENV)
    started = time.time_ns()  # the database is the session's: HOST has samples of other tests
    agent = Proc(
        ["agent", "--host-id", HOST, "--sysfs-root", str(tree.root), "--source", "rapl",
         "--batch-interval", str(BATCH_S), f"--collector=127.0.0.1:{port}"],
        tmp_path / "agent.log",
    )  # fmt: skip
    where = ["--host-id", HOST, f"--collector=127.0.0.1:{port}", "--store", vm.url]
    try:
        wait_sampled(vm, HOST, started, refresh=lambda: searchable(vm.url))  # samples before the jobs open
        dead = start_dead(tmp_path, where, state="elsewhere")
        kill_after(dead, 4.0)
        time.sleep(2.0)  # time, not a state: the next job starts 2 s after the kill, inside dead's lease
        cli(tmp_path, "run", "--job-id", "next", "--no-report", *where, "--", "sleep", "4")
        wait_until(lambda: (found := summary(vm, "next")) is not None and found.fields["status"] == "closed",
                   "next's first summary after its close")  # fmt: skip
        first = summary(vm, "next")
        assert first is not None and first.fields["status"] == "closed"
        assert first.fields["energy_total_j"] == pytest.approx(truth_j(vm, "next") / 2, rel=0.02)

        cli(tmp_path, "run", "--job-id", "later", "--no-report", *where, "--", "true", state="elsewhere")
        wait_until(lambda: summary(vm, "dead") is not None, "dead's summary")
        wait_until(lambda: field_of(vm, "next", "computed_ns") not in (None, first.fields["computed_ns"]), "next again")
        # the summaries compared below have landed: later's, dead's once abandoned, and next's
        # once computed with dead's close (a first recomputation may not have seen it yet)
        wait_until(lambda: settled(vm, "later", "closed") and settled(vm, "dead", "abandoned")
                   and field_of(vm, "next", "energy_total_j") == pytest.approx(truth_j(vm, "next"), rel=0.01),
                   "the summaries of later, dead and next (its own figure)")  # fmt: skip
    finally:
        agent.terminate()
        collector.terminate()
    for job_id in ("next", "dead", "later"):
        assert_reads_back(summary(vm, job_id), report(tmp_path, vm, job_id))
    assert summary(vm, "dead").fields["status"] == "abandoned"
    assert summary(vm, "next").fields["energy_total_j"] == pytest.approx(truth_j(vm, "next"), rel=0.01)
    assert summary(vm, "dead").fields["energy_total_j"] == pytest.approx(truth_j(vm, "dead"), rel=0.01)
    assert "Traceback" not in (tmp_path / "collector.log").read_text()


@pytest.mark.servers
def test_the_report_printed_at_the_end_of_a_run_is_of_the_closed_job(
    tmp_path: Path, tree: Any, vm: VictoriaStore
) -> None:
    """VictoriaMetrics makes rows searchable a moment after it took them: the report `wattline
    run` prints once the collector acknowledged the close must wait for the store to show it,
    not report the job as still running."""
    host = "shown-host"  # the database is the session's: other tests' jobs ran on HOST
    port = free_port()
    collector = start_collector(port, ["--store", vm.url], tmp_path / "collector.log", env=EQUAL_ENV)
    started = time.time_ns()
    agent = Proc(
        ["agent", "--host-id", host, "--sysfs-root", str(tree.root), "--source", "rapl",
         "--batch-interval", str(BATCH_S), f"--collector=127.0.0.1:{port}"],
        tmp_path / "agent.log",
    )  # fmt: skip
    where = ["--host-id", host, f"--collector=127.0.0.1:{port}", "--store", vm.url]
    try:
        wait_sampled(vm, host, started, refresh=lambda: searchable(vm.url))  # samples before the job opens
        printed = json.loads(cli(tmp_path, "run", "--job-id", "shown", "--json", *where, "--", "sleep", "3").stdout)
    finally:
        agent.terminate()
        collector.terminate()
    assert printed["job"]["status"] == "closed" and printed["complete"] is True, printed["notes"]
    assert total_j(printed) == pytest.approx(truth_j(vm, "shown"), rel=0.01)
