"""What reports read: a job's own events, and only the jobs near its window (InfluxDB 1.x and SQLite)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from servers import T0, Influxd, sqlite_or_influxdb1_store  # noqa: F401 (fixture store)

from wattline import wire
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.jobs.jobs_view import all_views
from wattline.reports.summaries.summary import record_local_summary
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.influxdb.v2 import InfluxV2Store
from wattline.stores.reader import JOB_LOOKBACK_NS, Reader, StoredJobEvent, SummaryStore
from wattline.stores.sqlite.store import SqliteStore

S = 10**9
DAY = 86400 * S
WINDOW = (T0 + 100 * S, T0 + 200 * S)  # the job being reported: on h1 and h2


def job(
    store: SqliteStore | InfluxV1Store,
    job_id: str,
    hosts: list[str],
    open_ns: int,
    close_ns: int | None,
    heartbeats: tuple[int, ...] = (),
) -> None:
    """``job_id`` on ``hosts``: open, a UNITS event and a phase mark, ``heartbeats``, and close unless None."""
    for host in hosts:
        b = EventBuilder(JobSpec(job_id, f"name of {job_id}", "training", "steps", {"team": "t"}))
        batch = wire.Batch(stream_id=f"{job_id}-{host}", seq=1)
        batch.host.host_id = host
        batch.host.labels["cluster"] = "c1"
        events = [b.open(open_ns), b.units(5.0, open_ns + S), b.phase("saturated", open_ns + 2 * S)]
        events += [b.heartbeat(t) for t in heartbeats]
        if close_ns is not None:
            events.append(b.close(3, close_ns))
        batch.job_events.extend(events)
        assert store.write(batch).rejected == 0


def fill(store: SqliteStore | InfluxV1Store) -> None:
    job(store, "target", ["h1", "h2"], *WINDOW)
    job(store, "before", ["h1"], T0, T0 + 50 * S)  # near, not overlapping: the caller decides
    job(store, "spanning", ["h2"], T0 + 50 * S, T0 + 300 * S)
    job(store, "long", ["h1"], T0 - 40 * DAY, T0 + 150 * S)  # opened long ago: found by its close
    job(store, "running", ["h2"], T0 + 150 * S, None)
    job(store, "multi", ["h1", "h3"], T0 + 120 * S, T0 + 130 * S)  # its h3 part comes too
    job(store, "abandoned", ["h1"], T0 - 40 * DAY, None)  # never closed, opened beyond the look-back
    # opened beyond the look-back, still beating in the window: found by its heartbeats
    job(store, "beating", ["h1"], T0 - 40 * DAY, None, (T0 + 90 * S, T0 + 120 * S, T0 + 150 * S))
    job(store, "elsewhere", ["h3"], *WINDOW)
    job(store, "ancient", ["h1"], T0 - 60 * DAY, T0 - 59 * DAY)
    job(store, "future", ["h2"], T0 + 40 * DAY, T0 + 41 * DAY)


def test_job_events_between_reads_only_open_and_close_of_jobs_near_the_window(
    store: SqliteStore | InfluxV1Store,
) -> None:
    fill(store)
    events = store.job_events_between(*WINDOW, ["h1", "h2"])
    by_job: dict[str, list[StoredJobEvent]] = {}
    for e in events:
        by_job.setdefault(e.job_id, []).append(e)
    assert sorted(by_job) == ["beating", "before", "long", "multi", "running", "spanning", "target"]
    assert {e.event for e in events} == {"open", "close", "heartbeat"}
    # an unclosed job comes with one "heartbeat": when it was last heard (its latest event, any kind)
    assert [(e.event, e.time_ns) for e in by_job["running"]] == [("open", T0 + 150 * S), ("heartbeat", T0 + 152 * S)]
    assert [(e.event, e.time_ns) for e in by_job["beating"]] == [("open", T0 - 40 * DAY), ("heartbeat", T0 + 150 * S)]
    assert not any(e.event == "heartbeat" for e in events if e.job_id != "running" and e.job_id != "beating")
    assert [(e.host, e.event) for e in by_job["multi"]] == [
        ("h1", "open"),
        ("h3", "open"),
        ("h1", "close"),
        ("h3", "close"),
    ]
    assert [(e.event, e.time_ns) for e in by_job["long"]] == [("open", T0 - 40 * DAY), ("close", T0 + 150 * S)]
    opened = by_job["spanning"][0]
    assert opened.fields == {
        "name": "name of spanning",
        "job_kind": "training",
        "unit_name": "steps",
        "devices": "",
        "label_team": "t",
        # who holds the job: the process that built the open (this one)
        "holder_pid": os.getpid(),
        "holder_start_ticks": opened.fields["holder_start_ticks"],
        "holder_boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
    }
    assert int(opened.fields["holder_start_ticks"]) > 0
    assert opened.event_seq % 2**32 == 1 and by_job["spanning"][1].fields == {"exit_code": 3}  # builder's 1st
    assert events == sorted(events, key=lambda e: (e.time_ns, e.host, e.event_seq))
    assert store.job_events_between(*WINDOW, []) == []
    assert JOB_LOOKBACK_NS < 40 * DAY


def test_job_events_of_one_job_and_of_all(store: SqliteStore | InfluxV1Store) -> None:
    fill(store)
    events = store.job_events("multi")
    assert [(e.host, e.event, e.event_seq % 2**32) for e in events] == [  # each builder counts from its base
        ("h1", "open", 1),
        ("h3", "open", 1),
        ("h1", "units", 2),
        ("h3", "units", 2),
        ("h1", "phase", 3),
        ("h3", "phase", 3),
        ("h1", "close", 4),
        ("h3", "close", 4),
    ]
    assert [e.fields for e in events[2:6:2]] == [{"units": 5.0}, {"phase": "saturated"}]
    assert events[0].fields["label_team"] == "t" and "cluster" not in events[0].fields
    assert all(e.job_id == "multi" for e in events)
    assert len(store.job_events()) == 13 * 4 - 3 + 3  # 13 host parts of jobs, three never closed, 3 heartbeats
    views = [v.job_id for v in all_views(store)]
    assert views[0] == "ancient" and set(views[1:4]) == {"abandoned", "beating", "long"} and views[-1] == "future"


def test_only_stores_that_are_read_back_type_as_readers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Reports, summaries and ``open_reader`` decide by the Reader protocol: SQLite and InfluxDB
    1.x are read back, an InfluxDB 2.x store (write-only here) is not, and a run into it says so."""
    sqlite = SqliteStore(str(tmp_path / "w.db"))
    v1 = InfluxV1Store("http://127.0.0.1:9", "wattline")
    v2 = InfluxV2Store("http://127.0.0.1:9", "org", "bucket", "token")
    assert isinstance(sqlite, SummaryStore) and isinstance(v1, SummaryStore)
    assert not isinstance(v2, Reader) and not isinstance(v2, SummaryStore)
    record_local_summary(None, "job-v2", opener=lambda: v2)
    assert "job job-v2: no summary written (a influxdb2 store is not read back)" in caplog.text
    sqlite.close()
    v1.close()


