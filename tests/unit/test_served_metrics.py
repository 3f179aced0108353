"""Units counted from a serving process's Prometheus metrics (wattline/served_metrics.py): each
figure against a truth the test makes, a real prometheus_client registry counted up by known
amounts and served over HTTP on a loopback port (restarted to reset it), or the recorded
expositions of tests/fixtures/served_metrics/ (SOURCES.md there says each file's differences)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from servers import free_port

from wattline.served_metrics import (
    APPEARED,
    BASELINE,
    COUNTED,
    GAP,
    REFUSED,
    RESET,
    LatencyTotals,
    Reading,
    ServedCounters,
    quantile,
)
from wattline.served_scrape import ScrapeError, scrape
from wattline.served_specs import Matcher, parse_latency, parse_unit, preset

FIXTURES = Path(__file__).parents[1] / "fixtures" / "served_metrics"
#: Start of counting in the fixtures' time: after their first servers were created, before the
#: restarted Qwen server of vllm_two_models_3.txt.
START_NS = 1_765_440_000 * 10**9
STEP_NS = 5 * 10**9


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def units(reading: Reading) -> dict[tuple[str, ...], tuple[float, float]]:
    """(kind, by values...) -> (units this reading, total)."""
    return {(u.kind, *u.labels.values()): (u.units, u.total) for u in reading.units}


def latency(reading: Reading, name: str, **labels: str) -> LatencyTotals:
    (found,) = [t for t in reading.latencies if t.name == name and t.labels == labels]
    return found


def kinds(reading: Reading) -> list[str]:
    return [note.kind for note in reading.notes]


def feed(counters: ServedCounters, texts: list[str], start_ns: int = START_NS) -> list[Reading]:
    return [counters.update(text, start_ns + (i + 1) * STEP_NS) for i, text in enumerate(texts)]


class Exporter:
    """A real prometheus_client registry served on a loopback port, as a service's /metrics;
    :meth:`restart` serves a fresh registry on the same port, as a restarted server does."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.registry = CollectorRegistry()
        self._server, self._thread = start_http_server(self.port, "127.0.0.1", self.registry)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def start(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or self.registry
        self._server, self._thread = start_http_server(self.port, "127.0.0.1", self.registry)

    def restart(self) -> CollectorRegistry:
        self.stop()
        self.start(CollectorRegistry())
        return self.registry


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    served = Exporter()
    yield served
    served.stop()


class Clock:
    """Scrape times, 5 s apart, from the wall clock's now (the `_created` the registry writes)."""

    def __init__(self) -> None:
        self.start_ns = time.time_ns()
        self.now_ns = self.start_ns

    def __call__(self) -> int:
        self.now_ns += STEP_NS
        return self.now_ns


def poll(counters: ServedCounters, exporter: Exporter, clock: Clock) -> Reading:
    return counters.update(scrape(exporter.url, 5.0), clock())


# --- the spec grammar


def test_a_spec_line_gives_its_metric_matchers_and_split() -> None:
    spec = parse_unit(
        r'output_tokens=vllm:generation_tokens_total{model_name=~"llama.*",x!="a \"b\" by c",} by (model_name)'
    )
    assert (spec.name, spec.metric, spec.by) == ("output_tokens", "vllm:generation_tokens_total", ("model_name",))
    assert spec.matchers == (Matcher("model_name", "=~", "llama.*"), Matcher("x", "!=", 'a "b" by c'))
    assert parse_unit(str(spec)) == spec  # str gives the line back
    assert parse_unit("requests=nv_inference_request_success", by=["model", "version"]).by == ("model", "version")
    assert parse_latency("e2e=tgi_request_duration").matchers == ()


def test_matchers_match_as_promql_does() -> None:
    labels = {"model": "llama-8b", "empty": ""}
    assert Matcher("model", "=~", "llama").matches(labels) is False  # a regex matches the whole value
    assert Matcher("model", "=~", "llama.*").matches(labels) is True
    assert Matcher("model", "!~", "qwen.*").matches(labels) is True
    assert Matcher("model", "!=", "llama-8b").matches(labels) is False
    assert Matcher("absent", "=", "").matches(labels) is True  # an absent label is the empty value
    assert Matcher("absent", "=~", ".+").matches(labels) is False


@pytest.mark.parametrize(
    ("line", "by", "said"),
    [
        ("requests", (), "expected NAME=METRIC"),
        ("Requests=x_total", (), "NAME must be a short name"),
        ("requests=9x", (), "METRIC must be a Prometheus metric name"),
        ('requests=x{model="a"', (), "expected METRIC or METRIC{MATCHERS}"),
        ("requests=x{model=a}", (), 'expected LABEL OP "VALUE"'),
        ('requests=x{model=~"("}', (), "model=~: not a regular expression"),
        ("requests=x by model,model", (), "a by label is named twice"),
        ("requests=x by model-name", (), "a label name is"),
        ("requests=x by model", ("model",), "by is given twice"),
        ("requests=x extra", (), "expected METRIC or METRIC{MATCHERS}"),
    ],
)
def test_a_bad_unit_spec_is_one_line_saying_what_is_wrong(line: str, by: tuple[str, ...], said: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_unit(line, by=by)
    message = str(caught.value)
    assert said in message and "\n" not in message and message.startswith(f"unit spec {line!r}")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("e2e=vllm:e2e_request_latency_seconds_bucket", "without _bucket"),
        ("e2e=h by le", "le label names the buckets"),
        ('e2e=h{le="1.0"}', "le label names the buckets"),
    ],
)
def test_a_bad_latency_spec_is_one_line(line: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        parse_latency(line)


def test_presets_parse_and_an_unknown_one_is_named() -> None:
    for name in ("vllm", "triton", "tgi", "torchserve"):
        known = preset(name)
        assert known.unit_specs() and all(source.startswith("https://") for source in known.sources)
        known.latency_specs()
    with pytest.raises(ValueError, match="no preset 'sglang': known are vllm, triton, tgi, torchserve"):
        preset("sglang")
    with pytest.raises(ValueError, match="a unit kind is named twice"):
        ServedCounters([parse_unit("a=x"), parse_unit("a=y")], start_ns=0)


# --- counting a live server's counters


def test_a_counter_there_before_we_watched_is_a_baseline(exporter: Exporter) -> None:
    done = Counter("app_requests", "Requests", ["model"], registry=exporter.registry)
    done.labels("a").inc(5)  # served before counting began
    clock = Clock()
    counters = ServedCounters([parse_unit("requests=app_requests_total by model")], start_ns=clock.start_ns)
    first = poll(counters, exporter, clock)
    assert units(first) == {("requests", "a"): (0.0, 0.0)}
    assert kinds(first) == [BASELINE]
    done.labels("a").inc(3)
    assert units(poll(counters, exporter, clock)) == {("requests", "a"): (3.0, 3.0)}


def test_a_server_the_holder_started_is_counted_from_zero(exporter: Exporter) -> None:
    Counter("app_requests", "Requests", registry=exporter.registry).inc(5)
    clock = Clock()
    counters = ServedCounters([parse_unit("requests=app_requests_total")], start_ns=clock.start_ns, started_server=True)
    first = poll(counters, exporter, clock)
    assert units(first) == {("requests",): (5.0, 5.0)} and kinds(first) == [COUNTED]


def test_a_counter_created_at_or_after_the_start_counts_from_zero() -> None:
    """app_2.txt as the first scrape: model a's series were created before the start (a
    baseline), model b's after it (its 2 requests and 2 latencies are ours)."""
    counters = ServedCounters(
        [parse_unit("requests=app_requests_total by model")],
        [parse_latency("latency=app_request_latency_seconds by model")],
        start_ns=START_NS,
    )
    (first,) = feed(counters, [fixture("app_2.txt")])
    assert units(first) == {("requests", "a"): (0.0, 0.0), ("requests", "b"): (2.0, 2.0)}
    assert latency(first, "latency", model="b").count == 2.0 and latency(first, "latency", model="a").count == 0.0
    assert kinds(first) == [BASELINE, COUNTED, BASELINE, COUNTED]


def test_a_series_that_appears_later_counts_from_zero(exporter: Exporter) -> None:
    done = Counter("app_requests", "Requests", ["model"], registry=exporter.registry)
    done.labels("a").inc(4)
    clock = Clock()
    counters = ServedCounters([parse_unit("requests=app_requests_total by model")], start_ns=clock.start_ns)
    poll(counters, exporter, clock)
    done.labels("b").inc(2)  # a model loaded since: all its requests are ours
    done.labels("a").inc(1)
    later = poll(counters, exporter, clock)
    assert units(later) == {("requests", "a"): (1.0, 1.0), ("requests", "b"): (2.0, 2.0)}
    assert kinds(later) == [APPEARED]


def test_a_restart_is_a_reset_whether_the_value_drops_or_only_created_changes(exporter: Exporter) -> None:
    Counter("app_requests", "Requests", registry=exporter.registry).inc(10)
    clock = Clock()
    counters = ServedCounters([parse_unit("requests=app_requests_total")], start_ns=clock.start_ns)
    poll(counters, exporter, clock)
    Counter("app_requests", "Requests", registry=exporter.restart()).inc(4)  # restarted: 4 since
    dropped = poll(counters, exporter, clock)
    assert units(dropped) == {("requests",): (4.0, 4.0)}
    assert [n.message for n in dropped.notes] == ["app_requests_total: reset (it went down); counted from 0 again"]
    time.sleep(0.01)  # a later _created than the last server's
    Counter("app_requests", "Requests", registry=exporter.restart()).inc(25)  # past the old 4
    grown = poll(counters, exporter, clock)
    assert units(grown) == {("requests",): (25.0, 29.0)}
    assert "reset (its _created changed)" in grown.notes[0].message


def test_failed_scrapes_count_nothing_and_the_next_reading_carries_the_gap(exporter: Exporter) -> None:
    done = Counter("app_requests", "Requests", registry=exporter.registry)
    clock = Clock()
    counters = ServedCounters([parse_unit("requests=app_requests_total")], start_ns=clock.start_ns)
    assert counters.failed(clock(), "connection refused") is None  # nothing counted yet: no gap
    good = poll(counters, exporter, clock)
    exporter.stop()
    gaps = []
    for _ in range(2):
        with pytest.raises(ScrapeError) as down:
            scrape(exporter.url, 1.0)
        gaps.append(counters.failed(clock(), str(down.value)))
        done.inc(3)  # the server counts on while its endpoint is down
    exporter.start()
    after = poll(counters, exporter, clock)
    assert units(after) == {("requests",): (6.0, 6.0)}  # the gap's units, counted at the next good scrape
    assert gaps[1] is not None and (gaps[1].start_ns, gaps[1].end_ns, gaps[1].failures) == (good.time_ns, None, 2)
    assert after.gap is not None and (after.gap.start_ns, after.gap.end_ns) == (good.time_ns, after.time_ns)
    assert "Connection refused" in after.gap.reason and kinds(after) == [GAP]
    assert counters.gap is None and poll(counters, exporter, clock).gap is None


def test_a_scrape_that_cannot_be_parsed_is_a_scrape_error_that_changes_nothing() -> None:
    counters = ServedCounters([parse_unit("requests=x_total")], start_ns=START_NS)
    with pytest.raises(ScrapeError, match="unparsable exposition"):
        counters.update("<html><body>502 Bad Gateway</body></html>\n", START_NS + STEP_NS)  # a proxy's page
    counters.update("x_total 4\n", START_NS + 2 * STEP_NS)
    assert units(counters.update("x_total 6\n", START_NS + 3 * STEP_NS)) == {("requests",): (2.0, 2.0)}
    with pytest.raises(ValueError, match="scrape times must increase"):
        counters.update("x_total 7\n", START_NS + 3 * STEP_NS)


def test_bad_values_and_gauges_are_refused_never_counted() -> None:
    """ok: 5 (baseline), 7, NaN (refused), 9: counted 2, 0, 2. bad: refused at the first scrape
    (there before we watched), so its first good value is its baseline."""

    def scrape_of(ok: str, bad: str) -> str:
        return f'# TYPE jobs_total counter\njobs_total{{k="ok"}} {ok}\njobs_total{{k="bad"}} {bad}\n# TYPE queue gauge\nqueue 3\n'

    counters = ServedCounters([parse_unit("done=jobs_total by k"), parse_unit("queued=queue")], start_ns=START_NS)
    texts = [
        scrape_of("5", "NaN"),
        scrape_of("7", "4"),
        scrape_of("NaN", "-1"),
        scrape_of("9", "+Inf"),
        scrape_of("9", "6"),
    ]
    readings = feed(counters, texts)
    assert [units(r)[("done", "ok")][0] for r in readings] == [0.0, 2.0, 0.0, 2.0, 0.0]
    assert [units(r).get(("done", "bad"), (0.0,))[0] for r in readings] == [0.0, 0.0, 0.0, 0.0, 2.0]
    assert ("queued",) not in units(readings[-1])
    first = [n.message for n in readings[0].notes if n.kind == REFUSED]
    assert first == [
        'jobs_total{k="bad"}: its value nan is not a finite count >= 0; not counted',
        "queue: a gauge, not a counter; not counted",
    ]
    assert 'jobs_total{k="bad"}: its value -1 is not a finite count >= 0; not counted' in [
        n.message for n in readings[2].notes
    ]


def test_by_splits_per_model_and_sums_every_other_label() -> None:
    """vLLM's finished requests: per model_name, summed over finished_reason and engine; and
    the same counter with no by, one series over both models."""
    specs = [
        parse_unit("requests=vllm:request_success_total by model_name"),
        parse_unit('all=vllm:request_success_total{finished_reason!="abort"}'),
    ]
    readings = feed(ServedCounters(specs, start_ns=START_NS), [fixture(f"vllm_two_models_{i}.txt") for i in (1, 2)])
    assert units(readings[1]) == {
        ("requests", "meta-llama/Llama-3.1-8B-Instruct"): (5.0, 5.0),
        ("requests", "Qwen/Qwen2.5-7B-Instruct"): (2.0, 2.0),
        ("all",): (7.0, 7.0),
    }


# --- latency histograms and their quantiles

#: Bounds and observations whose quantiles are worked out by hand below.
BOUNDS = (0.1, 0.5, 1.0)
FIRST = (0.05, 0.2, 0.3, 0.4, 0.7, 2.0)  # cumulative: <=0.1 1, <=0.5 4, <=1.0 5, +Inf 6
THEN = (0.15, 0.15, 0.6, 0.9)  # the window's own: <=0.1 0, <=0.5 2, <=1.0 4, +Inf 4


def test_a_histograms_running_totals_and_its_quantiles_over_a_window(exporter: Exporter) -> None:
    seconds = Histogram("app_latency_seconds", "Latency", ["model"], buckets=BOUNDS, registry=exporter.registry)
    clock = Clock()
    counters = ServedCounters(
        [parse_unit("requests=app_latency_seconds_count by model")],
        [parse_latency("e2e=app_latency_seconds by model")],
        start_ns=clock.start_ns,
        started_server=True,
    )
    for s in FIRST:
        seconds.labels("a").observe(s)
    first = latency(poll(counters, exporter, clock), "e2e", model="a")
    assert first.buckets == ((0.1, 1.0), (0.5, 4.0), (1.0, 5.0), (float("inf"), 6.0))
    assert (first.count, first.sum) == (6.0, pytest.approx(sum(FIRST)))
    for s in THEN:
        seconds.labels("a").observe(s)
    reading = poll(counters, exporter, clock)
    assert units(reading) == {("requests", "a"): (4.0, 10.0)}  # a histogram's _count counts as a unit
    later = latency(reading, "e2e", model="a")
    assert later.buckets == ((0.1, 1.0), (0.5, 6.0), (1.0, 9.0), (float("inf"), 10.0))
    # Since counting began (6 observations): p10, rank 0.6 in (0, 0.1] holding 1: 0.1 * 0.6;
    # p50, rank 3, 2nd of the 3 in (0.1, 0.5]: 0.1 + 0.4 * 2/3; p80, rank 4.8, in (0.5, 1.0]
    # holding 1: 0.5 + 0.5 * 0.8; p99, rank 5.94, in +Inf's: the last finite bound, 1.0.
    assert quantile(0.1, first) == pytest.approx(0.06)
    assert quantile(0.5, first) == pytest.approx(0.1 + 0.4 * 2 / 3)
    assert quantile(0.8, first) == pytest.approx(0.9)
    assert quantile(0.99, first) == 1.0
    # The window's 4: p50, rank 2, the 2nd of 2 in (0.1, 0.5]: 0.5; p75, rank 3, 1st of 2 in (0.5, 1.0]: 0.75.
    assert quantile(0.5, later, first) == pytest.approx(0.5)
    assert quantile(0.75, later, first) == pytest.approx(0.75)
    assert quantile(0.5, later, later) is None  # no observations between


def test_quantile_edges_as_prometheus_has_them() -> None:
    def totals(*buckets: tuple[float, float]) -> LatencyTotals:
        return LatencyTotals("e2e", {}, buckets, 0.0, buckets[-1][1])

    inf = float("inf")
    assert quantile(0.5, totals((inf, 3.0))) is None  # no finite bucket
    assert quantile(0.5, totals((1.0, 0.0), (inf, 0.0))) is None  # no observations
    assert quantile(0.5, totals((1.0, 0.0), (inf, 4.0))) == 1.0  # all above the last bound: that bound
    assert quantile(0.5, totals((-1.0, 2.0), (0.0, 4.0), (inf, 4.0))) == -1.0  # lowest bound <= 0: itself
    # A dented bucket (a torn scrape) is lifted to the one below it, so p80 (rank 3.2) falls in
    # (3, 4] holding 0.5 after 3: 3 + 0.2/0.5, not after the dent's 2.
    dented = totals((1.0, 1.0), (2.0, 3.0), (3.0, 2.0), (4.0, 3.5), (inf, 4.0))
    assert quantile(0.8, dented) == pytest.approx(3.4)
    with pytest.raises(ValueError, match="a quantile is in"):
        quantile(0.0, totals((1.0, 1.0), (inf, 1.0)))
    with pytest.raises(ValueError, match="buckets differ"):
        quantile(0.5, totals((1.0, 1.0), (inf, 1.0)), totals((2.0, 1.0), (inf, 1.0)))


def test_a_bucket_layout_that_changes_is_a_reset_of_that_histogram(exporter: Exporter) -> None:
    old = Histogram("app_latency_seconds", "Latency", buckets=BOUNDS, registry=exporter.registry)
    clock = Clock()
    counters = ServedCounters([], [parse_latency("e2e=app_latency_seconds")], start_ns=clock.start_ns)
    poll(counters, exporter, clock)
    old.observe(0.3)
    poll(counters, exporter, clock)
    new = Histogram("app_latency_seconds", "Latency", buckets=(0.25, 2.5), registry=exporter.restart())
    for s in (0.2, 0.3, 3.0):
        new.observe(s)
    reading = poll(counters, exporter, clock)
    assert "app_latency_seconds: reset (its buckets changed); counted from 0 again" in [
        n.message for n in reading.notes
    ]
    assert [t.buckets for t in reading.latencies] == [
        ((0.1, 0.0), (0.5, 1.0), (1.0, 1.0), (float("inf"), 1.0)),  # the old layout's, kept
        ((0.25, 1.0), (2.5, 2.0), (float("inf"), 3.0)),  # the new one's, from the restart
    ]


def test_a_broken_histogram_is_refused() -> None:
    head = "# TYPE h histogram\n"
    counters = ServedCounters([], [parse_latency("e2e=h by k")], start_ns=START_NS, started_server=True)
    text = (
        head + 'h_bucket{k="a",le="1"} 3\nh_bucket{k="a",le="+Inf"} 2\nh_sum{k="a"} 1\nh_count{k="a"} 2\n'
        'h_bucket{k="b",le="1"} 1\nh_sum{k="b"} 1\nh_count{k="b"} 1\n'
        'h_bucket{k="c",le="1"} 1\nh_bucket{k="c",le="+Inf"} 1\nh_sum{k="c"} NaN\nh_count{k="c"} 1\n'
    )
    (reading,) = feed(counters, [text])
    assert reading.latencies == ()
    assert [n.message for n in reading.notes] == [
        'h{k="a"}: its buckets are not cumulative; not counted',
        'h{k="b"}: incomplete: no +Inf bucket, _sum or _count; not counted',
        'h{k="c"}: its value nan is not a finite count >= 0; not counted',
    ]


def test_openmetrics_is_counted_as_the_text_format_is() -> None:
    registry = CollectorRegistry()
    done = Counter("app_requests", "Requests", ["model"], registry=registry)
    seconds = Histogram("app_latency_seconds", "Latency", buckets=BOUNDS, registry=registry)
    counters = ServedCounters(
        [parse_unit("requests=app_requests_total by model")],
        [parse_latency("e2e=app_latency_seconds")],
        start_ns=START_NS,
        started_server=True,
    )
    done.labels("a").inc(2, exemplar={"trace_id": "4bf92f35"})  # only OpenMetrics carries exemplars
    seconds.observe(0.3)
    text = openmetrics_latest(registry).decode()
    assert text.endswith("# EOF\n") and '# {trace_id="4bf92f35"} 2.0' in text
    (reading,) = feed(counters, [text])
    assert units(reading) == {("requests", "a"): (2.0, 2.0)}
    assert latency(reading, "e2e").buckets == ((0.1, 0.0), (0.5, 1.0), (1.0, 1.0), (float("inf"), 1.0))


# --- the presets on the servers' recorded expositions


def test_vllm_two_models_counted_per_model_through_a_restart_only_created_shows() -> None:
    known = preset("vllm")
    counters = ServedCounters(known.unit_specs(), known.latency_specs(), start_ns=START_NS)
    readings = feed(counters, [fixture(f"vllm_two_models_{i}.txt") for i in (1, 2, 3)])
    llama, qwen = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct"
    assert set(kinds(readings[0])) == {BASELINE}
    assert units(readings[1]) == {
        ("requests", llama): (5.0, 5.0),
        ("requests", qwen): (2.0, 2.0),
        ("input_tokens", llama): (610.0, 610.0),
        ("input_tokens", qwen): (150.0, 150.0),
        ("output_tokens", llama): (2230.0, 2230.0),
        ("output_tokens", qwen): (400.0, 400.0),
    }
    # Qwen's server restarted and counted past its old values: its _created says so.
    assert units(readings[2]) == {
        ("requests", llama): (3.0, 8.0),
        ("requests", qwen): (29.0, 31.0),
        ("input_tokens", llama): (300.0, 910.0),
        ("input_tokens", qwen): (3500.0, 3650.0),
        ("output_tokens", llama): (900.0, 3130.0),
        ("output_tokens", qwen): (9800.0, 10200.0),
    }
    resets = [n.message for n in readings[2].notes if n.kind == RESET]
    assert len(resets) == 6 and all(qwen in m for m in resets)
    assert sum("its _created changed" in m for m in resets) == 5  # its counters; its histogram went down
    # Llama's latencies in scrape 2: 0.7, 1.1, 1.4, 2.4, 6.0 s; p50 is the 3rd, rank 2.5 in (1.0, 1.5]
    # holding 2, after 1 below: 1.0 + 0.5 * 1.5/2.
    window = latency(readings[1], "e2e", model_name=llama)
    assert (window.count, window.sum) == (5.0, pytest.approx(11.6))
    assert quantile(0.5, window) == pytest.approx(1.375)


def test_without_created_a_restart_past_the_old_value_cannot_be_seen() -> None:
    """The limit the gap notes warn of: vLLM's scrapes with their _created lines taken out count
    Qwen's 29 requests since its restart as 29 - 25 = 4."""
    texts = [re.sub(r"^vllm:\S+_created\{.*\n", "", fixture(f"vllm_two_models_{i}.txt"), flags=re.M) for i in (1, 2, 3)]
    readings = feed(ServedCounters(preset("vllm").unit_specs(), start_ns=START_NS), texts)
    assert units(readings[2])[("requests", "Qwen/Qwen2.5-7B-Instruct")] == (4.0, 6.0)


def test_triton_counts_per_model_over_versions_and_through_a_restart() -> None:
    counters = ServedCounters(preset("triton").unit_specs(), start_ns=START_NS)
    readings = feed(counters, [fixture(f"triton_{i}.txt") for i in (1, 2, 3)])
    assert units(readings[1]) == {
        ("requests", "densenet_onnx"): (10.0, 10.0),
        ("requests", "resnet_50"): (8.0, 8.0),  # version 1's 5 and version 2's 3, loaded since
        ("inferences", "densenet_onnx"): (80.0, 80.0),
        ("inferences", "resnet_50"): (8.0, 8.0),
        ("request_duration_us", "densenet_onnx"): (131000.0, 131000.0),
        ("request_duration_us", "resnet_50"): (145000.0, 145000.0),
    }
    assert 'nv_inference_request_success_total{model="resnet_50",version="2"}: appeared since; counted from 0' in [
        n.message for n in readings[1].notes
    ]
    assert units(readings[2])[("requests", "densenet_onnx")] == (4.0, 14.0)
    assert units(readings[2])[("requests", "resnet_50")] == (2.0, 10.0)  # version 2 from 0; version 1 gone


def test_tgi_counts_tokens_from_its_histograms_sums() -> None:
    known = preset("tgi")
    counters = ServedCounters(known.unit_specs(), known.latency_specs(), start_ns=START_NS)
    readings = feed(counters, [fixture(f"tgi_{i}.txt") for i in (1, 2, 3)])
    assert units(readings[1]) == {
        ("requests",): (6.0, 6.0),
        ("input_tokens",): (1350.0, 1350.0),
        ("output_tokens",): (1250.0, 1250.0),
    }
    assert units(readings[2]) == {
        ("requests",): (2.0, 8.0),
        ("input_tokens",): (660.0, 2010.0),
        ("output_tokens",): (120.0, 1370.0),
    }
    # Scrape 2's 6: 0.5, 0.9, 1.2, 2.0, 2.0, 6.0 s; p50, rank 3, is 1.2 s, alone in its bucket
    # (1.5^23, 1.5^24] x 0.0001 s: that bucket's top.
    window = latency(readings[1], "e2e")
    assert window.count == 6.0 and len(window.buckets) == 36
    assert quantile(0.5, window) == pytest.approx(0.0001 * 1.5**24)


def test_torchserve_counts_requests_and_microseconds_per_model() -> None:
    readings = feed(
        ServedCounters(preset("torchserve").unit_specs(), start_ns=START_NS),
        [fixture(f"torchserve_{i}.txt") for i in (1, 2)],
    )
    got = units(readings[1])
    assert got[("requests", "resnet18")] == (2.0, 2.0) and got[("requests", "densenet161")] == (1.0, 1.0)
    assert got[("inference_us", "resnet18")][0] == pytest.approx(190000.0)
    assert got[("inference_us", "densenet161")][0] == pytest.approx(128400.25)
