"""Jobs sharing one accelerator, end to end: each charged its measured share of it.

Two ``wattline run`` jobs (embedded sampling into one SQLite store) run on a stand-in GPU
through the real pynvml bindings. Each job's worker registers itself with the stand-in
driver like a CUDA process (``WATTLINE_NVML_PROCS``: a pid, SM and memory use, a time
window), and the stand-in's energy counter follows the wall clock: 0 W idle plus a known
power per SM percent of the processes running. So the truth is exact: over the window the
GPU draws ``W_PER_SM x (sm_a + sm_b)`` and job A's part is ``sm_a / (sm_a + sm_b)``.
A replayed neuron-monitor stream with two runtimes on one device does the same for Neuron.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nvml_stub.build import build_stub

from wattline.collector.stores.factory import open_store
from wattline.workloads.report import Report, build_report

GPU0 = "GPU-5a5a5a5a-0000-4000-8000-000000000000"
GPU1 = "GPU-6b6b6b6b-0000-4000-8000-000000000000"
W_PER_SM = 2.0  # W per SM percent
IDLE_GPU1_W = 50.0
REPLAY = Path(__file__).parent / "neuron_replay.py"

#: A process that registers itself with the stand-in driver on GPU ``argv[1]`` with SM
#: ``argv[2]`` % from ``argv[3]`` until ``argv[4]`` (Unix s), lives 1 s longer (a CUDA
#: process tearing down: its last use samples are read before it exits) and exits.
WORKER = """
import os, sys, time
gpu, sm, t0, t1, procs = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
with open(procs, "a") as f:
    f.write(f"{gpu} {os.getpid()} {sm} 10 {t0} {t1}\\n")
