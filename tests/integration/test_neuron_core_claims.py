"""NeuronCore claims charge the devices those cores are on, by each host's own count.

``wattline run --devices neuroncore:...`` (embedded sampling, the Neuron source pointed at a
replayed neuron-monitor stream and a sysfs tree with a power file per device) -> SQLite ->
``wattline report --json``. The streams (``neuron_streams.py``): trn2.48xlarge at logical
NeuronCore config 1 (8 NeuronCores a device) and trn1.32xlarge (2 a device). Each device
draws its own known power (the driver file's average percent of a 1000 W maximum, no idle
power added), so the charge a job should get is the power the test put in for the devices
its cores are on, over its window; a wrong map charges other devices' power.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from neuron_streams import TRN2_STREAM, ndjson, trn1_stream, trn2_stream

from wattline import wire
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.stores.factory import open_store
from wattline.stores.sqlite.store import SqliteStore

REPLAY = Path(__file__).parents[1] / "helpers" / "neuron_replay.py"
WATTLINE = [sys.executable, "-m", "wattline.cli.main"]
DEVICES = 16
MAX_W = 1000.0  # the devices' configured maximum: percent x 10 = W


def power_w(device: int) -> float:
    """W that device ``device`` draws: 10 % of the maximum plus 5 % per device index."""
    return (10.0 + 5.0 * device) * MAX_W / 100.0


def neuron_host(tmp_path: Path, name: str, reports: list[dict[str, Any]]) -> list[str]:
    """``wattline run`` options sampling a Neuron host ``name``: its stream replayed as
    neuron-monitor, a sysfs tree with :data:`DEVICES` devices, each at :func:`power_w`."""
    stream = tmp_path / f"{name}.ndjson"
    stream.write_text(ndjson(reports))
    path_env = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    config = tmp_path / f"{name}.toml"
    config.write_text(
        "[sources.neuron]\n"
        f'monitor_path = "{REPLAY}"\n'
        'monitor_args = ["--period", "0.1"]\n'
        f'monitor_env = {{ PATH = "{path_env}", NEURON_REPLAY_FILE = "{stream}" }}\n'
        "period_s = 0.1\n"
        f"device_max_power_w = {{ trainium = {MAX_W}, trainium2 = {MAX_W} }}\n"
        "device_idle_power_w = { trainium = 0.0, trainium2 = 0.0 }\n"
    )
    root = tmp_path / name
    minute = int(time.time()) // 60 * 60
    for d in range(DEVICES):
        power = root / f"sys/devices/virtual/neuron_device/neuron{d}/stats/power/utilization"
        power.parent.mkdir(parents=True)
        pct = power_w(d) / MAX_W * 100.0
        power.write_text(f"POWER_STATUS_VALID,{minute},{pct:.2f},{pct:.2f},{pct:.2f}\n")
    return ["--host-id", name, "--config", str(config), "--sysfs-root", str(root)]


def run_job(db: Path, job: str, host: list[str], devices: str) -> subprocess.Popen[str]:
    if not db.exists():  # created once, before concurrent runs open it
        open_store(f"sqlite:///{db}").close()
    return subprocess.Popen(
        [*WATTLINE, "run", "--job", job, "--job-id", job, "--source", "neuron", "--interval", "0.1",
         "--store", f"sqlite:///{db}", "--no-report", "--devices", devices, *host, "--", "sleep", "2"],
        env={**os.environ, "WATTLINE_USE_PERIOD_S": "0.5"}, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def finish(*runs: subprocess.Popen[str]) -> None:
    for p in runs:
        _out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]


def report(db: Path, job: str) -> dict[str, Any]:
    out = subprocess.run([*WATTLINE, "report", job, "--store", f"sqlite:///{db}", "--json"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got: dict[str, Any] = json.loads(out.stdout)
    return got


def window_s(db: Path, job: str) -> dict[str, float]:
    """Each host's window (its open to its close event), in seconds, from the stored events."""
    with SqliteStore(db) as store:
        events = {(e.host, e.event): e.time_ns for e in store.job_events(job) if e.event in ("open", "close")}
    return {host: (events[host, "close"] - t) / 1e9 for (host, kind), t in events.items() if kind == "open"}


