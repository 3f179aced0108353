"""PrometheusStore against a real Prometheus (remote write in, the query API out, issue #30):
what SQLite reads back, it reads back (job events with every string field, label names
Prometheus would not take, resends counted once, samples and edges far from an instant);
what the engine refuses is counted as rejected, never acknowledged as written, and every
point is either read back or counted; reads stay exact under a small sample limit.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from servers import PROMETHEUS_OOO_WINDOW_S, Daemon, make_batch, start_prometheus
from test_dead_holder import tree
from test_victoria_cluster import PrefixProxy, Route, collector_and_reports

from wattline import wire
from wattline.stores.base import JobSummary, StoreUnavailable
from wattline.stores.factory import open_store
from wattline.stores.prometheus.remote_write import escape_name, unescape_name
from wattline.stores.prometheus.store import PrometheusStore, parse_url
from wattline.stores.sqlite.store import SqliteStore

__all__ = ["tree"]  # the fixture, imported for pytest

S = 10**9


def recent() -> int:
    """A base time an hour ago, on a whole second (within any window Prometheus takes)."""
    return (time.time_ns() // S - 3600) * S


def labelled_batch(host: str, t0: int, job_id: str) -> wire.Batch:
    """make_batch's points, with names Prometheus would not take and strings of every kind."""
    batch = make_batch(host=host, job_id=job_id, samples=6, t0=t0, labels={"rack-id": "r 1", "__x": "y", "U__z": "ü"})
    opened = batch.job_events[0]
    opened.event_seq = (12345 << 32) + 7  # beyond a float64's exact integers
    opened.holder_pid, opened.holder_start_ticks, opened.holder_boot_id = 4242, 99, "boot-x"
    opened.service = True  # read back as stored
    opened.labels.update({"team.name": "vision", "empty": "", "0lead": "digit"})
    batch.job_events[-1].abandoned = "holder died"
    return batch