time.sleep(max(0.0, t1 - time.time()) + 1.0)
"""


def scenario(path: Path, epoch: float) -> Path:
    path.write_text(
        "driver 550.54.15\n"
        f"gpu {GPU0} NVIDIA H100 80GB HBM3\nenergy_model 0 {W_PER_SM} {epoch}\nsample_period_ms 100\n"
        "util 50:20\nmemory 85899345920:1073741824\nlimit 700000\n"
        # a second GPU that no job uses: idle power only
        f"gpu {GPU1} NVIDIA H100 80GB HBM3\nenergy_model {IDLE_GPU1_W} 0 {epoch}\nsample_period_ms 100\n"
        "util 0:0\nmemory 85899345920:0\nlimit 700000\n"
    )
    return path


def env_for(tmp_path: Path, epoch: float) -> dict[str, str]:
    return {
        **os.environ,
        "LD_LIBRARY_PATH": str(build_stub()),
        "WATTLINE_NVML_SCENARIO": str(scenario(tmp_path / "gpus.txt", epoch)),
        "WATTLINE_NVML_PROCS": str(tmp_path / "procs.txt"),
        "WATTLINE_USE_PERIOD_S": "0.5",
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }


def wattline_run(
    db: Path, job: str, source: str, command: list[str], env: dict[str, str], extra: list[str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "wattline.cli.main", "run", "--job", job, "--job-id", job, "--source", source,
         "--interval", "0.1", "--store", f"sqlite:///{db}", "--no-report", *(extra or []), "--", *command],
        env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def finish(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        _out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]


def worker(gpu: int, sm: float, t0: float, t1: float, procs: Path) -> list[str]:
    return [sys.executable, "-c", WORKER, str(gpu), str(sm), str(t0), str(t1), str(procs)]


def reports(db: Path, *jobs: str) -> dict[str, Report]:
    with open_store(f"sqlite:///{db}") as store:
        return {job: build_report(store, job) for job in jobs}  # type: ignore[arg-type]


def gpu_j(report: Report) -> float:
    return sum(w.components["gpu"].energy_j for w in (report.warmup, report.measured) if "gpu" in w.components)


def test_two_jobs_on_one_gpu_get_their_measured_shares(tmp_path: Path) -> None:
    """A (a grandchild of its `wattline run`, through sh) uses 60 % SM, B 20 %, both from T0
    to T1 on GPU 0: A gets 75 % and B 25 % of GPU 0's energy (all dynamic: 0 W idle) within
    1 %, neither is charged GPU 1 (no job's process used it; no --devices), and for GPU 0
    the span's energy = A + B + unattributed exactly."""
    t0 = time.time() + 4.0
    t1 = t0 + 6.0
    env = env_for(tmp_path, epoch=t0 - 100.0)
    db, procs = tmp_path / "w.db", tmp_path / "procs.txt"
    a = wattline_run(
        db, "job-a", "nvml", ["sh", "-c", " ".join(map(_q, worker(0, 60, t0, t1, procs))) + "; sleep 1"], env
    )
    b = wattline_run(db, "job-b", "nvml", worker(0, 20, t0, t1, procs), env)
    finish([a, b])
    got = reports(db, "job-a", "job-b")
    truth = W_PER_SM * 80 * (t1 - t0)  # GPU 0's energy, all of it in [T0, T1)
    assert gpu_j(got["job-a"]) == pytest.approx(0.75 * truth, rel=0.01)
    assert gpu_j(got["job-b"]) == pytest.approx(0.25 * truth, rel=0.01)
    for job in ("job-a", "job-b"):
        [ds] = got[job].device_shares  # GPU 0 only: GPU 1 was used by no process of the job
        assert (ds.device, ds.basis) == (GPU0, "measured share")
        assert ds.measured_j == pytest.approx(ds.energy_j, rel=1e-9)
        assert any("measured share" in n and "derived from utilization" in n for n in got[job].notes)
    da, db_ = got["job-a"].device_shares[0], got["job-b"].device_shares[0]
    assert da.span_energy_j == pytest.approx(db_.span_energy_j, rel=1e-9)
    assert da.span_energy_j == pytest.approx(truth, rel=0.01)
    assert math.isclose(da.span_energy_j, da.energy_j + db_.energy_j + da.unattributed_j, rel_tol=1e-9)


def test_a_job_whose_process_vanishes_is_charged_only_while_it_used_the_gpu(tmp_path: Path) -> None:
    """The job's worker uses 30 % SM from T0 to T1 and exits; the job runs on 3 s. A process
    of no job uses 10 % from T0 to T2: the job gets 75 % of [T0, T1), nothing after, and the
    stranger's part stays unattributed (never charged to the job)."""
    t0 = time.time() + 3.0
    t1, t2 = t0 + 4.0, t0 + 7.0
    env = env_for(tmp_path, epoch=t0 - 100.0)
    db, procs = tmp_path / "w.db", tmp_path / "procs.txt"
    stranger = subprocess.Popen(worker(0, 10, t0, t2, procs), env=env)
    job = wattline_run(
        db, "job-v", "nvml", ["sh", "-c", " ".join(map(_q, worker(0, 30, t0, t1, procs))) + "; sleep 3"], env
    )
    finish([job])
    stranger.wait(timeout=30)
    got = reports(db, "job-v")["job-v"]
    during = W_PER_SM * 40 * (t1 - t0)
    assert gpu_j(got) == pytest.approx(0.75 * during, rel=0.01)
    [ds] = got.device_shares
    assert ds.unattributed_j == pytest.approx(ds.span_energy_j - ds.energy_j, rel=1e-9)
    assert ds.unattributed_j >= 0.25 * during * 0.99  # the stranger's part, and its time alone


def _q(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


#: A Neuron runtime process: maps recorded runtime pid ``argv[1]`` to itself in the replay's
#: pid map ``argv[2]``, runs ``argv[3]`` seconds, exits.
RUNTIME = """
import os, sys, time
with open(sys.argv[2], "a") as f:
    f.write(f"{sys.argv[1]} {os.getpid()}\\n")
time.sleep(float(sys.argv[3]))
"""


def two_runtime_stream(path: Path) -> Path:
    """The recorded trn1.2xlarge report 2 (one device, two NeuronCores) with two runtimes:
    pid 7001 keeps NeuronCore 0 busy 60 %, pid 7002 NeuronCore 1 20 %: of the device
    (30 % + 10 %), 7001 has 75 % of the use, 7002 25 %."""
    recorded = Path(__file__).parent / "fixtures/neuron/trn1.2xlarge_wandb_stream.ndjson"
    report = json.loads(recorded.read_text().splitlines()[1])
    base = report["neuron_runtime_data"][0]
    runtimes = []
    for pid, core, pct in ((7001, "0", 60.0), (7002, "1", 20.0)):
        rt = json.loads(json.dumps(base))
        rt["pid"], rt["neuron_runtime_tag"] = pid, str(pid)
        rt["report"]["neuroncore_counters"]["neuroncores_in_use"] = {core: {"neuroncore_utilization": pct}}
        runtimes.append(rt)
    report["neuron_runtime_data"] = runtimes
    path.write_text(json.dumps(report) + "\n")
    return path


def test_two_neuron_runtimes_on_one_device_split_it_by_their_neuroncore_use(tmp_path: Path) -> None:
    """Two jobs, each a process that neuron-monitor (the replayed stream) reports as a runtime
    on neuron0: job A's runtime has 75 % of the device's NeuronCore use, B's 25 %. Each job is
    charged that share of the device's energy over the time its use was measured (within
    1 %), labelled a measured share, and A + B + unattributed = the device's energy."""
    pid_map = tmp_path / "pids.txt"
    config = tmp_path / "wattline.toml"
    path_env = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    config.write_text(
        "[sources.neuron]\n"
        f'monitor_path = "{REPLAY}"\n'
        'monitor_args = ["--period", "0.1"]\n'
        f'monitor_env = {{ PATH = "{path_env}", NEURON_REPLAY_FILE = "{two_runtime_stream(tmp_path / "s.ndjson")}", '
        f'NEURON_REPLAY_PID_MAP = "{pid_map}" }}\n'
        "period_s = 0.1\n"
        'device_type = "trn1"\n'
    )
    root = tmp_path / "host"
    power = root / "sys/devices/virtual/neuron_device/neuron0/stats/power/utilization"
    power.parent.mkdir(parents=True)
    (root / "sys/devices/virtual/neuron_device/neuron0/info/architecture").mkdir(parents=True)
    power.write_text(f"POWER_STATUS_VALID,{int(time.time()) // 60 * 60},10.00,30.00,20.00\n")
    env = {**os.environ, "WATTLINE_USE_PERIOD_S": "0.5", "XDG_STATE_HOME": str(tmp_path / "state")}
    db = tmp_path / "w.db"
    extra = ["--config", str(config), "--sysfs-root", str(root)]
    jobs = [
        wattline_run(db, job, "neuron", [sys.executable, "-c", RUNTIME, rec, str(pid_map), "6"], env, extra)
        for job, rec in (("job-a", "7001"), ("job-b", "7002"))
    ]
    finish(jobs)
    got = reports(db, "job-a", "job-b")
    with open_store(f"sqlite:///{db}") as store:
        for job, share in (("job-a", 0.75), ("job-b", 0.25)):
            uses = [e for e in store.job_events(job) if e.event == "use"]
            assert uses and all(e.fields["device"] == "neuron:0" for e in uses)
            ratios = [e.fields["job_use"] / e.fields["device_use"] for e in uses]
            # the first period may begin before the process became the runtime (the pid map)
            assert ratios[0] <= share * 1.01 and ratios[1:] == pytest.approx([share] * (len(ratios) - 1), rel=0.01)
            [ds] = got[job].device_shares
            assert (ds.device, ds.basis) == ("neuron0", "measured share")
            window_s = (got[job].end_ns - got[job].job.start_ns) / 1e9
            power_w = ds.device_energy_j / window_s  # the model's power is constant here
            expected = sum(r * e.fields["period_ns"] / 1e9 * power_w for r, e in zip(ratios, uses, strict=True))
            assert ds.energy_j == pytest.approx(expected, rel=0.01)
            assert ds.energy_j == pytest.approx(share * ds.device_energy_j, rel=0.1)
    da, db_ = got["job-a"].device_shares[0], got["job-b"].device_shares[0]
    assert math.isclose(da.span_energy_j, da.energy_j + db_.energy_j + da.unattributed_j, rel_tol=1e-9)
