"""NvmlSource against the real nvidia-ml-py bindings and a stand-in libnvidia-ml.so.1.

The stand-in (tests/nvml_stub/libnvml_stub.c) answers from a scenario file. pynvml loads
the library with ``CDLL("libnvidia-ml.so.1")``, and the loader reads LD_LIBRARY_PATH only at
process start, so every scenario runs in a fresh interpreter (``DRIVER`` below) that prints
JSON: channels, readings, deltas from the real EnergyCounter, health, and NVML call counts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from wattline.agent.sources.nvml import LIBRARY_MISSING, NvmlOptions, NvmlSource

STUB = Path(__file__).parents[1] / "nvml_stub"
SCENARIOS = STUB / "scenarios"

#: Runs in the subprocess: discover, ``reads`` reads at t = i * dt through EnergyCounter,
#: then processes() ``processes`` times, mig_devices(), close().
DRIVER = r"""
import ctypes, json, sys
from dataclasses import asdict
from wattline.agent.counter import EnergyCounter
from wattline.agent.sources.base import SourceUnavailable
from wattline.agent.sources.nvml import NvmlOptions, NvmlSource

plan = json.loads(sys.argv[1])
src = NvmlSource(options=NvmlOptions(**plan.get("options", {})))
try:
    channels = src.discover()
except SourceUnavailable as exc:
    print(json.dumps({"unavailable": str(exc)}))
    raise SystemExit(0)
lib = ctypes.CDLL("libnvidia-ml.so.1")
lib.stub_call_count.restype = ctypes.c_ulonglong
lib.stub_call_count.argtypes = [ctypes.c_char_p]
out = {
    "channels": [dict(asdict(c), info=dict(c.info)) for c in channels],
    "notes": [asdict(n) for n in src.notes],
    "health_at_discover": src.device_health(),
}
lib.stub_reset_counts()
counters = {c.device: EnergyCounter(c) for c in channels}
steps = []
for i in range(plan.get("reads", 0)):
    step = {"readings": {}, "deltas": {}}
    for r in src.read():
        delta = counters[r.channel.device].update(r, i * plan.get("dt", 1.0))
        step["readings"][r.channel.device] = {
            "energy_raw": r.energy_raw, "power_w": r.power_w, "utilization": r.utilization,
            "gauges": r.gauges, "error": r.error,
        }
        step["deltas"][r.channel.device] = None if delta is None else asdict(delta)
    step["health"] = src.device_health()
    steps.append(step)
out["steps"] = steps
out["cumulative_j"] = {d: c.cumulative_j for d, c in counters.items()}
out["read_calls"] = {n: lib.stub_call_count(n.encode()) for n in plan.get("count_calls", [])}
out["processes"] = [
    {uuid: [asdict(p) for p in procs] for uuid, procs in src.processes().items()}
    for _ in range(plan.get("processes", 0))
]
out["mig_devices"] = src.mig_devices()
src.close()
out["shutdowns"] = lib.stub_call_count(b"nvmlShutdown")
out["read_after_close"] = len(src.read())
print(json.dumps(out))
"""

#: Every NVML entry point the stub exports (for exact call accounting).
NVML_FUNCTIONS = [
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
]

GPU0 = "GPU-0a1b2c3d-0000-4000-8000-000000000000"
GPU1 = "GPU-0a1b2c3d-0000-4000-8000-000000000001"


@pytest.fixture(scope="session")
def stub_dir() -> Path:
    spec = importlib.util.spec_from_file_location("nvml_stub_build", STUB / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    built: Path = module.build_stub()
    return built


def run(scenario: str, lib_dir: Path, **plan: Any) -> dict[str, Any]:
    """Run DRIVER on ``scenarios/<scenario>.txt`` with ``lib_dir`` first on the loader path."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib_dir), WATTLINE_NVML_SCENARIO=str(SCENARIOS / f"{scenario}.txt"))
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(plan)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def energies(result: dict[str, Any], device: str) -> list[float | None]:
    return [None if s["deltas"][device] is None else s["deltas"][device]["energy_j"] for s in result["steps"]]