def assert_reads_equal(store: PrometheusStore, sqlite: SqliteStore, host: str, job_id: str, t0: int) -> None:
    assert store.job_events(job_id) == sqlite.job_events(job_id)
    assert store.job_events(job_id, every=False) == sqlite.job_events(job_id, every=False)
    assert store.job_events_between(t0, t0 + S, [host]) == sqlite.job_events_between(t0, t0 + S, [host])
    for t in (t0 - 1000 * S, t0 + S // 2, t0 + 3 * S, t0 + 1000 * S):  # near, and far on one side
        for mine, theirs in zip(store.around(host, [t])[0], sqlite.around(host, [t])[0], strict=True):
            assert sorted(mine, key=repr) == sorted(theirs, key=repr)
    assert store.samples(host, t0, t0 + 3_500_000_000) == sqlite.samples(host, t0, t0 + 3_500_000_000)


@pytest.fixture
def stores(tmp_path: Path, prometheus: Daemon) -> Iterator[tuple[PrometheusStore, SqliteStore]]:
    with PrometheusStore(prometheus.url) as prom, SqliteStore(tmp_path / "w.db") as sqlite:
        yield prom, sqlite


@pytest.mark.servers
def test_reads_equal_sqlite_resends_included(stores: tuple[PrometheusStore, SqliteStore]) -> None:
    prom, sqlite = stores
    t0 = recent()
    batch = labelled_batch("prom-reads", t0, "prom-reads-job")
    for _ in range(2):  # a resend
        assert prom.write(batch).written == sqlite.write(batch).written == 10
    opened = prom.job_events("prom-reads-job")[0]
    assert opened.fields["label_team.name"] == "vision" and opened.fields["label_0lead"] == "digit"
    assert opened.fields["label_empty"] == "" and opened.event_seq == (12345 << 32) + 7
    assert_reads_equal(prom, sqlite, "prom-reads", "prom-reads-job", t0)
    expected = sqlite.samples("prom-reads", t0, t0 + 10 * S)
    assert len(expected) == 6 and expected == prom.samples("prom-reads", t0, t0 + 10 * S)


@pytest.mark.servers
def test_what_the_engine_refuses_is_counted_and_nothing_else_is_lost(
    stores: tuple[PrometheusStore, SqliteStore],
) -> None:
    """A batch older than the engine's out-of-order window is refused (Prometheus 2.42: 500
    "too old sample"), also inside a group commit, whose other batch is written; two points of
    one series in one millisecond: the second is refused. Every point sent is read back or
    counted as rejected."""
    prom, _ = stores
    t0 = recent()
    fresh = make_batch(host="prom-refused", samples=4, t0=t0, stream="fresh")
    old = make_batch(host="prom-refused", samples=3, t0=t0 - (PROMETHEUS_OOO_WINDOW_S + 3600) * S, stream="old")
    assert prom.write(make_batch(host="prom-refused", samples=2, t0=t0 - 60 * S)).written == 2  # the head's newest
    alone = prom.write(old)
    assert (alone.written, alone.rejected) == (0, 3) and "too old sample" in alone.reasons[-1]
    later = make_batch(host="prom-refused", samples=4, t0=t0 + 10 * S, stream="later")
    grouped = prom.write_group([later, old])
    assert [(r.written, r.rejected) for r in grouped] == [(4, 0), (0, 3)]
    twice = make_batch(host="prom-refused", job_id="prom-twice", samples=0, t0=t0)
    units = twice.job_events[1]
    again = twice.job_events.add()
    again.CopyFrom(units)
    again.event_seq, again.units = 100, 7.0  # the same series (seq_block 0) and millisecond
    result = prom.write(twice)
    assert (result.written, result.rejected) == (4, 1) and "holds that millisecond" in result.reasons[0]
    prom.write(fresh)
    stored = prom.samples("prom-refused", t0 - 10**6 * S, t0 + 10**6 * S)
    assert sorted({s.stream for s in stored}) == ["fresh", "later", "stream-a"]
    assert len(stored) == 2 + 4 + 4
    assert [e.event_seq for e in prom.job_events("prom-twice")] == [1, 2, 3, 4]


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """Prometheus without an out-of-order window (its default) and a query limit of 2,000 samples."""
    daemon = start_prometheus(tmp_path_factory.mktemp("prometheus-strict"), 0, "--query.max-samples=2000")
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.mark.servers
def test_without_an_out_of_order_window_and_under_a_small_sample_limit(tmp_path: Path, strict: Daemon) -> None:
    """A resend is refused there ("out of order sample") yet reads back as stored: written.
    A late units event is refused with its batch (Prometheus appends a request whole): its
    points are rejected with the reason. Reads over more samples than one query may load are
    read in parts and stay exact."""
    t0 = recent()
    with PrometheusStore(strict.url) as prom, SqliteStore(tmp_path / "w.db") as sqlite:
        batch = labelled_batch("prom-strict", t0, "prom-strict-job")
        long = make_batch(host="prom-strict", samples=400, t0=t0 - 600 * S, stream="long")
        for b in (long, batch, batch):
            result = prom.write(b)
            assert (result.written, result.rejected) == (sqlite.write(b).written, 0)
        late = labelled_batch("prom-strict", t0 + 100 * S, "prom-strict-job")
        del late.samples[1:]
        del late.job_events[2:]
        del late.job_events[0]  # a sample after the others, and a units event older than its series' newest:
        units = late.job_events[0]
        units.event_seq, units.time_ns = batch.job_events[1].event_seq + 100, batch.job_events[1].time_ns - S // 2
        refused = prom.write(late)
        assert (refused.written, refused.rejected) == (0, 2) and "out of order sample" in refused.reasons[-1]
        assert prom.job_events("prom-strict-job") == sqlite.job_events("prom-strict-job")
        far = t0 - 1000 * S
        for mine, theirs in zip(
            prom.around("prom-strict", [far])[0], sqlite.around("prom-strict", [far])[0], strict=True
        ):
            assert sorted(mine, key=repr) == sorted(theirs, key=repr)
        everything = (t0 - 700 * S, t0 + 10 * S)
        assert prom.samples("prom-strict", *everything) == sqlite.samples("prom-strict", *everything)
        assert len(prom.samples("prom-strict", *everything)) == 406  # 7 fields a sample: over 2,000 per query


@pytest.mark.servers
def test_a_summary_reads_back_as_last_written(stores: tuple[PrometheusStore, SqliteStore]) -> None:
    prom, _ = stores
    t0 = recent()
    fields = {
        "status": "running",
        "closed": False,
        "energy_j": 12.5,
        "hosts": 1,
        "start_ns": t0 + 7,
        "schema": "wattline.job_summary/1",
    }
    first = JobSummary("prom-sum", t0 + 7, {"name": "n", "kind": "inference"}, fields, {"h": 12.5})
    assert prom.write_summary(first).written == 2
    assert prom.job_summary("prom-sum") == first
    closed = JobSummary(first.job_id, t0 + 7, first.tags, {**fields, "status": "closed", "closed": True}, {"h": 13.0})
    lower = JobSummary(first.job_id, t0 + 7, first.tags, {**fields, "energy_j": 3.25}, {"h": 3.25})
    for summary in (closed, lower):
        assert prom.write_summary(summary).written == 2
        assert prom.job_summary("prom-sum") == summary


#: Grafana Mimir's paths (its tenant in ``X-Scope-OrgID``) -> Prometheus' own.
MIMIR: dict[str, Route] = {
    "push": (re.compile(r"/api/v1/push$"), "POST", "/api/v1/write"),
    "query": (re.compile(r"/prometheus(?P<rest>/api/v1/[a-z_/]+(\?.*)?)$"), "GET", None),
}


@pytest.mark.servers
def test_a_tenant_through_mimir_paths(tmp_path: Path, prometheus: Daemon) -> None:
    """``prometheus+http://HOST/prometheus?write=/api/v1/push`` with ``--tenant``: Mimir's paths,
    each request with the tenant's ``X-Scope-OrgID`` (a proxy that routes only those forwards
    them to Prometheus), reads back what SQLite does; without the tenant nothing is taken."""
    proxy = PrefixProxy(prometheus.url, MIMIR, tenant="team-a.1")
    url = f"prometheus+{proxy.url}/prometheus?write=/api/v1/push"
    t0 = recent()
    batch = labelled_batch("prom-tenant", t0, "prom-tenant-job")
    try:
        with open_store(url, tenant="team-a.1") as store, SqliteStore(tmp_path / "w.db") as sqlite:
            assert isinstance(store, PrometheusStore)
            assert store.write(batch).written == sqlite.write(batch).written == 10
            assert_reads_equal(store, sqlite, "prom-tenant", "prom-tenant-job", t0)
        with open_store(url) as anonymous, pytest.raises(StoreUnavailable, match="answered 404"):
            anonymous.write(batch)
    finally:
        proxy.close()
    assert proxy.seen["push"] == 1 and proxy.seen["query"] > 3 and proxy.seen["unrouted"] == 1


@pytest.mark.servers
def test_collector_summaries_and_reports_with_a_tenant(tmp_path: Path, tree: Any, prometheus: Daemon) -> None:
    """`wattline collector` and `wattline run` writing through Mimir's paths with a tenant: the
    job's summary converges, and `wattline report` through them and from Prometheus agree."""
    proxy = PrefixProxy(prometheus.url, MIMIR, tenant="team-a.1")
    where = ["--store", f"prometheus+{proxy.url}/prometheus?write=/api/v1/push", "--tenant", "team-a.1"]
    try:
        with PrometheusStore(prometheus.url) as node:
            collector_and_reports(tmp_path, tree, where, node, lambda: None)  # remote write: searchable once taken
    finally:
        proxy.close()
    assert proxy.seen["unrouted"] == 0 and proxy.seen["push"] > 0


@given(st.text(max_size=30))
def test_names_escape_to_the_prometheus_charset_and_back(name: str) -> None:
    escaped = escape_name(name)
    assert unescape_name(escaped) == name
    assert escaped == "" or (escaped[0].isascii() and (escaped[0].isalpha() or escaped[0] == "_"))
    assert all(c.isascii() and (c.isalnum() or c == "_") for c in escaped)


@pytest.mark.parametrize(
    ("url", "base", "write"),
    [
        ("prometheus+http://p:9090", "http://p:9090", "http://p:9090/api/v1/write"),
        (
            "prometheus+https://m:8080/prometheus?write=/api/v1/push",
            "https://m:8080/prometheus",
            "https://m:8080/api/v1/push",
        ),
        (
            "prometheus+http://q:10902?write=http://r:19291/api/v1/receive",
            "http://q:10902",
            "http://r:19291/api/v1/receive",
        ),
    ],
)
def test_the_url_forms(url: str, base: str, write: str) -> None:
    assert parse_url(url) == (base, write)
