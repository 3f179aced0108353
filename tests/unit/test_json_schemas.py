"""The published JSON Schemas (``docs/schema/``, draft 2020-12) hold for real ``wattline report
--json`` and ``wattline compare --json`` outputs of several shapes, and are strict enough to
refuse one with a field renamed, retyped or added. The sweep's (``wattline sweep --json``)
holds for real sweeps in tests/integration/test_sweep.py and tests/integration/test_sweep_settings.py (one with a
failed point); here it refuses a changed answer of the sweep's own JSON code.

Outputs: a job on two hosts, part of its energy a model estimate (tests/helpers/synthetic_job.py),
plain and with every policy option; two jobs sharing a GPU, split by their recorded use, one
closed and one that never closed (abandoned); a job without any sample and one whose samples
stop before its close; a comparison of two jobs, plain and with the SLA and work figures.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from schema_check import validator
from synthetic_job import T0, S, make_store, truth
from typer.testing import CliRunner

from wattline import wire
from wattline.accounting.uncertainty import Side
from wattline.cli.main import app
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.reports.output.comparison import COMPARE_SCHEMA
from wattline.reports.report_json import REPORT_SCHEMA
from wattline.stores.sqlite.store import SqliteStore
from wattline.sweep.analysis import RunFigures, analyse
from wattline.sweep.grid import Param, points
from wattline.sweep.output import SWEEP_SCHEMA, answer_json
from wattline.sweep.plan import Plan

GPU = "GPU-5a5a5a5a-0000-4000-8000-000000000000"
GPU_W = 200.0
#: Job id -> (SM percent it uses of the GPU, closes?): together 80 % of the device's 80 % use.
GPU_JOBS = {"gpu-a": (30.0, True), "gpu-b": (50.0, False)}


def gpu_jobs(path: Path) -> str:
    """A store with a GPU at :data:`GPU_W` over a minute, shared by :data:`GPU_JOBS`, each
    claiming it and sending its use every 10 s and a unit a second."""
    with SqliteStore(path) as store:
        batch = wire.Batch(stream_id="gpu", seq=1, sent_ns=T0)
        batch.host.host_id = "node-1"
        for i in range(-5, 65):
            batch.samples.add(
                source="nvml", component="gpu", device=GPU, quality=wire.QUALITY_COUNTER, healthy=True,
                start_ns=T0 + i * S, end_ns=T0 + (i + 1) * S, energy_j=GPU_W, power_w=GPU_W,
                cumulative_j=GPU_W * (i + 6),
            )  # fmt: skip
        for job_id, (sm, closes) in GPU_JOBS.items():
            b = EventBuilder(JobSpec(job_id, job_id, "training", "steps", {}, [f"gpu:{GPU}"]))
            events = [b.open(T0)]
            events += [
                b.make(wire.pb.JobEvent.KIND_USE, T0 + k * 10 * S, use_device=f"gpu:{GPU}", use_period_ns=10 * S,
                       job_use=sm, device_use=80.0, use_metric="sm")
                for k in range(1, 7)
            ]  # fmt: skip
            events += [b.units(1, T0 + k * S) for k in range(1, 61)]
            if closes:
                events.append(b.close(0, T0 + 60 * S))
            batch.job_events.extend(events)
        assert store.write(batch).rejected == 0
    return f"sqlite:///{path}"


def odd_jobs(path: Path) -> str:
    """A store with a job whose host sent no sample ("quiet", exit 3) and one whose samples
    stop 20 s before its close ("cut-short")."""
    with SqliteStore(path) as store:
        for host, job_id, samples_s in (("node-9", "quiet", 0), ("node-2", "cut-short", 20)):
            batch = wire.Batch(stream_id=job_id, seq=1, sent_ns=T0)
            batch.host.host_id = host
            for i in range(samples_s):
                batch.samples.add(
                    source="rapl", component="cpu_package", device="package-0", quality=wire.QUALITY_COUNTER,
                    healthy=True, start_ns=T0 + i * S, end_ns=T0 + (i + 1) * S, energy_j=10.0, power_w=10.0,
                    cumulative_j=10.0 * (i + 1),
                )  # fmt: skip
            b = EventBuilder(JobSpec(job_id, job_id))
            batch.job_events.extend([b.open(T0), b.close(3, T0 + 40 * S)])
            assert store.write(batch).rejected == 0
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("stores")
    return {
        "synthetic": make_store(root / "synthetic.db", {"synth": ("node-1", "node-2"), "other": ("node-1",)}),
        "gpu": gpu_jobs(root / "gpu.db"),
        "odd": odd_jobs(root / "odd.db"),
    }


def cli(store: str, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, [*args, "--store", store, "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


POLICY = ("--idle", "subtract", "--price", "2.5", "--carbon-intensity", "400", "--pue", "1.2")
REPORTS = {
    "two hosts": ("synthetic", "synth"),
    "every policy option": ("synthetic", "synth", *POLICY),
    "shared GPU, closed": ("gpu", "gpu-a"),
    "shared GPU, abandoned": ("gpu", "gpu-b"),
    "no samples": ("odd", "quiet"),
    "samples cut short": ("odd", "cut-short"),
}
COMPARES = {
    "plain": ("synthetic", "synth", "other"),
    "SLA and work": (
        *("synthetic", "synth", "other", "--sla", "100000", "--work", "1000000"),
        *("--price-a", "1", "--price-b", "0.5", "--carbon-intensity", "300"),
    ),
}


@pytest.fixture(scope="module")
def reports(stores: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {shape: cli(stores[store], "report", *args) for shape, (store, *args) in REPORTS.items()}


@pytest.fixture(scope="module")
def compares(stores: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {shape: cli(stores[store], "compare", *args) for shape, (store, *args) in COMPARES.items()}


def test_the_schemas_name_the_versions_the_code_writes() -> None:
    assert validator("report").schema["properties"]["schema"] == {"const": REPORT_SCHEMA}
    assert validator("compare").schema["properties"]["schema"] == {"const": COMPARE_SCHEMA}
    assert validator("sweep").schema["properties"]["schema"] == {"const": SWEEP_SCHEMA}


def test_real_reports_of_each_shape_are_valid(reports: dict[str, dict[str, Any]]) -> None:
    check = validator("report")
    for shape, data in reports.items():
        errors = [f"{e.json_path}: {e.message}" for e in check.iter_errors(data)]
        assert not errors, f"{shape}: {errors}"
    # The shapes are what they claim to be (else the schema is checked on less than it says).
    plain, policy = reports["two hosts"], reports["every policy option"]
    assert plain["job"]["hosts"] == ["node-1", "node-2"] and plain["measured"]["estimate"]
    assert policy["figures_from"] == "dynamic_energy_j" and policy["measured"]["cost_usd_per_run"] is not None
    # The saturated window under its name and, the same, under its deprecated one ("measured").
    for data in reports.values():
        assert data["saturated"] == data["measured"]
        assert data["durations_s"]["saturated"] == data["durations_s"]["measured"]
        assert data["units"]["saturated"] == data["units"]["measured"]
    assert plain["saturated"]["estimate"] and policy["saturated"]["cost_usd_per_run"] is not None
    for shape, closes in zip(("shared GPU, closed", "shared GPU, abandoned"), (True, False), strict=True):
        data = reports[shape]
        assert [d["basis"] for d in data["device_shares"]] == ["measured share"]
        assert all(d["split_by_use_j"] == d["measured_j"] > 0 for d in data["device_shares"])
        assert data["job"]["closed"] is closes and (data["job"]["exit_code"] is None) is not closes
    assert reports["shared GPU, abandoned"]["job"]["status"] == "abandoned"
    assert not reports["no samples"]["energy_data"] and reports["no samples"]["saturation"]["at"] is None
    assert list(reports["samples cut short"]["samples_up_to"]) == ["node-2"]


def test_real_comparisons_of_each_shape_are_valid(compares: dict[str, dict[str, Any]]) -> None:
    check = validator("compare")
    for shape, data in compares.items():
        errors = [f"{e.json_path}: {e.message}" for e in check.iter_errors(data)]
        assert not errors, f"{shape}: {errors}"
    assert "sla" not in compares["plain"] and "work" not in compares["plain"]
    assert {"sla", "work"} <= compares["SLA and work"].keys()


#: Deprecated report fields that said "share" for a ratio (#46), each to its new name, by where
#: they sit: every window and whole_run, the saturated window's coverage, each device share.
DEPRECATED_IN_WINDOWS = {"estimate_share": "estimate_fraction"}
DEPRECATED_IN_COVERAGE = {"shares": "fractions", "split_by_utilization_share": "split_by_use_fraction"}
DEPRECATED_IN_DEVICE_SHARES = {"share": "fraction"}


def model_fraction(*windows: str) -> float:
    """The part of the synthetic job's energy in ``windows`` that its NIC model gave."""
    parts = [truth(w, c, 2) for w in windows for c in ("cpu_package", "dram", "nic")]
    return sum(truth(w, "nic", 2) for w in windows) / sum(parts)