def test_two_gpus_counter_energy_is_exact(stub_dir: Path) -> None:
    result = run("two_gpus", stub_dir, reads=6)
    channels = {c["device"]: c for c in result["channels"]}
    assert list(channels) == [GPU0, GPU1]
    for ch in channels.values():
        assert (ch["source"], ch["component"], ch["quality"]) == ("nvml", "gpu", "counter")
        assert (ch["counter_scale_j"], ch["counter_max"], ch["max_power_w"]) == (1e-3, None, 1050.0)
    assert channels[GPU0]["info"] == {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": GPU0,
        "index": "0",
        "energy_source": "total_energy_consumption",
        "mig": "disabled",
        "memory_total_bytes": "85899345920",
    }
    assert channels[GPU1]["info"]["index"] == "1"
    assert {"level": "info", "text": "NVIDIA driver 550.54.15, 2 GPU(s)"} in result["notes"]
    # The first read sets the baseline; then exactly 1000 mJ and 2500 mJ a read.
    assert energies(result, GPU0) == [None, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert energies(result, GPU1) == [None, 2.5, 2.5, 2.5, 2.5, 2.5]
    assert result["cumulative_j"] == {GPU0: 5.0, GPU1: 12.5}
    first = result["steps"][0]["readings"][GPU0]  # discover took memory's first value, not util's
    assert first == {
        "energy_raw": 5000,
        "power_w": None,
        "utilization": 0.5,
        "gauges": {"memory_utilization": 0.2, "memory_used_bytes": 2147483648.0, "power_limit_w": 700.0},
        "error": None,
    }
    assert result["steps"][-1]["health"] == {GPU0: "ok", GPU1: "ok"}
    assert result["shutdowns"] == 1
    assert result["read_after_close"] == 0


def test_read_makes_minimum_calls_and_refreshes_limit(stub_dir: Path) -> None:
    result = run("two_gpus", stub_dir, reads=6, options={"limit_refresh_reads": 3}, count_calls=NVML_FUNCTIONS)
    calls = {name: n for name, n in result["read_calls"].items() if n}
    # 6 reads x 2 GPUs: energy, utilization, memory; limits at reads 3 and 6 only
    # (GPU 1 has no enforced limit, so the management limit is asked too).
    assert calls == {
        "nvmlDeviceGetTotalEnergyConsumption": 12,
        "nvmlDeviceGetUtilizationRates": 12,
        "nvmlDeviceGetMemoryInfo": 12,
        "nvmlDeviceGetEnforcedPowerLimit": 4,
        "nvmlDeviceGetPowerManagementLimit": 2,
    }
    limits = [s["readings"][GPU0]["gauges"]["power_limit_w"] for s in result["steps"]]
    assert limits == [700.0, 700.0, 700.0, 700.0, 700.0, 650.0]
    assert {s["readings"][GPU1]["gauges"]["power_limit_w"] for s in result["steps"]} == {700.0}


def test_lost_gpu_fails_alone_and_errors_recover(stub_dir: Path) -> None:
    a, b, d = (f"GPU-{c * 8}-0000-4000-8000-000000000000" for c in "abd")
    result = run("device_errors", stub_dir, reads=6, count_calls=["nvmlDeviceGetUtilizationRates"])
    assert [c["device"] for c in result["channels"]] == [a, b, d]
    assert {"level": "warning", "text": "GPU 2: Insufficient Permissions; skipped"} in result["notes"]
    assert energies(result, a) == [None, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert [s["readings"][b]["error"] for s in result["steps"]] == [None] * 3 + ["GPU is lost"] * 3
    assert energies(result, b) == [None, 1.0, 1.0, None, None, None]  # a gap: the last good value is kept
    # GPU D: one failed read closes no interval; the next good read counts the whole gap, marked.
    assert [s["readings"][d]["error"] for s in result["steps"]] == [None, None, "Unknown Error", None, None, None]
    assert energies(result, d) == [None, 1.0, None, 2.0, 1.0, 1.0]
    assert result["steps"][3]["deltas"][d]["status"].startswith("gap: ")
    assert result["steps"][2]["health"][d] == "Unknown Error"
    assert result["steps"][-1]["health"] == {a: "ok", b: "GPU is lost", "gpu2": "Insufficient Permissions", d: "ok"}
    # A failed GPU is not asked for utilization: 6 (A) + 3 (B) + 5 (D).
    assert result["read_calls"] == {"nvmlDeviceGetUtilizationRates": 14}


def test_no_energy_counter_integrates_power(stub_dir: Path) -> None:
    p100, m60 = "GPU-50500500-0000-4000-8000-000000000000", "GPU-60600600-0000-4000-8000-000000000000"
    result = run("pre_volta", stub_dir, reads=4, dt=1.0, count_calls=["nvmlDeviceGetPowerUsage"])
    channels = {c["device"]: c for c in result["channels"]}
    assert {c["quality"] for c in channels.values()} == {"integrated"}
    assert channels[p100]["info"]["energy_source"] == "power_instant"
    assert channels[m60]["info"]["energy_source"] == "power_usage"
    assert channels[p100]["max_power_w"] == 375.0
    assert [s["readings"][p100]["power_w"] for s in result["steps"]] == [100.0, 200.0, 200.0, 300.0]
    assert [s["readings"][m60]["energy_raw"] for s in result["steps"]] == [None] * 4
    assert result["cumulative_j"] == {p100: 600.0, m60: 225.0}
    assert energies(result, p100) == [None, 150.0, 200.0, 250.0]
    assert result["read_calls"] == {"nvmlDeviceGetPowerUsage": 4}  # the M60 only
    assert {
        "level": "info",
        "text": f"GPU 1 {m60} (Tesla M60): no energy counter; integrating nvmlDeviceGetPowerUsage (1 s average)",
    } in result["notes"]


def test_energy_counter_can_be_bypassed(stub_dir: Path) -> None:
    result = run("two_gpus", stub_dir, reads=2, options={"use_energy_counter": False})
    assert [(c["device"], c["quality"]) for c in result["channels"]] == [(GPU0, "integrated")]
    assert result["steps"][0]["readings"][GPU0]["power_w"] == 300.0
    assert result["cumulative_j"] == {GPU0: 300.0}
    assert result["health_at_discover"][GPU1] == "no energy counter or power reading"


def test_mig_parent_energy_once_instances_listed(stub_dir: Path) -> None:
    a100, h100 = "GPU-a100a100-0000-4000-8000-000000000000", "GPU-h100h100-0000-4000-8000-000000000000"
    mig1, mig2 = "MIG-11111111-0000-4000-8000-000000000000", "MIG-22222222-0000-4000-8000-000000000000"
    calls = ["nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetUtilizationRates"]
    result = run("mig", stub_dir, reads=4, processes=1, count_calls=calls)
    channels = {c["device"]: c for c in result["channels"]}
    assert list(channels) == [a100, h100]  # no channel per MIG instance
    assert channels[a100]["info"]["mig"] == "enabled"
    assert channels[h100]["info"]["mig"] == "disabled"
    assert result["cumulative_j"] == {a100: 3.0, h100: 1.5}
    # Energy read once per parent per read; utilization (NotSupported under MIG) asked once.
    assert result["read_calls"] == {"nvmlDeviceGetTotalEnergyConsumption": 8, "nvmlDeviceGetUtilizationRates": 5}
    assert {s["readings"][a100]["utilization"] for s in result["steps"]} == {None}
    assert "memory_utilization" not in result["steps"][-1]["readings"][a100]["gauges"]
    assert result["mig_devices"] == [
        {
            "parent_uuid": a100,
            "mig_uuid": mig1,
            "gpu_instance_id": 1,
            "memory_used_bytes": 1073741824,
            "memory_total_bytes": 10737418240,
            "processes": [{"pid": 7001, "used_memory_bytes": 1073741824, "sm_util": None, "gpu_instance_id": 1}],
        },
        {
            "parent_uuid": a100,
            "mig_uuid": mig2,
            "gpu_instance_id": 5,
            "memory_used_bytes": 4294967296,
            "memory_total_bytes": 21474836480,
            "processes": [
                {"pid": 7002, "used_memory_bytes": 2147483648, "sm_util": None, "gpu_instance_id": 5},
                {"pid": 7003, "used_memory_bytes": 1048576, "sm_util": None, "gpu_instance_id": 5},
            ],
        },
    ]
    procs = result["processes"][0]
    assert [(p["pid"], p["gpu_instance_id"]) for p in procs[a100]] == [(7001, 1), (7002, 5), (7003, 5)]
    assert procs[h100] == [{"pid": 8001, "used_memory_bytes": 1000, "sm_util": 55, "gpu_instance_id": None}]


def test_counter_reset_never_negative(stub_dir: Path) -> None:
    device = "GPU-4c4c4c4c-0000-4000-8000-000000000000"
    result = run("counter_reset", stub_dir, reads=6)
    assert [s["readings"][device]["energy_raw"] for s in result["steps"]] == [5000, 6000, 7000, 150, 1150, 2150]
    assert energies(result, device) == [None, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert result["steps"][3]["deltas"][device]["status"] == "counter reset"
    cumulative = [s["deltas"][device]["cumulative_j"] for s in result["steps"][1:]]
    assert cumulative == sorted(cumulative) and cumulative[-1] == 4.0


def test_processes_per_gpu(stub_dir: Path) -> None:
    result = run("two_gpus", stub_dir, processes=2)
    expected = {
        GPU0: [
            {"pid": 4242, "used_memory_bytes": 1073741824, "sm_util": 87, "gpu_instance_id": None},
            {"pid": 4343, "used_memory_bytes": 536870912, "sm_util": None, "gpu_instance_id": None},
        ],
        GPU1: [],
    }
    # The second call asks only for samples newer than the first call saw.
    assert result["processes"] == [expected, expected]


@pytest.mark.parametrize(
    ("scenario", "message"),
    [
        ("driver_not_loaded", LIBRARY_MISSING),
        ("zero_gpus", "NVML found no GPUs"),
        ("no_energy", "none of 1 GPU(s) reports energy or power (no energy counter or power reading)"),
    ],
)
def test_unavailable(stub_dir: Path, scenario: str, message: str) -> None:
    assert run(scenario, stub_dir) == {"unavailable": message}


def test_library_missing(tmp_path: Path) -> None:
    # An unloadable libnvidia-ml.so.1 first on the loader path hides any installed one, so
    # this holds on GPU hosts too: pynvml's CDLL fails exactly as without a driver.
    (tmp_path / "libnvidia-ml.so.1").write_text("not a shared object\n")
    result = run("two_gpus", tmp_path)
    assert result == {"unavailable": LIBRARY_MISSING}
    assert "\n" not in LIBRARY_MISSING


def test_gpu_check_script_runs(stub_dir: Path) -> None:
    # The real-GPU check script, smoke-run against the stand-in (idle unless torch sees a GPU).
    env = dict(os.environ, LD_LIBRARY_PATH=str(stub_dir), WATTLINE_NVML_SCENARIO=str(SCENARIOS / "two_gpus.txt"))
    argv = [sys.executable, str(STUB / "gpu_check.py"), "--seconds", "0.3", "--interval", "0.05", "--ramp", "0"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    # two-sided: this scenario's counter (1 J a read) and instant power (300 W) disagree,
    # so the script must say DISAGREE and exit 1 ...
    assert (proc.returncode, "RESULT: DISAGREE" in proc.stdout) == (1, True), proc.stdout + proc.stderr
    assert "energy counter off by option; integrating instantaneous power" in proc.stdout
    assert f"GPU 0 {GPU0} (NVIDIA H100 80GB HBM3)" in proc.stdout


def test_gpu_check_script_agrees_where_counter_and_power_agree(stub_dir: Path, tmp_path: Path) -> None:
    # ... and where both follow one model (a steady 100 W), it must agree and exit 0: the
    # stand-in's counter steps every 100 ms, so its first and last reads each lag the truth
    # by up to a step, at most 0.1 s of the 3 s apart: within the script's 10 %
    scenario = tmp_path / "steady.txt"
    scenario.write_text(f"gpu {GPU0} NVIDIA H100 80GB HBM3\nenergy_model 100 0 {time.time() - 10}\n")
    env = dict(os.environ, LD_LIBRARY_PATH=str(stub_dir), WATTLINE_NVML_SCENARIO=str(scenario))
    argv = [sys.executable, str(STUB / "gpu_check.py"), "--seconds", "3", "--interval", "0.05", "--ramp", "0"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, "RESULT: agree" in proc.stdout) == (0, True), proc.stdout + proc.stderr


def test_import_does_not_load_pynvml() -> None:
    code = "import sys, wattline.agent.sources.nvml; print('pynvml' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "False"


def test_unopened_source_is_empty() -> None:
    src = NvmlSource()
    assert (src.read(), src.processes(), src.mig_devices(), src.device_health()) == ([], {}, [], {})
    src.close()


@pytest.mark.parametrize("bad", [{"limit_refresh_reads": 0}, {"power_limit_margin": 0.5}, {"default_max_power_w": 0.0}])
def test_options_are_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        NvmlOptions(**bad)


def test_sources_json_shows_health_processes_and_mig_instances(stub_dir: Path, tmp_path: Path) -> None:
    """``wattline sources --json`` carries what NVML knows beyond energy: each GPU's health, its
    compute processes, and the MIG instances (which carry no energy of their own)."""
    a100, h100 = "GPU-a100a100-0000-4000-8000-000000000000", "GPU-h100h100-0000-4000-8000-000000000000"
    env = dict(os.environ, LD_LIBRARY_PATH=str(stub_dir), WATTLINE_NVML_SCENARIO=str(SCENARIOS / "mig.txt"))
    cmd = [sys.executable, "-m", "wattline.cli.main", "sources", "--json", "--source", "nvml", "--sample", "0"]
    proc = subprocess.run([*cmd, "--sysfs-root", str(tmp_path)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (nvml,) = json.loads(proc.stdout)
    details = nvml["details"]
    assert details["health"] == {a100: "ok", h100: "ok"}
    assert [(p["pid"], p["gpu_instance_id"]) for p in details["processes"][a100]] == [(7001, 1), (7002, 5), (7003, 5)]
    assert details["processes"][h100] == [
        {"pid": 8001, "used_memory_bytes": 1000, "sm_util": 55, "gpu_instance_id": None}
    ]
    assert [(m["mig_uuid"][:12], m["gpu_instance_id"], m["memory_total_bytes"]) for m in details["mig_devices"]] == [
        ("MIG-11111111", 1, 10737418240),
        ("MIG-22222222", 5, 21474836480),
    ]
