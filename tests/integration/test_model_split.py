"""The energy of one server split between its models by a named rule (issue #44, ``wattline report
--model-split``): recorded-shape vLLM scrapes of two models (fixtures/served_metrics/
vllm_two_models_{1,2,3}.txt, Qwen's server restarting in the third) served in turn while a
powercap zone runs at a known power, through ``wattline run --metrics URL --preset vllm`` into
SQLite (test_unit_kinds.py covers the other stores).

The truths are the test's: each model's tokens from SOURCES.md's stated increments over the first
scrape's values (the command started the server: those count too), the split by the rule from
those, and the job's energy from the zone's power over the time the job surely spanned. Each
model's energy and J per token must be the rule's share of that, named as a model, the models'
energies adding up to the job's.
"""

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from exposition_server import ExpositionServer
from procs import CLI, clean_env, start_rapl_agent
from prometheus_client.parser import text_string_to_metric_families
from schema_check import schema_errors
from waits import wait_sampled, wait_until

from wattline.collector.server import CollectorServer
from wattline.jobs.jobs_view import JobNotFound, build_view
from wattline.reports.model_split import resolve
from wattline.reports.unit_kinds import UnitKind
from wattline.stores.sqlite.store import SqliteStore

from sysfs_trees import PowerAdvancer, Zone, powercap_tree  # isort: skip

FIXTURES = Path(__file__).parents[1] / "fixtures" / "served_metrics"
ZONE = "intel-rapl:0"
WATTS = 40.0
START_UJ = 10**11
HOST = "split-host"
SAMPLE_S = 0.25  #: start_rapl_agent's sampling interval
JOB = "split"
LLAMA, QWEN = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct"
#: SOURCES.md: what scrapes 2 and 3 add per model, (prompt, generation) tokens; in scrape 3 Qwen's
#: server restarted and counted its tokens since (the whole new value counts).
GROWTH = {LLAMA: [(610, 2230), (300, 900)], QWEN: [(150, 400), (3500, 9800)]}
SAMPLES = {"input_tokens": "vllm:prompt_tokens_total", "output_tokens": "vllm:generation_tokens_total"}


def tokens() -> dict[tuple[str, str], float]:
    """(kind, model) -> its tokens over the job: the first scrape's value, then SOURCES.md's growth."""
    first = {
        (kind, s.labels["model_name"]): s.value
        for family in text_string_to_metric_families((FIXTURES / "vllm_two_models_1.txt").read_text())
        for s in family.samples
        for kind, name in SAMPLES.items()
        if s.name == name
    }
    return {
        (kind, m): first[kind, m] + sum(step[i] for step in GROWTH[m])
        for i, kind in enumerate(SAMPLES)
        for m in (LLAMA, QWEN)
    }


class Recorded(ExpositionServer):
    """The recorded scrapes, served one after another as the test moves on."""

    def __init__(self) -> None:
        super().__init__()
        self.texts = [(FIXTURES / f"vllm_two_models_{i}.txt").read_text().encode() for i in (1, 2, 3)]
        self.at = 0
        self.served = [0, 0, 0]  #: scrapes answered with each text
        self.first_ns = [0, 0, 0]  #: when each text was first served
        self.lock = threading.Lock()

    def text(self) -> bytes:
        with self.lock:
            self.served[self.at] += 1
            self.first_ns[self.at] = self.first_ns[self.at] or time.time_ns()
            return self.texts[self.at]


@dataclass(frozen=True)
class Served:
    """The job as run: its store, and the energy its time surely spans (known power x time)."""

    store: str
    low_j: float  #: the zone's power over the time the job surely ran (a lower bound of its energy)
    high_j: float  #: ... over the time from before it opened to after it closed (an upper bound)
    opened_ns: int  #: before the job opened
    cut_ns: int  #: when the second text was first served: after the last reading of the first


