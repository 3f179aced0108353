"""Reference workloads: the load generator's step logic, synthetic data, devices, and the
``tiny`` sizes end to end under ``wattline workload`` with the embedded store.

The end-to-end runs need the ``workloads`` extra (torch, transformers); without it
they fail with the install hint, they are never skipped. Each runs in well under a
minute on two CPU cores, with one torch thread so that a busy machine disturbs it less.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from wattline.cli.main import app
from wattline.reference.common import (
    CLS_BOX,
    CLS_ID,
    DEMO_ONLY,
    EXTRA_HINT,
    FIRST_WORD_ID,
    MASK_ID,
    PAGE,
    RANDOM_WEIGHTS,
    SEP_BOX,
    SEP_ID,
    Availability,
    MissingExtra,
    document_batch,
    env_int,
    import_torch,
    is_steady,
    latency_summary,
    layout_boxes,
    missing_extra,
    mlm_batch,
    percentile,
    resolve_device,
)
from wattline.reference.loadgen import Config, Ramp, doubling, knee

E2E_TIMEOUT_S = 150


# --- the load generator's step logic ---------------------------------------------------


@pytest.mark.parametrize(
    ("throughputs", "expected"),
    [
        ([100.0], (0, False)),
        ([100.0, 200.0, 380.0], (2, False)),  # still rising
        ([100.0, 200.0, 204.0], (1, True)),  # +2 %: stop, keep the smaller batch
        ([100.0, 200.0, 150.0], (1, True)),  # a drop: stop
        ([100.0, 105.0], (1, False)),  # exactly +5 % counts as a gain
        ([100.0, 104.9], (0, True)),
    ],
)
def test_knee_stops_raising_below_the_minimum_gain(throughputs: list[float], expected: tuple[int, bool]) -> None:
    assert knee(throughputs, min_gain=0.05) == expected


def test_knee_patience_tolerates_a_noisy_step() -> None:
    t = [100.0, 200.0, 190.0, 300.0, 301.0, 302.0]
    assert knee(t[:3], patience=2) == (1, False)
    assert knee(t[:4], patience=2) == (3, False)
    assert knee(t, patience=2) == (3, True)
    with pytest.raises(ValueError):
        knee(t, patience=0)


def test_doubling_ladder() -> None:
    assert doubling(1) == [1]
    assert doubling(16) == [1, 2, 4, 8, 16]
    assert doubling(48) == [1, 2, 4, 8, 16, 32, 48]


def drive(ramp: Ramp, throughput: dict[Config, float]) -> list[Config]:
    visited = []
    while (config := ramp.next()) is not None:
        visited.append(config)
        ramp.record(throughput[config])
    return visited


def test_ramp_raises_batch_then_concurrency_and_holds_the_knee() -> None:
    rates = {1: 100.0, 2: 190.0, 4: 350.0, 8: 500.0, 16: 510.0, 32: 480.0}
    table = {Config(1, b): r for b, r in rates.items()}
    table |= {Config(2, 8): 700.0, Config(3, 8): 720.0, Config(4, 8): 800.0}
    ramp = Ramp(max_batch=64, max_concurrency=4)
    visited = drive(ramp, table)
    # batch stops at 16 (+2 % over 8); concurrency 1 at batch 8 is not measured twice
    assert visited == [Config(1, b) for b in (1, 2, 4, 8, 16)] + [Config(2, 8), Config(3, 8)]
    assert ramp.plateau == Config(2, 8)
    assert [c for c, _ in ramp.history] == visited
    with pytest.raises(RuntimeError):
        ramp.record(1.0)


def test_ramp_ends_at_the_ladder_top_when_throughput_keeps_rising() -> None:
    ramp = Ramp(max_batch=8, max_concurrency=1)
    visited = drive(ramp, {Config(1, b): 100.0 * b for b in (1, 2, 4, 8)})
    assert visited == [Config(1, b) for b in (1, 2, 4, 8)]
    assert ramp.plateau == Config(1, 8)


def test_ramp_keeps_concurrency_one_when_more_clients_do_not_help() -> None:
    table = {Config(1, 1): 100.0, Config(1, 2): 101.0, Config(2, 1): 99.0}
    ramp = Ramp(max_batch=4, max_concurrency=2)
    assert drive(ramp, table) == [Config(1, 1), Config(1, 2), Config(2, 1)]
    assert ramp.plateau == Config(1, 1)


def test_a_fixed_batch_size_is_one_warm_up_step_then_held() -> None:
    ramp = Ramp(max_batch=8, max_concurrency=2, fixed=8)
    assert drive(ramp, {Config(1, 8): 100.0}) == [Config(1, 8)]
    assert ramp.plateau == Config(1, 8)


# --- timing, devices, environment --------------------------------------------------------


def test_percentiles_interpolate_like_numpy() -> None:
    values = [float(v) for v in range(1, 101)]
    random.Random(3).shuffle(values)
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 90) == pytest.approx(90.1)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0
    summary = latency_summary([0.010, 0.020, 0.030])
    assert summary["p50"] == pytest.approx(20.0) and summary["max"] == pytest.approx(30.0)
    assert summary["count"] == 3
    assert latency_summary([]) == {"count": 0}
    with pytest.raises(ValueError):
        percentile([], 50)


def test_step_time_steadiness() -> None:
    compile_then_steady = [30.0, 2.0, 1.2, 1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0, 1.0, 1.03]
    assert not is_steady(compile_then_steady[:9])
    assert is_steady(compile_then_steady)
    assert not is_steady([1.0] * 9)  # fewer than two windows
    assert not is_steady([1.0] * 5 + [1.5] * 5)


def test_device_resolution() -> None:
    cpu_only = Availability(torch_build="2.13.0+cpu")
    assert resolve_device("auto", cpu_only) == "cpu"
    assert resolve_device("auto", Availability(cuda=True)) == "cuda"
    assert resolve_device("auto", Availability(cuda=True, neuron=True)) == "neuron"
    assert resolve_device("cpu", Availability(cuda=True)) == "cpu"
    with pytest.raises(ValueError, match=r"cuda.*2\.13\.0\+cpu"):
        resolve_device("cuda", cpu_only)
    with pytest.raises(ValueError, match="torch-neuronx"):
        resolve_device("neuron", cpu_only)
    with pytest.raises(ValueError, match="tpu"):
        resolve_device("tpu", cpu_only)


def test_launcher_variables() -> None:
    assert env_int({}, "RANK", 0) == 0
    assert env_int({"WORLD_SIZE": " 4 "}, "WORLD_SIZE", 1) == 4
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        env_int({"LOCAL_RANK": "x"}, "LOCAL_RANK", 0)


def test_layout_boxes_lie_on_the_page_in_reading_order() -> None:
    rng = random.Random(5)
    for seq_len in (2, 64, 512):
        boxes = layout_boxes(rng, seq_len)
        assert len(boxes) == seq_len and boxes[0] == CLS_BOX and boxes[-1] == SEP_BOX
        for x0, y0, x1, y1 in boxes:
            assert 0 <= x0 <= x1 <= PAGE and 0 <= y0 <= y1 <= PAGE
        tops = [b[1] for b in boxes[1:-1]]
        assert tops == sorted(tops)  # lines top to bottom


# --- the extra --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_mod() -> Any:
    """torch, or a failure (not a skip) carrying the install hint."""
    try:
        return import_torch()
    except MissingExtra:
        pytest.fail(EXTRA_HINT, pytrace=False)


def test_missing_extra_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails
    assert missing_extra() == "torch"
    for command in (["layoutlm-inference", "--size", "tiny"], ["bert-pretrain", "--size", "tiny"]):
        result = CliRunner().invoke(app, ["workload", *command])
        assert result.exit_code == 2
        lines = result.output.strip().splitlines()
        assert lines == [f"wattline: error: {EXTRA_HINT}"], result.output


def test_missing_extra_in_the_workload_module_is_one_line() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; "
        "from wattline.reference.bert_pretrain import main; raise SystemExit(main(['--size', 'tiny']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == EXTRA_HINT and "Traceback" not in proc.stderr


# --- synthetic data -----------------------------------------------------------------------


def test_document_batch_shapes_and_ranges(torch_mod: Any) -> None:
    torch = torch_mod
    docs = document_batch(torch, 3, 64, 4096, seed=1)
    assert docs["input_ids"].shape == (3, 64) and docs["input_ids"].dtype == torch.long
    assert docs["bbox"].shape == (3, 64, 4)
    assert docs["attention_mask"].shape == (3, 64) and bool((docs["attention_mask"] == 1).all())
    assert docs["token_type_ids"].shape == (3, 64) and bool((docs["token_type_ids"] == 0).all())
    ids, bbox = docs["input_ids"], docs["bbox"]
    assert bool((ids[:, 0] == CLS_ID).all()) and bool((ids[:, -1] == SEP_ID).all())
    words = ids[:, 1:-1]
    assert bool(((words >= FIRST_WORD_ID) & (words < 4096)).all())
    assert int(bbox.min()) >= 0 and int(bbox.max()) <= PAGE
    assert bool((bbox[..., 0] <= bbox[..., 2]).all()) and bool((bbox[..., 1] <= bbox[..., 3]).all())
    again = document_batch(torch, 3, 64, 4096, seed=1)
    assert bool((again["input_ids"] == ids).all()) and bool((again["bbox"] == bbox).all())
    base = document_batch(torch, 1, 512, 30522)
    assert base["input_ids"].shape == (1, 512) and base["bbox"].shape == (1, 512, 4)


def test_mlm_batch_masks_fifteen_percent_like_bert(torch_mod: Any) -> None:
    torch = torch_mod
    batch = mlm_batch(torch, 64, 128, 4096, seed=2)
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids.shape == labels.shape == batch["attention_mask"].shape == (64, 128)
    chosen = labels != -100
    share = float(chosen[:, 1:-1].float().mean())
    assert 0.13 < share < 0.17
    assert not bool(chosen[:, 0].any()) and not bool(chosen[:, -1].any())
    assert bool((ids[:, 0] == CLS_ID).all()) and bool((ids[:, -1] == SEP_ID).all())
    as_mask = float((ids[chosen] == MASK_ID).float().mean())
    assert 0.74 < as_mask < 0.86  # 80 % [MASK]
    unchanged = ids[~chosen]
    assert not bool((unchanged == MASK_ID).any())
    assert bool(((labels[chosen] >= FIRST_WORD_ID) & (labels[chosen] < 4096)).all())
    assert mlm_batch(torch, 2, 512, 30522)["input_ids"].shape == (2, 512)


# --- end to end under the CLI ---------------------------------------------------------------


def wattline(*args: str, cwd: Path) -> dict[str, Any]:
    """Run ``wattline ARGS --json`` as a user would; the parsed JSON output."""
    env = {**os.environ, "WATTLINE_LOG_LEVEL": "warning"}
    proc = subprocess.run(
        [sys.executable, "-m", "wattline.cli.main", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=E2E_TIMEOUT_S,
        cwd=cwd,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("reference")


def store_url(store_dir: Path) -> str:
    return f"sqlite:///{store_dir / 'wattline.db'}"


@pytest.fixture(scope="module")
def inference_run(torch_mod: Any, store_dir: Path) -> dict[str, Any]:
    return wattline(
        "workload", "layoutlm-inference", "--size", "tiny", "--device", "cpu", "--threads", "1",
        "--duration", "8", "--step-seconds", "1", "--max-batch", "32",
        "--store", store_url(store_dir), "--report-json", str(store_dir / "inference-report.json"),
        cwd=store_dir,
    )  # fmt: skip


@pytest.fixture(scope="module")
def bert_run(torch_mod: Any, store_dir: Path) -> dict[str, Any]:
    return wattline(
        "workload", "bert-pretrain", "--size", "tiny", "--seq-len", "128", "--device", "cpu", "--threads", "1",
        "--duration", "8", "--store", store_url(store_dir), cwd=store_dir,
    )  # fmt: skip


@pytest.fixture(scope="module")
def bert_ddp_run(torch_mod: Any, store_dir: Path) -> dict[str, Any]:
    return wattline(
        "workload", "bert-pretrain", "--size", "tiny", "--seq-len", "128", "--device", "cpu",
        "--nproc-per-node", "2", "--duration", "8", "--store", store_url(store_dir), cwd=store_dir,
    )  # fmt: skip


def check_common(data: dict[str, Any], unit: str) -> None:
    assert data["schema"] == "wattline.workload/1" and data["note"] == RANDOM_WEIGHTS
    report, check, result = data["report"], data["check"], data["workload"]
    assert report["job"]["unit"] == unit and report["job"]["exit_code"] == 0
    labels = report["job"]["labels"]
    assert labels["device"] == "cpu" and labels["dtype"] == "fp32" and labels["weights"] == "random"
    # a saturation point, marked by the workload where it knows it is saturated
    sat = report["saturation"]
    assert sat["saturated"] is True and sat["at"] is not None and sat["method"] == "manual"
    assert report["durations_s"]["warmup"] > 0 and report["durations_s"]["measured"] > 0
    # every unit the workload processed was counted by the job, and nothing else
    assert check["units_match"] is True
    assert report["units"]["total"] == result["units_processed"] > 0
    # energy per unit, from whatever this host can measure (here maybe a labelled model)
    measured = report["measured"]
    assert measured["energy_j"] > 0 and measured["j_per_unit"] is not None and measured["j_per_unit"] > 0
    assert measured["throughput_units_per_s"] > 0
    assert check["detection_alone"]["method"] in {"throughput-plateau", "none"}


def test_layoutlm_inference_tiny_end_to_end(inference_run: dict[str, Any], store_dir: Path) -> None:
    check_common(inference_run, "inferences")
    result, report = inference_run["workload"], inference_run["report"]
    assert result["model"]["hidden_size"] == 64 and result["seq_len"] == 64 and result["threads"] == 1
    steps = result["ramp"]["steps"]
    assert len(steps) >= 2 and steps[0]["batch_size"] == 1
    plateau = result["plateau"]
    assert any(s["concurrency"] == plateau["concurrency"] and s["batch_size"] == plateau["batch_size"] for s in steps)
    # the measured window is the held plateau: its units are the documents held
    held = result["measured"]
    assert held["seconds"] >= 8
    assert report["units"]["measured"] == pytest.approx(held["documents"], rel=0.02)
    batch, per_doc = held["batch_latency_ms"], held["per_document_ms"]
    assert 0 < batch["p50"] <= batch["p90"] <= batch["p99"] <= batch["max"]
    assert per_doc["p50"] == pytest.approx(batch["p50"] / plateau["batch_size"])
    assert report["job"]["labels"]["workload"] == "layoutlm-inference"
    written = json.loads((store_dir / "inference-report.json").read_text())
    assert written["job"]["id"] == report["job"]["id"] and written["schema"] == "wattline.report/1"


def test_bert_pretrain_tiny_end_to_end(bert_run: dict[str, Any]) -> None:
    check_common(bert_run, "sequences")
    result, report = bert_run["workload"], bert_run["report"]
    assert result["model"]["class"] == "BertForMaskedLM" and result["seq_len"] == 128
    assert result["world_size"] == 1 and result["warmup"]["steps"] >= 3
    batch = result["batch_size"]
    assert result["units_processed"] == result["steps"] * batch
    assert report["units"]["measured"] == pytest.approx(result["measured"]["steps"] * batch, rel=0.05)
    assert report["job"]["labels"]["seq_len"] == "128"


def test_bert_pretrain_two_processes_count_once_per_host(bert_ddp_run: dict[str, Any]) -> None:
    check_common(bert_ddp_run, "sequences")
    result = bert_ddp_run["workload"]
    assert result["world_size"] == 2
    per_rank = result["sequences_processed_by_rank"]
    assert len(per_rank) == 2 and per_rank[0] == per_rank[1]  # ranks step together
    assert bert_ddp_run["report"]["units"]["total"] == sum(per_rank)
    assert bert_ddp_run["report"]["job"]["labels"]["world_size"] == "2"


def test_compare_two_runs(bert_run: dict[str, Any], bert_ddp_run: dict[str, Any], store_dir: Path) -> None:
    a, b = bert_run["report"]["job"]["id"], bert_ddp_run["report"]["job"]["id"]
    data = wattline("compare", a, b, "--work", "450000000", "--store", store_url(store_dir), cwd=store_dir)
    assert data["a"]["saturated"] and data["b"]["saturated"]
    assert data["throughput_ratio"] > 0 and data["j_per_unit"]["a"] > 0 and data["j_per_unit"]["b"] > 0
    assert data["work"]["hours"]["a"] > 0


def test_human_output_and_detection_mode(torch_mod: Any, store_dir: Path) -> None:
    """The table output says the weights are random and that a CPU comparison is only a
    demonstration; with --saturation detect the workload marks nothing, the report decides."""
    proc = subprocess.run(
        [sys.executable, "-m", "wattline.cli.main", "workload", "layoutlm-inference", "--size", "tiny",
         "--device", "cpu", "--threads", "1", "--duration", "3", "--step-seconds", "0.5", "--max-batch", "4",
         "--saturation", "detect", "--store", store_url(store_dir)],
        capture_output=True, text=True, timeout=E2E_TIMEOUT_S, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert RANDOM_WEIGHTS in proc.stdout and DEMO_ONLY in proc.stdout
    assert "match yes" in proc.stdout and "Load ramp" in proc.stdout and "per document" in proc.stdout
    assert "(manual)" not in proc.stdout
    assert "Saturated at" in proc.stdout or "NOT SATURATED" in proc.stdout


def test_sweep_layoutlm_over_threads_and_batch_size(torch_mod: Any, tmp_path: Path) -> None:
    """``wattline sweep`` over the reference LayoutLM's threads x batch size (tiny, this
    machine): every point runs as a job the workload joins, and the answer ranks them all.
    One run per point: repeats and their statistics are tests/integration/test_sweep.py's (a cheap workload)."""
    repeat = 1
    grid = {(t, b) for t in ("1", "2") for b in ("1", "4")}
    out = subprocess.run(
        [sys.executable, "-m", "wattline.cli.main", "sweep", "--param", "threads=1,2", "--param", "batch=1,4",
         "--repeat", str(repeat), "--units", "inferences", "--source", "cpu_model", "--json",
         "--store", f"sqlite:///{tmp_path / 'w.db'}", "--csv", str(tmp_path / "sweep.csv"),
         "--plot", str(tmp_path / "sweep.png"),
         "--", sys.executable, "-m", "wattline.reference.layoutlm_inference", "--size", "tiny",
         "--device", "cpu", "--threads", "{threads}", "--batch-size", "{batch}",
         "--duration", "2", "--step-seconds", "1"],
        capture_output=True, text=True, timeout=4 * E2E_TIMEOUT_S, cwd=tmp_path,
        env={**os.environ, "WATTLINE_LOG_LEVEL": "warning", "XDG_STATE_HOME": str(tmp_path / "state")},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)
    assert {(p["params"]["threads"], p["params"]["batch"]) for p in data["points"]} == grid
    for point in data["points"]:
        assert point["runs_ok"] == repeat, point
        assert point["j_per_unit"]["mean"] > 0 and point["throughput_per_s"]["mean"] > 0, point
    per_run = [json.loads(line) for line in out.stderr.splitlines() if line.startswith('{"schema"')]
    assert {(str(r["threads"]), str(r["plateau"]["batch_size"])) for r in per_run} == grid  # the settings took
    # each batch's latency reached the sweep: its median over the held plateau, as the workload's own p50
    p50 = {(str(r["threads"]), str(r["plateau"]["batch_size"])): [] for r in per_run}
    for r in per_run:
        p50[(str(r["threads"]), str(r["plateau"]["batch_size"]))].append(r["measured"]["batch_latency_ms"]["p50"])
    for point in data["points"]:
        mine = sum(p50[(point["params"]["threads"], point["params"]["batch"])]) / repeat / 1000
        assert point["latency_s"]["mean"] == pytest.approx(mine, rel=0.1), (point["params"], point["latency_s"], mine)
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    assert len((tmp_path / "sweep.csv").read_text().splitlines()) == 1 + len(grid)
