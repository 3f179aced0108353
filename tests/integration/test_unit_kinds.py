"""Several unit kinds per service, each model's its own series (issue #44): ``wattline run
--metrics URL --preset vllm`` counts the job's requests as before, and every other unit of the
preset (input and output tokens) per model as a series of its own.

The truths are the test's: a vLLM-shaped endpoint whose counters this test advances (two models,
requests by finished reason, prompt and generation tokens) and a powercap zone at a known power.
Through the CLI into SQLite, VictoriaMetrics and InfluxDB 1.x at once (a collector writing all three), each series'
stored units must be what its counters rose by, the job's requests exactly the requests (no
token added into them), and J per output token the job's energy over that model's output tokens,
within what the zone's power over the job's time allows. The holder's side (one event_seq base
per series, ``units_total`` per series) is checked on canned scrapes.
"""

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from exposition_server import ExpositionServer, serving
from procs import CLI, clean_env, start_rapl_agent
from schema_check import schema_errors
from servers import Influxd, VictoriaMetrics, searchable
from test_run_served import bad_run
from test_store_parity import Tee, same
from waits import wait_sampled, wait_until

from wattline import wire
from wattline.collector.server import CollectorServer
from wattline.jobs.events import EventBuilder, JobSpec, UnitAccumulator
from wattline.jobs.jobs_view import JobNotFound, build_view
from wattline.jobs.wrappers.served import ServedHolder, ServedUnits
from wattline.reports.window_view import Window, clip_view, intervals_bound
from wattline.served_specs import parse_unit
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.reader import StoredJobEvent, writer
from wattline.stores.sqlite.store import SqliteStore
from wattline.stores.victoria.store import VictoriaStore

from sysfs_trees import PowerAdvancer, Zone, powercap_tree  # isort: skip

ZONE = "intel-rapl:0"
WATTS = 40.0
START_UJ = 10**11
HOST = "kinds-host"
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct")
#: Per step, per model: requests finished by reason (stop, length), prompt tokens, generation tokens.
STEPS = [
    {MODELS[0]: (3, 1, 480, 1600), MODELS[1]: (2, 0, 150, 700)},
    {MODELS[0]: (5, 2, 910, 3010), MODELS[1]: (0, 0, 0, 0)},
    {MODELS[0]: (1, 0, 77, 333), MODELS[1]: (4, 3, 620, 2890)},
]
REASONS = ("stop", "length")


class Vllm(ExpositionServer):
    """A vLLM-shaped ``/metrics``: two models' counters, at the values the test set."""

    def __init__(self) -> None:
        super().__init__()
        #: (model, reason) -> requests; model -> prompt, generation tokens
        self.requests = {(m, r): 0 for m in MODELS for r in REASONS}
        self.tokens = {m: [0, 0] for m in MODELS}
        self.scrapes = 0
        self.lock = threading.Lock()

    def step(self, counts: dict[str, tuple[int, int, int, int]]) -> None:
        with self.lock:
            for model, (stop, length, prompt, generated) in counts.items():
                self.requests[model, "stop"] += stop
                self.requests[model, "length"] += length
                self.tokens[model][0] += prompt
                self.tokens[model][1] += generated

    def text(self) -> str:
        with self.lock:
            lines = ["# TYPE vllm:request_success_total counter"]
            lines += [
                f'vllm:request_success_total{{engine="0",finished_reason="{r}",model_name="{m}"}} {n}.0'
                for (m, r), n in self.requests.items()
            ]
            for i, family in enumerate(("vllm:prompt_tokens_total", "vllm:generation_tokens_total")):
                lines.append(f"# TYPE {family} counter")
                lines += [f'{family}{{engine="0",model_name="{m}"}} {t[i]}.0' for m, t in self.tokens.items()]
            lines.append('vllm:num_requests_running{engine="0",model_name="x"} 3.0')  # a gauge, not counted
            self.scrapes += 1
            return "\n".join(lines) + "\n"