def test_each_deprecated_share_name_holds_its_fractions_value(
    reports: dict[str, dict[str, Any]], compares: dict[str, dict[str, Any]]
) -> None:
    """Old readers still find each renamed field under its old name, with the same value, and
    the values are the ones the stores were built with."""
    for data in reports.values():
        for window in ("saturated", "warmup", "whole_run"):
            for old, new in DEPRECATED_IN_WINDOWS.items():
                assert data[window][old] == data[window][new], (window, old)
        for old, new in DEPRECATED_IN_COVERAGE.items():
            assert data["saturated"]["coverage"][old] == data["saturated"]["coverage"][new], old
        for d in data["device_shares"]:
            assert all(d[old] == d[new] for old, new in DEPRECATED_IN_DEVICE_SHARES.items())
    plain = reports["two hosts"]
    assert plain["saturated"]["estimate_fraction"] == pytest.approx(model_fraction("measured"), rel=1e-9)
    assert plain["warmup"]["estimate_fraction"] == pytest.approx(model_fraction("warmup"), rel=1e-9)
    assert plain["whole_run"]["estimate_fraction"] == pytest.approx(model_fraction("warmup", "measured"), rel=1e-9)
    assert plain["saturated"]["coverage"]["fractions"]["model"] == pytest.approx(model_fraction("measured"))
    shared = reports["shared GPU, closed"]
    [device] = shared["device_shares"]
    sm, _ = GPU_JOBS["gpu-a"]
    assert device["fraction"] == pytest.approx(sm / 80.0, rel=1e-6)  # its use of the device's
    assert shared["saturated"]["coverage"]["split_by_use_fraction"] == pytest.approx(1.0)  # all of it a GPU's
    for data in compares.values():
        for side in ("a", "b"):
            assert data[side]["estimate_share"] == data[side]["estimate_fraction"]
    plain_cmp = compares["plain"]
    assert plain_cmp["a"]["estimate_fraction"] == pytest.approx(model_fraction("measured"), rel=1e-9)