def charged(got: dict[str, Any]) -> dict[str, dict[str, float]]:
    """host -> device -> J the report charged the job for it."""
    out: dict[str, dict[str, float]] = {}
    for ds in got["device_shares"]:
        out.setdefault(ds["host"], {})[ds["device"]] = ds["energy_j"]
    return out


def test_the_committed_trn2_stream_is_what_the_generator_makes() -> None:
    assert TRN2_STREAM.read_text() == ndjson(trn2_stream())


def test_neuroncores_0_to_7_on_trn2_are_device_0(tmp_path: Path) -> None:
    """On trn2 (8 NeuronCores a device), ``--devices neuroncore:0-7`` is neuron0: the job is
    charged neuron0's power over its window (within 1 %), claimed, and no other device."""
    db = tmp_path / "w.db"
    finish(run_job(db, "trn2-job", neuron_host(tmp_path, "trn2-a", trn2_stream()), "neuroncore:0-7"))
    got = report(db, "trn2-job")
    [seconds] = window_s(db, "trn2-job").values()
    assert got["complete"], got["notes"]
    assert {d["basis"] for d in got["device_shares"]} == {"claimed"}
    assert charged(got) == {"trn2-a": {"neuron0": pytest.approx(power_w(0) * seconds, rel=0.01)}}
    assert not any("assumed" in n for n in got["notes"])


def test_a_mixed_fleet_maps_each_hosts_cores_by_its_own_count(tmp_path: Path) -> None:
    """One job on a trn1 and a trn2 host, each run claiming ``neuroncore:0-3``: on trn1 (2 a
    device) that is neuron0 and neuron1, on trn2 (8 a device) neuron0 alone."""
    db = tmp_path / "w.db"
    trn1 = neuron_host(tmp_path, "trn1-a", trn1_stream())
    trn2 = neuron_host(tmp_path, "trn2-a", trn2_stream())
    finish(run_job(db, "mixed", trn1, "neuroncore:0-3"), run_job(db, "mixed", trn2, "neuroncore:0-3"))
    got = report(db, "mixed")
    seconds = window_s(db, "mixed")
    assert got["complete"], got["notes"]
    assert charged(got) == {
        "trn1-a": {
            "neuron0": pytest.approx(power_w(0) * seconds["trn1-a"], rel=0.01),
            "neuron1": pytest.approx(power_w(1) * seconds["trn1-a"], rel=0.01),
        },
        "trn2-a": {"neuron0": pytest.approx(power_w(0) * seconds["trn2-a"], rel=0.01)},
    }


S = 10**9
T0 = 1_767_225_600 * S


def test_samples_without_the_count_map_two_cores_a_device_and_say_so(tmp_path: Path) -> None:
    """Samples of an agent that did not store the count (older data): ``neuroncore:0-3`` is
    neuron0 and neuron1, as before, and the report says it assumed 2 NeuronCores a device."""
    batch = wire.Batch(stream_id="old", seq=1, sent_ns=T0)
    batch.host.host_id = "trn-old"
    for d in range(3):
        for i in range(12):
            batch.samples.add(
                source="neuron", component="accelerator", device=f"neuron{d}", quality=wire.QUALITY_MODEL,
                healthy=True, start_ns=T0 + i * S, end_ns=T0 + (i + 1) * S, energy_j=power_w(d),
                power_w=power_w(d), cumulative_j=power_w(d) * (i + 1),
            )  # fmt: skip
    b = EventBuilder(JobSpec("old-job", "old", "training", "steps", {}, [f"neuroncore:{c}" for c in range(4)]))
    batch.job_events.extend([b.open(T0 + S), b.close(0, T0 + 11 * S)])
    with SqliteStore(tmp_path / "w.db") as store:
        assert store.write(batch).rejected == 0
    got = report(tmp_path / "w.db", "old-job")
    assert charged(got) == {"trn-old": {"neuron0": power_w(0) * 10, "neuron1": power_w(1) * 10}}
    assert (
        "trn-old: its Neuron samples do not say how many NeuronCores a device has (an older agent); "
        "assumed 2 to map neuroncore claims to devices"
    ) in got["notes"]
