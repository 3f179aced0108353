"""Accelerators end to end: stand-in GPUs (one lost mid-run, one in MIG mode) and a
replayed Trn1 neuron-monitor stream, through the real agent process, a collector and a
real InfluxDB: right quality labels, exact counter energy for the GPUs, bounded model
energy for the Neuron device, and every failure reported without stopping the rest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nvml_stub.build import build_stub
from servers import Influxd
from waits import wait_until

from wattline.collector.server import CollectorServer
from wattline.stores.factory import open_store

REPLAY = Path(__file__).parents[1] / "helpers" / "neuron_replay.py"
GPU_A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
GPU_LOST = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
GPU_MIG = "GPU-cccccccc-0000-4000-8000-000000000000"
STEPS = 200  # energy values per GPU, 1000 mJ apart: more than the agent reads in the test


def scenario(path: Path) -> Path:
    ramp = " ".join(str(1000 * i) for i in range(STEPS))
    path.write_text(
        "driver 550.54.15\n"
        f"gpu {GPU_A} NVIDIA H100 80GB HBM3\nenergy 0 {ramp}\nutil 90:40\nmemory 85899345920:1073741824\nlimit 700000\n"
        # lost after five 1 J intervals
        f"gpu {GPU_LOST} NVIDIA H100 80GB HBM3\nenergy 0 0 1000 2000 3000 4000 5000 e15\nutil 90:40\n"
        "memory 85899345920:1073741824\nlimit 700000\n"
        f"gpu {GPU_MIG} NVIDIA A100-SXM4-80GB\nenergy 0 {ramp}\nutil ns\nmemory 85899345920:21474836480\n"
        "limit 400000\nmig 1 7\n"
        "mig_device 0 MIG-11111111-0000-4000-8000-000000000000 1 10737418240 1073741824\n"
        "mig_device 2 MIG-22222222-0000-4000-8000-000000000000 5 21474836480 4294967296\n"
    )
    return path


def neuron_config(tmp_path: Path) -> Path:
    path_env = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    config = tmp_path / "wattline.toml"
    config.write_text(
        "[sources.neuron]\n"
        f'monitor_path = "{REPLAY}"\n'
        'monitor_args = ["--period", "0.2"]\n'
        f'monitor_env = {{ PATH = "{path_env}" }}\n'
        "period_s = 0.2\n"
        'device_type = "trn1"\n'
    )
    return config


def tree(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    power = root / "sys/devices/virtual/neuron_device/neuron0/stats/power/utilization"
    power.parent.mkdir(parents=True)
    (root / "sys/devices/virtual/neuron_device/neuron0/info/architecture").mkdir(parents=True)
    power.write_text(f"POWER_STATUS_VALID,{int(time.time()) // 60 * 60},10.00,30.00,20.00\n")
    return root


def env_for(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "LD_LIBRARY_PATH": str(build_stub()),
        "WATTLINE_NVML_SCENARIO": str(scenario(tmp_path / "gpus.txt")),
        "COLUMNS": "200",
    }


def test_sources_lists_each_device_with_its_quality(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "wattline.cli.main", "sources", "--config", str(neuron_config(tmp_path)),
           "--sysfs-root", str(tree(tmp_path)), "--source", "nvml", "--source", "neuron", "--json", "--sample", "0.3"]  # fmt: skip
    out = subprocess.run(cmd, env=env_for(tmp_path), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = {s["source"]: s for s in json.loads(out.stdout)}
    gpus = {c["device"]: c for c in report["nvml"]["channels"]}
    assert set(gpus) == {GPU_A, GPU_LOST, GPU_MIG}  # MIG instances are not energy channels
    assert {c["quality"] for c in gpus.values()} == {"counter"}
    assert gpus[GPU_A]["power_w"] is not None
    (neuron,) = report["neuron"]["channels"]
    assert (neuron["component"], neuron["device"], neuron["quality"], neuron["measured"]) == (
        "accelerator", "neuron0", "model", False,
    )  # fmt: skip
    assert neuron["power_w"] == pytest.approx(120.0)  # idle 60 W + 20 % x 300 W (trn1 table)


def sampled(influxd: Influxd, db: str) -> bool:
    """The store holds what the checks below read while the agent runs: 15 one-joule intervals
    of each live GPU, the lost GPU's 5 before its loss, and the Neuron device's samples (the
    lost GPU's gap comes at the agent's stop, as an unhealthy sample)."""
    try:
        rows = influxd.query("SELECT sum(energy_j) AS e FROM energy GROUP BY device", db)
    except RuntimeError as exc:  # nothing written yet
        if "database not found" not in str(exc):
            raise
        return False
    joules = {r["device"]: r["e"] for r in rows}
    return (
        all(joules.get(gpu, 0) >= 15 for gpu in (GPU_A, GPU_MIG))
        and joules.get(GPU_LOST, 0) >= 5
        and "neuron0" in joules
    )


def test_agent_to_influxdb_with_a_lost_gpu_mig_and_neuron(tmp_path: Path, influxd: Influxd) -> None:
    db = influxd.new_database()
    with open_store(influxd.url, database=db) as store:
        server = CollectorServer(store, "127.0.0.1:0")
        server.start()
        cmd = [sys.executable, "-m", "wattline.cli.main", "agent", "--config", str(neuron_config(tmp_path)),
               "--sysfs-root", str(tree(tmp_path)), "--source", "nvml", "--source", "neuron", "--interval", "0.1",
               "--batch-interval", "0.2", "--host-id", "trn-gpu-1", "--collector", f"127.0.0.1:{server.port}"]  # fmt: skip
        agent = subprocess.Popen(cmd, env=env_for(tmp_path), stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: sampled(influxd, db) or agent.poll() is not None, "the devices' samples stored")
        finally:
            agent.send_signal(signal.SIGTERM)
            _, stderr = agent.communicate(timeout=30)
            server.stop()
    assert agent.returncode == 0, stderr
    assert "Traceback" not in stderr
    rows = influxd.query(
        "SELECT sum(energy_j) AS e, last(cumulative_j) AS c, count(energy_j) AS n, sum(energy_error_j) AS err "
        "FROM energy GROUP BY device, quality, component",
        db,
    )
    got = {r["device"]: r for r in rows}
    assert set(got) == {GPU_A, GPU_LOST, GPU_MIG, "neuron0"}
    for gpu in (GPU_A, GPU_MIG):
        # every interval is one 1000 mJ step: exact joules, counted once (MIG parent too)
        assert got[gpu]["quality"] == "counter"
        assert got[gpu]["e"] == got[gpu]["c"] >= 15
        samples = influxd.query(f"SELECT energy_j, healthy, status FROM energy WHERE device = '{gpu}'", db)
        assert {r["energy_j"] for r in samples} <= {0, 1}
        # The stand-in advances 1 J per read, not per second: a read right after another
        # (the agent's last tick at stop) implies kilowatts and is refused, never counted.
        assert all(not r["healthy"] and "implausible" in r["status"] for r in samples if r["energy_j"] == 0)
    assert got[GPU_LOST]["e"] == 5.0  # energy up to the loss, nothing invented after it
    lost = influxd.query(f"SELECT healthy, status, energy_j FROM energy WHERE device = '{GPU_LOST}'", db)
    unhealthy = [r for r in lost if not r["healthy"]]
    assert unhealthy and {r["status"] for r in unhealthy} == {"GPU is lost"}
    assert all(r["energy_j"] == 0 for r in unhealthy)
    neuron = got["neuron0"]
    assert (neuron["quality"], neuron["component"]) == ("model", "accelerator")
    seconds = influxd.query("SELECT sum(interval_s) AS s FROM energy WHERE device = 'neuron0'", db)[0]["s"]
    assert neuron["e"] == pytest.approx(120.0 * seconds, rel=1e-6)  # 120 W modelled
    assert neuron["err"] == pytest.approx(30.0 * seconds, rel=1e-6)  # +- 30 W from the minute's min/max
    labels = influxd.query("SHOW TAG VALUES FROM energy WITH KEY = instance_type", db)
    assert [r["value"] for r in labels] == ["trn1.2xlarge"]  # from neuron-monitor's instance_info


def test_run_maps_gpu_indexes_to_uuids_and_charges_only_those(tmp_path: Path) -> None:
    env = {**env_for(tmp_path), "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}"}
    wattline = [sys.executable, "-m", "wattline.cli.main"]
    run = [*wattline, "run", "--job-id", "gpu-job", "--devices", "0", "--source", "nvml", "--interval", "0.1",
           "--report-json", str(tmp_path / "r.json"), "--", "sleep", "1.5"]  # fmt: skip
    out = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    (devices,) = report["job"]["devices"].values()
    assert devices == [f"gpu:{GPU_A}"]
    # both windows' GPU figures (the warmup of a job that never saturated is empty: 0 J, no quality)
    gpus = [c for c in report["measured"]["by_component"] + report["warmup"]["by_component"] if c["component"] == "gpu"]
    assert set().union(*(c["energy_j_by_quality"] for c in gpus)) == {"counter"}
    total = report["measured"]["energy_j"] + report["warmup"]["energy_j"]
    # GPU A alone: 1 J per read at 10 Hz (the two other GPUs are not charged)
    assert 5.0 <= total <= 25.0, total