def test_around_reads_every_edge_at_once_as_the_single_edge_queries_do(store: SqliteStore | InfluxV1Store) -> None:
    """``around`` (one round trip per host in InfluxDB) gives, per instant, exactly what
    ``last_before`` and ``first_after`` give: instants on a sample's end, between samples,
    before the first and after the last; two series with different intervals; another host."""
    batch = wire.Batch(stream_id="s", seq=1)
    batch.host.host_id = "h1"
    for device, step in (("package-0", 1), ("package-0/dram", 3)):
        for k in range(1, 10):
            end = T0 + k * step * S
            batch.samples.append(
                wire.Sample(
                    source="rapl",
                    component="cpu_package" if step == 1 else "dram",
                    device=device,
                    quality=wire.pb.QUALITY_COUNTER,
                    start_ns=end - step * S,
                    end_ns=end,
                    energy_j=2.0 * k,
                    cumulative_j=float(k * k),
                    healthy=True,
                )
            )
    assert store.write(batch).rejected == 0
    other = wire.Batch(stream_id="o", seq=1)
    other.host.host_id = "h2"
    other.samples.append(wire.Sample(source="rapl", component="dram", device="d", start_ns=T0, end_ns=T0 + 4 * S))
    assert store.write(other).rejected == 0
    instants = [T0 - S, T0 + 3 * S, T0 + 3 * S + S // 2, T0 + 9 * S, T0 + 27 * S, T0 + 40 * S]
    found = store.around("h1", instants)
    assert found == [(store.last_before("h1", t), store.first_after("h1", t)) for t in instants]
    assert [(len(b), len(a)) for b, a in found] == [(0, 2), (2, 2), (2, 2), (2, 2), (2, 1), (2, 0)]
    assert {s.end_ns for s in found[1][0]} == {T0 + 3 * S} and {s.end_ns for s in found[2][1]} == {
        T0 + 4 * S,
        T0 + 6 * S,
    }
    assert store.around("h1", []) == []


def test_neuroncores_per_device_is_read_back_where_a_sample_has_it(store: SqliteStore | InfluxV1Store) -> None:
    """The Neuron source's ``neuroncores_per_device`` gauge comes back on every read (samples,
    edges) as the sample's count; a sample without it (an older agent, another source) reads None."""
    batch = wire.Batch(stream_id="s", seq=1)
    batch.host.host_id = "trn"
    for k, cores in ((1, None), (2, 8.0), (3, 8.0)):
        sample = wire.Sample(source="neuron", component="accelerator", device="neuron0", quality=wire.pb.QUALITY_MODEL,
                             start_ns=T0 + (k - 1) * S, end_ns=T0 + k * S, energy_j=1.0, cumulative_j=k, healthy=True)  # fmt: skip
        if cores is not None:
            sample.gauges["neuroncores_per_device"] = cores
            sample.gauges["memory_used_bytes"] = 1e9
        batch.samples.append(sample)
    batch.samples.append(wire.Sample(source="rapl", component="dram", device="d", start_ns=T0, end_ns=T0 + S))
    assert store.write(batch).rejected == 0
    got = {(s.device, s.end_ns): s.neuroncores_per_device for s in store.samples("trn", T0, T0 + 3 * S)}
    assert got == {
        ("neuron0", T0 + S): None,
        ("neuron0", T0 + 2 * S): 8,
        ("neuron0", T0 + 3 * S): 8,
        ("d", T0 + S): None,
    }
    [(before, after)] = store.around("trn", [T0 + 2 * S])
    assert {(s.device, s.neuroncores_per_device) for s in before} == {("neuron0", 8), ("d", None)}
    assert {(s.device, s.neuroncores_per_device) for s in after} == {("neuron0", 8)}
