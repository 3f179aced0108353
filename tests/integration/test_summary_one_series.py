"""A job's summary is one series on VictoriaMetrics and Prometheus (#45): rewrites that change
its status, saturation method and figures, sent back to back, leave one label set per job
(counted through the engine's own series API, not wattline's reader), and wattline reads back
the newest figures."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from typing import get_args

import pytest
from servers import Daemon, VictoriaMetrics, http, searchable
from waits import wait_until

from wattline.accounting.attribution import IdleMode
from wattline.reports.summaries.summary import SCHEMA as SUMMARY_SCHEMA
from wattline.stores.base import JobSummary
from wattline.stores.lineprotocol import LineProtocolError
from wattline.stores.prometheus.store import PrometheusStore
from wattline.stores.series.points import SUMMARY_CODES, summary_points, summary_value
from wattline.stores.series.reads import SeriesReads
from wattline.stores.victoria.store import VictoriaStore

S = 10**9
SCHEMA = "wattline.job_summary/1"


def rewrites(job_id: str, start_ns: int) -> list[JobSummary]:
    """Three summaries of one job as a collector writes them while it runs, closes and is
    recomputed: each changes its status or saturation method and its figures."""
    base = {"schema": SCHEMA, "hosts": 1, "start_ns": start_ns, "policy_idle": "none", "policy_share_rule": "equal"}
    versions = [
        {"status": "running", "closed": False, "saturation_method": "none", "energy_j": 10.0, "computed_ns": 1},
        {"status": "closed", "closed": True, "saturation_method": "after", "energy_j": 20.0, "exit_code": 0},
        {"status": "abandoned", "closed": True, "saturation_method": "manual", "energy_j": 15.5, "exit_code": 1},
    ]
    return [
        JobSummary(job_id, start_ns, {"name": "one", "kind": "training"}, {**base, **v, "computed_ns": i}, {"h": i})
        for i, v in enumerate(versions, 1)
    ]


def label_sets(url: str, job_id: str, start_ns: int) -> set[tuple[tuple[str, str], ...]]:
    """The label sets (metric name left out) of ``job_id``'s ``job_summary_*`` series, as the
    engine's ``/api/v1/series`` lists them."""
    query = urllib.parse.urlencode(
        {
            "match[]": f'{{__name__=~"job_summary_.+",job_id="{job_id}"}}',
            "start": str(start_ns // S - 86400),
            "end": str(time.time_ns() // S + 86400),
        }
    )
    status, body = http("GET", f"{url}/api/v1/series?{query}")
    assert status == 200, body
    series = json.loads(body)["data"]
    assert series, f"no summary series of {job_id}"
    return {tuple(sorted((k, v) for k, v in s.items() if k != "__name__")) for s in series}


@pytest.fixture(params=["victoria", "prometheus"])
def engine(
    request: pytest.FixtureRequest, victoria_metrics: VictoriaMetrics, prometheus: Daemon
) -> Iterator[tuple[SeriesReads, str]]:
    """A store on each engine, and the engine's URL."""
    if request.param == "victoria":
        with VictoriaStore(victoria_metrics.url) as vm:
            yield vm, victoria_metrics.url
    else:
        with PrometheusStore(prometheus.url) as prom:
            yield prom, prometheus.url


@pytest.mark.servers
def test_rewrites_back_to_back_stay_one_series_and_read_back_newest(engine: tuple[SeriesReads, str]) -> None:
    store, url = engine
    start = (time.time_ns() // S - 3600) * S + 7
    job_id = f"one-series-{type(store).__name__}"
    versions = rewrites(job_id, start)
    for summary in versions:  # at once: VictoriaMetrics shows none of them yet
        assert store.write_summary(summary).written == 2
    newest = versions[-1]

    def read() -> JobSummary | None:
        searchable(url)
        found = store.job_summary(job_id)
        return found if found == newest else None

    wait_until(read, f"the newest summary of {job_id}")
    searchable(url)
    assert label_sets(url, job_id, start) == {
        (("host", "h"), ("job_id", job_id), ("kind", "training"), ("name", "one")),
        (("job_id", job_id), ("kind", "training"), ("name", "one")),
    }


@pytest.mark.servers
def test_a_summary_of_the_layout_before_45_still_reads_and_the_newest_copy_wins(
    victoria_metrics: VictoriaMetrics,
) -> None:
    """A summary stored before #45 (status a label, bools named in a label) reads back as it
    was written; beside a rewrite in today's layout, the newer computed is the summary."""
    start = (time.time_ns() // S - 7200) * S
    job_id = "old-layout"
    old_tags = {"job_id": job_id, "name": "one", "status": "running", "bool_fields": '["closed"]'}
    old_fields = {"closed": False, "energy_j": 4.5, "sub_ns": 0, "computed_ns__hi": 1, "computed_ns__lo": 0}
    with VictoriaStore(victoria_metrics.url) as vm:
        line = vm.encoder.line("job_summary", old_tags, old_fields, start)
        assert vm.write_lines([line]).written == 1
        old = JobSummary(job_id, start, {"name": "one"}, {"status": "running", "closed": False, "energy_j": 4.5}, {})
        old.fields["computed_ns"] = 10**6

        def shown(want: JobSummary) -> bool:
            searchable(victoria_metrics.url)
            return vm.job_summary(job_id) == want

        wait_until(lambda: shown(old), "the summary of the old layout")
        newer = rewrites(job_id, start)[1]
        newer.fields["computed_ns"] = 2 * 10**6
        # Written as a collector that missed the old copy writes it: the delete is not sent.
        assert super(VictoriaStore, vm).write_summary(newer).written == 2
        wait_until(lambda: shown(newer), "the rewrite, newer than the old copy")
        assert len(vm.job_summaries_of(job_id)) == 2  # both kept: the old copy's older figures only


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"status": "paused"}, "string field 'status' = 'paused' has no code in this layout"),
        ({"owner": "ana"}, "string field 'owner' = 'ana' has no code in this layout"),
        ({"closed": True, "gpu": True}, "bool field 'gpu' is not one of ['closed', 'complete', 'saturated']"),
    ],
)
def test_a_summary_the_layout_cannot_hold_is_refused_with_why(fields: dict[str, str | bool], why: str) -> None:
    summary = JobSummary("refused", 10**18, {}, {"schema": SCHEMA, **fields}, {})
    with pytest.raises(LineProtocolError) as caught:
        summary_points(summary)
    assert str(caught.value) == why


def test_the_codes_hold_every_value_the_product_writes() -> None:
    """Each rule and idle mode a summary can name, each job state and saturation method (as
    their modules document them), has a code: no summary is refused for one."""
    assert set(SUMMARY_CODES["policy_share_rule"]) == {"cpu-time", "equal", "device-share", "exclusive"}
    assert set(SUMMARY_CODES["policy_idle"]) == set(get_args(IdleMode))
    assert set(SUMMARY_CODES["status"]) == {"closed", "running", "abandoned"}
    assert set(SUMMARY_CODES["saturation_method"]) == {"manual", "after", "throughput-plateau", "utilization", "none"}
    assert SUMMARY_CODES["schema"] == (SUMMARY_SCHEMA,)
    for key, values in SUMMARY_CODES.items():
        for code, value in enumerate(values, 1):
            assert summary_value(key, float(code)) == value
        with pytest.raises(ValueError, match="not a code this version knows"):
            summary_value(key, float(len(values) + 1))
