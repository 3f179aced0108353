"""VictoriaStore against a real VictoriaMetrics: what SQLite reads back, it reads back
(job events with every string field, resends counted once, samples and edges far from an
instant), and a job summary stays one point however it is rewritten."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import T0, VictoriaMetrics, make_batch, searchable
from waits import wait_until

from wattline import wire
from wattline.stores.base import JobSummary
from wattline.stores.sqlite.store import SqliteStore
from wattline.stores.victoria.store import VictoriaStore


@pytest.fixture
def stores(tmp_path: Path, victoria_metrics: VictoriaMetrics) -> Iterator[tuple[VictoriaStore, SqliteStore]]:
    with VictoriaStore(victoria_metrics.url) as vm, SqliteStore(tmp_path / "w.db") as sqlite:
        yield vm, sqlite


def shown(vm: VictoriaStore, summary: JobSummary) -> None:
    """Wait until ``summary`` is the one ``vm`` shows (a rewrite: the last one written)."""

    def read() -> bool:
        searchable(vm.url)
        return vm.job_summary(summary.job_id) == summary

    wait_until(read, f"the summary of {summary.job_id} written last searchable")


@pytest.mark.servers
def test_reads_equal_sqlite_resends_included(stores: tuple[VictoriaStore, SqliteStore]) -> None:
    vm, sqlite = stores
    batch = make_batch(host="vm-reads", job_id="vm-reads-job", samples=6)
    opened = batch.job_events[0]
    opened.event_seq = (12345 << 32) + 7  # beyond a float64's exact integers
    opened.holder_pid, opened.holder_start_ticks, opened.holder_boot_id = 4242, 99, "boot-x"
    opened.service = True  # read back as stored
    opened.labels["empty"] = ""
    batch.job_events[-1].abandoned = "holder died"
    use = batch.job_events.add(job_id="vm-reads-job", kind=wire.pb.JobEvent.KIND_USE, time_ns=T0 + 2 * 10**9)
    use.event_seq, use.use_device, use.use_period_ns, use.use_metric = 77, "gpu:GPU-x", 10**9, "sm"
    use.job_use, use.device_use, use.use_steady = 45.5, 60.0, True  # a flag, read back as stored
    for _ in range(2):  # a resend
        assert vm.write(batch).written == sqlite.write(batch).written == 11

    def shown_all() -> bool:
        searchable(vm.url)
        return len(vm.job_events("vm-reads-job")) == len(sqlite.job_events("vm-reads-job")) and len(
            vm.samples("vm-reads", T0, T0 + 10**12)
        ) == len(sqlite.samples("vm-reads", T0, T0 + 10**12))

    wait_until(shown_all, "the batch searchable")
    assert vm.job_events("vm-reads-job") == sqlite.job_events("vm-reads-job")
    assert vm.job_events("vm-reads-job", every=False) == sqlite.job_events("vm-reads-job", every=False)
    assert vm.job_events_between(T0, T0 + 10**9, ["vm-reads"]) == sqlite.job_events_between(
        T0, T0 + 10**9, ["vm-reads"]
    )
    for t in (T0 - 10**12, T0 + 500_000_000, T0 + 3 * 10**9, T0 + 10**12):  # near, and far on one side
        for mine, theirs in zip(vm.around("vm-reads", [t])[0], sqlite.around("vm-reads", [t])[0], strict=True):
            assert sorted(mine, key=repr) == sorted(theirs, key=repr)
    assert vm.samples("vm-reads", T0, T0 + 3_500_000_000) == sqlite.samples("vm-reads", T0, T0 + 3_500_000_000)


@pytest.mark.servers
def test_a_summary_stays_one_point(stores: tuple[VictoriaStore, SqliteStore]) -> None:
    vm, _ = stores
    fields = {
        "status": "running",
        "closed": False,
        "energy_j": 12.5,
        "hosts": 1,
        "start_ns": T0 + 7,
        "schema": "wattline.job_summary/1",
    }
    first = JobSummary("vm-sum", T0 + 7, {"name": "n", "kind": "inference"}, fields, {"h": 12.5})
    assert vm.write_summary(first).written == 2
    shown(vm, first)
    closed = JobSummary("vm-sum", T0 + 7, first.tags, {**fields, "status": "closed", "closed": True, "exit_code": 0})
    vm.write_summary(closed)
    shown(vm, JobSummary(closed.job_id, closed.time_ns, closed.tags, closed.fields, {}))
    searchable(vm.url)  # flushed again: the running summary does not come back
    assert vm.job_summary("vm-sum") == JobSummary(closed.job_id, closed.time_ns, closed.tags, closed.fields, {})


@pytest.mark.servers
def test_a_rewritten_summary_reads_back_as_written_lower_or_higher(stores: tuple[VictoriaStore, SqliteStore]) -> None:
    """The same point rewritten (same start, fields, tags; other figures) reads back as the last
    one written, also when written again before the first was searchable."""
    vm, _ = stores
    fields = {"status": "closed", "closed": True, "schema": "wattline.job_summary/1"}
    for energy, computed in ((160.0, 1), (80.0, 2), (120.0, 3)):
        summary = JobSummary("vm-rw", T0, {"name": "n"}, {**fields, "energy_j": energy, "computed_ns": computed})
        vm.write_summary(JobSummary(summary.job_id, T0, summary.tags, {**summary.fields, "energy_j": 1e6}))
        vm.write_summary(summary)  # at once: the first is not searchable yet
        shown(vm, summary)
        searchable(vm.url)  # flushed again: the first write does not come back
        assert vm.job_summary("vm-rw") == summary