@pytest.fixture
def vllm() -> Iterator[Vllm]:
    with serving(Vllm()) as server:
        yield server


def truth() -> tuple[int, dict[tuple[str, str], int]]:
    """(the requests, (kind, model) -> units) the steps add up to, from :data:`STEPS` alone."""
    requests = sum(c[0] + c[1] for step in STEPS for c in step.values())
    units = {
        (kind, m): sum(step[m][i] for step in STEPS)
        for i, kind in ((2, "input_tokens"), (3, "output_tokens"))
        for m in MODELS
    }
    return requests, units


def report(store: str, *args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [*CLI, "report", "kinds", "--store", store, "--share-rule", "exclusive", "--model-split", "none", *args],
        capture_output=True, text=True, timeout=60, env={**clean_env(), "COLUMNS": "200"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out


def closed(store: SqliteStore) -> bool:
    try:
        return build_view("kinds", store.job_events("kinds")).closed
    except JobNotFound:
        return False


@pytest.mark.servers
def test_each_model_s_tokens_are_a_series_of_their_own_and_the_job_s_requests_stay_the_requests(
    tmp_path: Path, vllm: Vllm, victoria_metrics: VictoriaMetrics, influxd: Influxd
) -> None:
    tree = powercap_tree(tmp_path / "host", [Zone(ZONE, "package-0", START_UJ)])
    powered = PowerAdvancer(tree, {ZONE: WATTS}, START_UJ)
    sqlite = SqliteStore(tmp_path / "w.db")
    victoria = VictoriaStore(victoria_metrics.url)
    database = influxd.new_database()
    server = CollectorServer(Tee(sqlite, victoria, InfluxV1Store(influxd.url, database)), "127.0.0.1:0")
    server.start()
    env = {**clean_env(), "XDG_STATE_HOME": str(tmp_path / "state"), "WATTLINE_AGENT_EDGE_SOCKET": "off"}
    outbox = ["--outbox-dir", str(tmp_path / "state" / "outbox"), "--edge-socket", "off"]
    started = time.time_ns()
    agent = start_rapl_agent(HOST, tree, server.port, 0.5, tmp_path / "agent.log", *outbox)
    done = tmp_path / "done"
    try:
        wait_sampled(sqlite, HOST, started)
        began = time.monotonic()
        run = subprocess.Popen(
            [*CLI, "run", "--job-id", "kinds", "--host-id", HOST, "--collector", f"127.0.0.1:{server.port}",
             "--metrics", vllm.url, "--preset", "vllm", "--scrape-every", "0.2s", "--no-report",
             "--", "sh", "-c", f"while [ ! -e {done} ]; do sleep 0.05; done"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_until(lambda: vllm.scrapes > 0, "the first scrape")
        serving = time.monotonic()  # the job is open from before this ...
        for counts in STEPS:
            vllm.step(counts)
            time.sleep(0.4)
        touched = time.monotonic()  # ... to after this
        done.touch()
        _, err = run.communicate(timeout=60)
        ended = time.monotonic()
        assert run.returncode == 0, err
        wait_until(lambda: closed(sqlite), "the job closed")
        last = max(e.time_ns for e in sqlite.job_events("kinds"))
        wait_sampled(sqlite, HOST, last)
    finally:
        agent.terminate()
        server.stop()
        powered.close()

    def shown() -> bool:
        searchable(victoria_metrics.url)
        return len(victoria.job_events("kinds")) == len(sqlite.job_events("kinds"))

    wait_until(shown, "VictoriaMetrics shows the job's events")
    requests, units = truth()
    assert (
        f"wattline: {requests} requests, {sum(u for (k, _), u in units.items() if k == 'input_tokens')} input_tokens"
        in err
    )
    reports = {}
    stores = {
        "sqlite": [f"sqlite:///{tmp_path / 'w.db'}"],
        "victoriametrics": [victoria_metrics.url],
        "influxdb": [influxd.url, "--influx-database", database],
    }
    for name, (url, *more) in stores.items():
        data = reports[name] = json.loads(report(url, *more, "--json").stdout)
        assert schema_errors("report", data) == []
        assert data["job"]["unit"] == "requests" and data["units"]["total"] == requests, name
        kinds = {(k["name"], k["labels"]["model_name"]): k for k in data["unit_kinds"]}
        assert {key: k["units"] for key, k in kinds.items()} == units, name
        whole = data["whole_run"]
        assert WATTS * (touched - serving) < whole["energy_j"] < WATTS * (ended - began), name
        for (kind, model), k in kinds.items():
            assert k["energy_of"] == "job" and k["units_bound"] == 0
            # the job's energy over this model's units, within what the zone's power allows
            assert (
                WATTS * (touched - serving) / units[kind, model]
                < k["j_per_unit"]
                < WATTS * (ended - began) / units[kind, model]
            )
            assert k["j_per_unit"] == pytest.approx(whole["energy_j"] / units[kind, model], rel=1e-9)
            assert k["j_per_unit_bound"] == pytest.approx(k["j_per_unit"] * whole["energy_bound_rel"], rel=1e-9)
        assert any("not split between them" in note for note in data["notes"]), data["notes"]
    for other in ("victoriametrics", "influxdb"):
        assert same(reports["sqlite"]["unit_kinds"], reports[other]["unit_kinds"]) == [], other
    text = report(f"sqlite:///{tmp_path / 'w.db'}").stdout
    assert "Unit kinds" in text and "output_tokens" in text and f"model_name={MODELS[1]}" in text, text


def test_each_extra_series_is_numbered_apart_with_its_own_running_total() -> None:
    """Two --count specs, the second by model: the job's units go as before (no unit); each
    model's tokens under an event_seq base of its own, ``units_total`` that series' alone; an idle
    series sends nothing until it counts again."""
    events: list[wire.pb.JobEvent] = []
    units = UnitAccumulator(EventBuilder(JobSpec("c", "c")), events.extend)
    specs = [parse_unit("requests=req_total"), parse_unit("tokens=tok_total by model")]
    served = ServedUnits("http://127.0.0.1:9/metrics", specs[0], extra=(specs[1],))
    scrapes = [(1, 10, 20), (3, 10, 25), (6, 14, 25)]  # requests, tokens of model a, of model b
    texts = [
        f'# TYPE req counter\nreq_total {r}\n# TYPE tok counter\ntok_total{{model="a"}} {a}\ntok_total{{model="b"}} {b}\n'
        for r, a, b in scrapes
    ]
    holder = ServedHolder(served, units, time.time_ns(), lambda line: None, lambda url, timeout_s: texts.pop(0))
    for _ in scrapes:
        assert holder.scrape(1.0) is not None
    own = [e for e in events if not e.unit]
    assert [e.units for e in own] == [1, 2, 3] and all(not e.unit_labels for e in own)
    series: dict[str, list[wire.pb.JobEvent]] = {}
    for e in events:
        if e.unit:
            assert e.unit == "tokens" and e.kind == wire.pb.JobEvent.KIND_UNITS
            series.setdefault(e.unit_labels["model"], []).append(e)
    assert [(e.units, e.units_total) for e in series["a"]] == [(10, 10), (0, 10), (4, 14)]  # idle 0 sent before 4
    assert [(e.units, e.units_total) for e in series["b"]] == [(20, 20), (5, 25)]
    writers = (
        {writer(e.event_seq) for e in own},
        {writer(e.event_seq) for e in series["a"]},
        {writer(e.event_seq) for e in series["b"]},
    )
    assert all(len(w) == 1 for w in writers) and len(set.union(*writers)) == 3
    assert not math.isnan(holder.total) and holder.total == 6


def test_a_unit_kind_counted_twice_is_one_line_and_exit_2(tmp_path: Path) -> None:
    counts = ["--count", "requests=a_total", "--count", "requests=b_total"]
    bad_run(
        tmp_path, ["--metrics", "http://127.0.0.1:9/metrics", *counts], "option --count: a unit kind is named twice"
    )


def test_stores_refuse_a_unit_that_is_no_short_name(tmp_path: Path) -> None:
    """A writer's ``unit`` becomes a tag: one no served spec could name is refused, with why."""
    batch = wire.Batch()
    batch.host.host_id = HOST
    builder = EventBuilder(JobSpec("j", "j"))
    batch.job_events.append(builder.make(wire.pb.JobEvent.KIND_UNITS, units=1.0, unit="Output Tokens"))
    batch.job_events.append(builder.make(wire.pb.JobEvent.KIND_UNITS, units=1.0, unit_labels={"model": "a"}))
    with SqliteStore(tmp_path / "w.db") as store:
        result = store.write(batch)
    assert result.rejected == 2
    assert "unit 'Output Tokens' is not a short name" in result.reasons[0]
    assert "unit_labels without a unit" in result.reasons[1]


def test_reports_read_no_extra_kind_into_the_job_s_units(tmp_path: Path) -> None:
    """Without the wrapper: a job's own UNITS events and another kind's, stored in SQLite; the view
    counts the own ones only, the other kind as its series."""
    batch = wire.Batch()
    batch.host.host_id = HOST
    own, other = EventBuilder(JobSpec("j", "j")), EventBuilder(JobSpec("j", "j"))
    t = time.time_ns()
    batch.job_events.extend([
        own.open(t),
        own.units(2.0, t + 10**9),
        other.make(wire.pb.JobEvent.KIND_UNITS, t + 10**9, units=70.0, unit="output_tokens", unit_labels={"model": "m"}),
        own.units(3.0, t + 2 * 10**9),
        other.make(wire.pb.JobEvent.KIND_UNITS, t + 2 * 10**9, units=30.0, unit="output_tokens", unit_labels={"model": "m"}),
        own.close(0, t + 3 * 10**9),
    ])  # fmt: skip
    with SqliteStore(tmp_path / "w.db") as store:
        assert store.write(batch).rejected == 0
        for events in (store.job_events("j"), store.job_events("j", every=False)):
            view = build_view("j", events)
            assert view.kind_intervals == {
                ("output_tokens", (("model", "m"),)): [(t, t + 10**9, 70.0), (t + 10**9, t + 2 * 10**9, 30.0)]
            }
        assert build_view("j", store.job_events("j")).units_total == 5


def test_a_window_takes_each_series_units_by_overlap_with_their_bound() -> None:
    """Another kind's events cover the time since the series' previous one (or the open), as the
    job's own do: a window that cuts one takes its share by overlap, and the whole of the cut
    event's units that may lie on either side at worst is the series' bound."""
    s = 10**9
    t = 1_700_000_000 * s
    fields = {"unit": "output_tokens", "unit_label_model": "m"}
    events = [
        StoredJobEvent(HOST, "j", "open", t, 1, {"unit_name": "requests"}),
        StoredJobEvent(HOST, "j", "kind_units", t + s, 2 << 32 | 1, {**fields, "units": 10.0}),
        StoredJobEvent(HOST, "j", "kind_units", t + 3 * s, 2 << 32 | 2, {**fields, "units": 40.0}),
        StoredJobEvent(HOST, "j", "close", t + 4 * s, 3, {"exit_code": 0}),
    ]
    view = build_view("j", events)
    window = Window(t + 5 * s // 2, t + 10 * s)
    clipped = clip_view(view, window, t + 10 * s)
    series = ("output_tokens", (("model", "m"),))
    assert clipped.kind_intervals == {series: [(t + 5 * s // 2, t + 3 * s, 10.0)]}  # a quarter of 40
    assert intervals_bound(view.kind_intervals[series], window) == 30.0  # 3/4 of 40 may lie before it