def deprecated_fields(schema: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """Every field a schema marks deprecated: (name, description, the object that holds it)."""
    found: list[tuple[str, str, dict[str, Any]]] = []
    if isinstance(schema, dict):
        for name, field in schema.get("properties", {}).items():
            if isinstance(field, dict) and field.get("deprecated") is True:
                found.append((name, field.get("description", ""), schema))
        for value in schema.values():
            found += deprecated_fields(value)
    elif isinstance(schema, list):
        for value in schema:
            found += deprecated_fields(value)
    return found


#: Schema -> each old "share" name (#46) -> (its new name, in how many objects the schema has it).
RENAMED_SHARES = {
    "report": {
        "estimate_share": ("estimate_fraction", 3),  # windows and whole_run, intervals' rows, at saturation
        "energy_estimate_share": ("energy_estimate_fraction", 1),
        "share": ("fraction", 2),  # model_split.models[], device_shares[]
        "share_bound": ("fraction_bound", 1),
        "shares": ("fractions", 1),
        "split_by_utilization_share": ("split_by_use_fraction", 1),
    },
    "compare": {"estimate_share": ("estimate_fraction", 1)},
    "sweep": {"estimate_share": ("estimate_fraction", 1)},
}


@pytest.mark.parametrize("schema", sorted(RENAMED_SHARES))
def test_the_schemas_mark_each_old_share_name_deprecated(schema: str) -> None:
    """Each old name is deprecated beside its new one, which is required, and says which it equals."""
    fields = deprecated_fields(validator(schema).schema)
    for old, (new, count) in RENAMED_SHARES[schema].items():
        holders = [obj for name, _, obj in fields if name == old]
        assert len(holders) == count, (old, len(holders))
        for name, description, obj in fields:
            if name == old:
                assert description == f"deprecated: the same as {new}", (old, description)
                assert new in obj["properties"] and {old, new} <= set(obj["required"]), (old, new)


FieldPath = tuple[str | int, ...]  #: keys down to one field of an output


def _copy_at(data: dict[str, Any], path: FieldPath) -> tuple[dict[str, Any], Any]:
    """A deep copy of ``data`` and, in it, the object holding the field at ``path``."""
    out = copy.deepcopy(data)
    parent: Any = out
    for key in path[:-1]:
        parent = parent[key]
    return out, parent


def renamed(data: dict[str, Any], path: FieldPath, new: str) -> dict[str, Any]:
    """``data`` with the field at ``path`` renamed to ``new``, its value kept."""
    out, parent = _copy_at(data, path)
    parent[new] = parent.pop(path[-1])
    return out


def removed(data: dict[str, Any], path: FieldPath) -> dict[str, Any]:
    """``data`` without the field at ``path``."""
    out, parent = _copy_at(data, path)
    del parent[path[-1]]
    return out


def retyped(data: dict[str, Any], path: FieldPath, value: object) -> dict[str, Any]:
    """``data`` with the field at ``path`` set to ``value`` (added if absent)."""
    out, parent = _copy_at(data, path)
    parent[path[-1]] = value
    return out


@pytest.mark.parametrize(
    ("schema", "shape", "change"),
    [
        ("report", "two hosts", lambda d: renamed(d, ("measured", "energy_j"), "energy_joules")),
        ("report", "two hosts", lambda d: renamed(d, ("whole_run", "j_per_unit_bound"), "j_per_unit_err")),
        ("report", "two hosts", lambda d: renamed(d, ("warmup", "by_host"), "hosts")),
        ("report", "two hosts", lambda d: renamed(d, ("job", "exit_code"), "exit_status")),
        ("report", "two hosts", lambda d: retyped(d, ("job", "exit_code"), "0")),
        ("report", "two hosts", lambda d: retyped(d, ("measured", "coverage", "fractions"), {"measured": 1.0})),
        ("report", "two hosts", lambda d: retyped(d, ("job", "start"), "2026-01-01 00:00:00")),
        ("report", "two hosts", lambda d: retyped(d, ("extra",), 1)),
        ("report", "shared GPU, closed", lambda d: renamed(d, ("device_shares", 0, "measured_j"), "split_j")),
        ("report", "two hosts", lambda d: renamed(d, ("saturated", "energy_j"), "energy_joules")),
        ("report", "two hosts", lambda d: renamed(d, ("units", "saturated"), "steady")),
        ("report", "shared GPU, closed", lambda d: renamed(d, ("device_shares", 0, "split_by_use_j"), "split_j")),
        ("compare", "SLA and work", lambda d: renamed(d, ("j_per_unit", "change_pct"), "change_percent")),
        ("compare", "SLA and work", lambda d: retyped(d, ("sla", "instances", "estimate"), True)),
        ("compare", "SLA and work", lambda d: retyped(d, ("a", "saturated"), "yes")),
        ("compare", "plain", lambda d: retyped(d, ("schema",), "wattline.compare/2")),
    ],
)
def test_a_renamed_or_mistyped_field_is_refused(
    schema: str,
    shape: str,
    change: Callable[[dict[str, Any]], dict[str, Any]],
    reports: dict[str, dict[str, Any]],
    compares: dict[str, dict[str, Any]],
) -> None:
    data = (reports if schema == "report" else compares)[shape]
    check = validator(schema)
    assert check.is_valid(data)  # the real output passes ...
    assert not check.is_valid(change(data))  # ... and the changed one does not


def sweep_answer() -> dict[str, Any]:
    """A sweep's JSON from its own code (``answer_json``): batch=1 and batch=8 with figures,
    batch=8 with one of its three runs failed, batch=32 failed in every run; with --sla,
    --price and latencies, so that no field is null only for want of an option."""
    plan = Plan("s-1", [Param("batch", ("1", "8", "32"))], ["cmd", "{batch}"], repeat=3, units="items")
    grid = points(plan.params)
    j_per_unit = {"1": 1.0, "8": 1.5}
    runs = []
    for point in grid:
        batch = point[0][1]
        for k in range(3):
            job = f"s-1-{batch}.{k}"
            if batch == "32" or (batch == "8" and k == 1):
                runs.append(RunFigures(point, k, job, 3, problem="failed (exit 3)"))
                continue
            runs.append(
                RunFigures(
                    point, k, job, 0, j_per_unit=j_per_unit[batch] * (1 + k / 100), throughput_per_s=10.0,
                    throughput_per_instance_h=36000.0, mean_power_w=10.0, power_per_instance_w=10.0,
                    side=Side(0.01, 0.002), estimate_fraction=0.1, latency_s=0.01 * int(batch),
                )
            )  # fmt: skip
    return answer_json(plan, analyse(runs, grid, 1e6, 2.0), 1e6, 2.0)


def test_a_sweep_answer_of_each_shape_is_valid() -> None:
    data = sweep_answer()
    check = validator("sweep")
    assert [f"{e.json_path}: {e.message}" for e in check.iter_errors(data)] == []
    # the shapes are what they claim to be: ranked, ranked with a failed run, failed
    one, eight, failed = data["points"]
    assert (one["rank"], eight["rank"], failed["rank"]) == (1, 2, None)
    assert eight["problems"] == ["failed (exit 3)"] and eight["runs_ok"] == 2
    assert failed["j_per_unit"] is None and failed["problems"] == ["failed (exit 3)"]
    assert one["advantage_over_next"] is not None and one["sla_cost_usd_per_million"] is not None
    assert [c["figure"] for c in data["choices"]] == ["energy per unit", "energy at the SLA", "cost at the SLA"]
    # each usable run's estimate_fraction was 0.1; a point without usable runs has 0; the old name the same
    assert [p["estimate_fraction"] for p in data["points"]] == [0.1, 0.1, 0.0]
    assert [p["estimate_share"] for p in data["points"]] == [p["estimate_fraction"] for p in data["points"]]


@pytest.mark.parametrize(
    "change",
    [
        lambda d: removed(d, ("choices",)),
        lambda d: removed(d, ("points", 0, "runs_ok")),
        lambda d: removed(d, ("points", 2, "problems")),
        lambda d: removed(d, ("points", 0, "j_per_unit", "bound_rel")),
        lambda d: removed(d, ("points", 0, "advantage_over_next", "verdict")),
        lambda d: renamed(d, ("points", 0, "throughput_per_s"), "throughput"),
        lambda d: retyped(d, ("schema",), "wattline.sweep/2"),
        lambda d: retyped(d, ("repeat",), 0),
        lambda d: retyped(d, ("repeat",), "3"),
        lambda d: retyped(d, ("params", "batch"), "1,8,32"),
        lambda d: retyped(d, ("points", 0, "rank"), "1"),
        lambda d: retyped(d, ("points", 0, "rank"), 0),
        lambda d: retyped(d, ("points", 0, "pareto"), "yes"),
        lambda d: retyped(d, ("points", 0, "j_per_unit", "runs"), 1.0),
        lambda d: retyped(d, ("points", 0, "estimate_fraction"), 10.0),
        lambda d: retyped(d, ("points", 0, "sla_instances"), [1, 2, 3]),
        lambda d: retyped(d, ("points", 2, "problems"), ["failed: exit 3"]),
        lambda d: retyped(d, ("points", 2, "runs_ok"), None),
        lambda d: retyped(d, ("choices", 0, "figure"), "energy"),
        lambda d: retyped(d, ("extra",), 1),
        lambda d: retyped(d, ("points", 0, "extra"), 1),
        lambda d: retyped(d, ("points", 0, "j_per_unit", "median"), 1.0),
        lambda d: retyped(d, ("points", 0, "advantage_over_next", "confidence"), 0.9),
        lambda d: retyped(d, ("choices", 0, "extra"), 1),
    ],
)
def test_a_sweep_answer_missing_mistyped_or_added_a_field_is_refused(
    change: Callable[[dict[str, Any]], dict[str, Any]],
) -> None:
    data = sweep_answer()
    check = validator("sweep")
    assert check.is_valid(data)  # the code's answer passes ...
    assert not check.is_valid(change(data))  # ... and the changed one does not