def _closed(store: SqliteStore) -> bool:
    try:
        return build_view(JOB, store.job_events(JOB)).closed
    except JobNotFound:
        return False


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("split")
    tree = powercap_tree(tmp / "host", [Zone(ZONE, "package-0", START_UJ)])
    powered = PowerAdvancer(tree, {ZONE: WATTS}, START_UJ)
    sqlite = SqliteStore(tmp / "w.db")
    server = CollectorServer(sqlite, "127.0.0.1:0")
    server.start()
    vllm = Recorded()
    threading.Thread(target=vllm.serve_forever, daemon=True).start()
    env = {**clean_env(), "XDG_STATE_HOME": str(tmp / "state"), "WATTLINE_AGENT_EDGE_SOCKET": "off"}
    outbox = ["--outbox-dir", str(tmp / "state" / "outbox"), "--edge-socket", "off"]
    started = time.time_ns()
    agent = start_rapl_agent(HOST, tree, server.port, 0.5, tmp / "agent.log", *outbox)
    done = tmp / "done"
    try:
        wait_sampled(sqlite, HOST, started)
        began, opened = time.monotonic(), time.time_ns()
        run = subprocess.Popen(
            [*CLI, "run", "--job-id", JOB, "--host-id", HOST, "--collector", f"127.0.0.1:{server.port}",
             "--metrics", vllm.url, "--preset", "vllm", "--scrape-every", "0.1s", "--no-report",
             "--", "sh", "-c", f"while [ ! -e {done} ]; do sleep 0.05; done"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_until(lambda: vllm.served[0] > 0, "the first scrape")
        serving = time.monotonic()  # the job is open from before this ...
        time.sleep(0.2)
        for at in (1, 2):  # every scrape seen: a missed one would hide Qwen's tokens before its restart
            with vllm.lock:
                vllm.at = at
            wait_until(lambda at=at: vllm.served[at] > 0, f"scrape {at + 1}")
        time.sleep(0.3)
        touched = time.monotonic()  # ... to after this
        done.touch()
        _, err = run.communicate(timeout=60)
        ended = time.monotonic()
        assert run.returncode == 0, err
        wait_until(lambda: _closed(sqlite), "the job closed")
        wait_sampled(sqlite, HOST, max(e.time_ns for e in sqlite.job_events(JOB)))
    finally:
        agent.terminate()
        server.stop()
        powered.close()
        vllm.shutdown()
        vllm.server_close()
    yield Served(
        f"sqlite:///{tmp / 'w.db'}", WATTS * (touched - serving), WATTS * (ended - began), opened, vllm.first_ns[1]
    )


def report(s: Served, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [*CLI, "report", JOB, "--store", s.store, "--share-rule", "exclusive", *args],
        capture_output=True, text=True, timeout=60, env={**clean_env(), "COLUMNS": "250"},
    )  # fmt: skip
    assert out.returncode == code, out.stderr
    return out


def split_report(s: Served, *args: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The report JSON (schema-checked) and its models by name."""
    data = json.loads(report(s, *args, "--json").stdout)
    assert schema_errors("report", data) == []
    return data, {m["labels"]["model_name"]: m for m in data["model_split"]["models"]}


@pytest.mark.parametrize(
    ("asked", "kind"),
    [(None, "output_tokens"), ("units:output_tokens", "output_tokens"), ("units:input_tokens", "input_tokens")],
)
def test_each_model_gets_the_rule_s_share_of_the_job_s_energy(served: Served, asked: str | None, kind: str) -> None:
    """By default (auto: output tokens, as vLLM's preset counts them) and by each rule named: each
    model's energy is its share of the rule's tokens times the job's, the parts adding up to the
    job's energy; its J per token of each kind is that over its tokens, within what the zone's
    power over the job's time allows, labelled a model and named by its rule."""
    data, models = split_report(served, *(["--model-split", asked] if asked else []))
    truth = tokens()
    split = data["model_split"]
    assert (split["asked"], split["rule"], split["method"], split["by"]) == (
        asked or "auto",
        f"units:{kind}",
        "model",
        ["model_name"],
    )
    energy = data["whole_run"]["energy_j"]
    assert served.low_j < energy < served.high_j
    assert split["energy_j"] == energy and split["energy_estimate_fraction"] == 0  # a counter: measured
    assert split["energy_estimate_share"] == 0  # its deprecated name
    parts = [models[m]["energy_j"] for m in (LLAMA, QWEN)]
    assert math.fsum(parts) == pytest.approx(energy, rel=1e-15, abs=0)
    total = truth[kind, LLAMA] + truth[kind, QWEN]
    rel = data["whole_run"]["energy_bound_rel"]
    for m in (LLAMA, QWEN):
        share = truth[kind, m] / total
        model = models[m]
        assert model["rule_units"] == truth[kind, m] and model["fraction"] == pytest.approx(share, rel=1e-12)
        assert (model["share"], model["share_bound"]) == (model["fraction"], model["fraction_bound"])  # deprecated
        assert model["energy_j"] == pytest.approx(energy * share, rel=1e-12)
        assert served.low_j * share < model["energy_j"] < served.high_j * share
        # over the whole run the units are exact: the bound is the job's energy bound, carried
        assert model["fraction_bound"] == 0 and model["energy_bound_j"] == pytest.approx(
            model["energy_j"] * rel, rel=1e-9
        )
        for per in model["per_unit"]:
            units = truth[per["name"], m]
            assert per["units"] == units and per["units_bound"] == 0
            assert served.low_j * share / units < per["j_per_unit"] < served.high_j * share / units
            assert per["j_per_unit_bound"] == pytest.approx(per["j_per_unit"] * rel, rel=1e-9)
        # the rule's own kind: every model's J per unit of it is the job's energy over all of it
        own = next(p for p in model["per_unit"] if p["name"] == kind)
        assert own["j_per_unit"] == pytest.approx(energy / total, rel=1e-12)
    # the bound: a counter at a known power, sampled every SAMPLE_S: neither nothing nor wider
    # than the zone's power over a sample interval at each end
    assert 0 < rel * energy < 2 * WATTS * SAMPLE_S
    for entry in data["unit_kinds"]:
        model = models[entry["labels"]["model_name"]]
        per = next(p for p in model["per_unit"] if p["name"] == entry["name"])
        assert entry["split_rule"] == f"units:{kind}" and entry["split_j_per_unit"] == per["j_per_unit"]
        assert entry["energy_of"] == "job" and entry["j_per_unit"] == pytest.approx(energy / entry["units"], rel=1e-12)
    assert any(f"by units:{kind}" in n and "not the rule's assumption" in n for n in data["notes"]), data["notes"]


def test_output_tokens_split_differs_from_input_tokens_split_as_the_truth_says(served: Served) -> None:
    """The rules disagree exactly as the tokens do: Llama's J per output token by input tokens is
    its share of input tokens over its output tokens, not the server's J per output token."""
    truth = tokens()
    _, by_out = split_report(served)
    data, by_in = split_report(served, "--model-split", "units:input_tokens")
    energy = data["whole_run"]["energy_j"]
    inputs = truth["input_tokens", LLAMA] + truth["input_tokens", QWEN]
    outputs = truth["output_tokens", LLAMA] + truth["output_tokens", QWEN]
    for m in (LLAMA, QWEN):
        out_by_out = next(p for p in by_out[m]["per_unit"] if p["name"] == "output_tokens")["j_per_unit"]
        out_by_in = next(p for p in by_in[m]["per_unit"] if p["name"] == "output_tokens")["j_per_unit"]
        assert out_by_out == pytest.approx(energy / outputs, rel=1e-12)
        assert out_by_in == pytest.approx(
            energy * truth["input_tokens", m] / inputs / truth["output_tokens", m], rel=1e-12
        )
    assert by_out[QWEN]["fraction"] != pytest.approx(by_in[QWEN]["fraction"], rel=0.01)


def test_the_text_report_names_the_rule_and_labels_the_split_a_model(served: Served) -> None:
    text = report(served).stdout
    assert "Energy by model" in text and "MODEL: split by units:output_tokens, not measured" in text, text
    assert f"model_name={LLAMA}" in text and "J per output_tokens (model)" in text, text
    truth = tokens()
    share = truth["output_tokens", QWEN] / (truth["output_tokens", LLAMA] + truth["output_tokens", QWEN])
    assert f"{share * 100:.0f} %" in text, text


def test_none_keeps_the_server_s_energy_per_model_unsplit(served: Served) -> None:
    data, models = split_report(served, "--model-split", "none")
    assert data["model_split"]["rule"] == "none" and models == {}
    assert all(k["split_rule"] == "none" and k["split_j_per_unit"] is None for k in data["unit_kinds"])
    assert any("not split between them (--model-split none)" in n for n in data["notes"]), data["notes"]
    assert "Energy by model" not in report(served, "--model-split", "none").stdout


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("tokens", "option --model-split: 'tokens' is not auto, none or units:KIND"),
        ("units:", "option --model-split: 'units:' is not auto, none or units:KIND"),
        ("units:requests", f"option --model-split: job '{JOB}' has no units:requests by labels (its unit kinds by labels are input_tokens, output_tokens)"),
    ],
)  # fmt: skip
def test_a_bad_rule_is_one_line_and_exit_2(served: Served, value: str, says: str) -> None:
    out = report(served, "--model-split", value, code=2)
    assert out.stderr.splitlines() == [f"wattline: error: {says}"], out.stderr
    assert out.stdout == ""


def test_in_a_window_the_shares_carry_the_units_edge_bound(served: Served) -> None:
    """A window cut between the last reading of the first text and the first of the second
    (scrapes are one at a time, so the server's first serving of the second text lies strictly
    between the two readings' times): the second scrape's tokens were done somewhere across the cut, so each model's tokens in the window lie between the first
    scrape's and those plus the second's. The share's bound must hold the shares of both ends
    (for Llama: none of its second-scrape tokens in and all of Qwen's, and the reverse), and be
    no wider than those ends moved by the second scrape's tokens again; the energies still add up."""
    first = {m: tokens()["output_tokens", m] - sum(g for _, g in GROWTH[m]) for m in (LLAMA, QWEN)}
    moved = {m: GROWTH[m][0][1] for m in (LLAMA, QWEN)}
    window = ["--from", str(served.opened_ns / 1e9), "--to", str(served.cut_ns / 1e9)]
    data, models = split_report(served, *window)
    parts = [models[m]["energy_j"] for m in (LLAMA, QWEN)]
    assert math.fsum(parts) == pytest.approx(data["whole_run"]["energy_j"], rel=1e-15, abs=0)
    llama = models[LLAMA]
    share, bound = llama["fraction"], llama["fraction_bound"]

    def llama_share(llama_tokens: float, qwen_tokens: float) -> float:
        return llama_tokens / (llama_tokens + qwen_tokens)

    least = llama_share(first[LLAMA], first[QWEN] + moved[QWEN])
    most = llama_share(first[LLAMA] + moved[LLAMA], first[QWEN])
    assert share - bound <= least < most <= share + bound
    assert share - bound >= llama_share(first[LLAMA] - moved[LLAMA], first[QWEN] + 2 * moved[QWEN])
    assert share + bound <= llama_share(first[LLAMA] + 2 * moved[LLAMA], first[QWEN] - moved[QWEN])
    assert models[QWEN]["fraction_bound"] == pytest.approx(bound, rel=1e-9)
    # the model's energy bound: the job's carried by the share, and the share's own
    job_bound = data["model_split"]["energy_bound_j"]
    energy = data["model_split"]["energy_j"]
    assert llama["energy_bound_j"] == pytest.approx(energy * bound + job_bound * share + job_bound * bound, rel=1e-9)
    assert any("not the rule's assumption" in n for n in data["notes"]), data["notes"]


def test_auto_splits_by_output_tokens_only_where_they_are_counted_by_labels() -> None:
    """auto: by output tokens where a series of them has labels (vLLM's preset); none for a
    server with one model (TGI's tokens have no label) or without output tokens (Triton)."""

    def kind(name: str, **labels: str) -> UnitKind:
        return UnitKind(name, labels, 10.0, 0.0, 1.0, 0.1)

    assert resolve("auto", [kind("input_tokens", model_name="a"), kind("output_tokens", model_name="a")]) == (
        "units:output_tokens"
    )
    assert resolve("auto", [kind("output_tokens")]) == "none"
    assert resolve("auto", [kind("inferences", model="densenet_onnx")]) == "none"
    assert resolve("units:inferences", [kind("inferences", model="densenet_onnx")]) == "units:inferences"
