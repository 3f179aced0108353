"""NvmlSource against the stand-in's unkind scenarios (tests/nvml_stub/UNKIND.md): what real
drivers do that NVML's documentation does not promise, each a statement of the scenario file.

Each case runs in a fresh interpreter with the stand-in first on the loader path (pynvml
loads ``libnvidia-ml.so.1`` once per process) and prints JSON.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from nvml_stub.build import build_stub

from wattline.reports.build import build_report
from wattline.stores.factory import open_store

GPU0 = "GPU-9e9e9e9e-0000-4000-8000-000000000000"

#: This process uses 40 % SM and 12 % memory of GPU 0 from 2 s ago; asks process_use twice
#: (the second time lastSeen is a real stamp, so stale samples can be older than it).
QUIRKS = r"""
import json, os, sys, time
import pynvml as nv
from wattline.agent.sources.nvml import NvmlSource
procs, now = sys.argv[1], time.time()
with open(procs, "w") as f:
    f.write(f"0 {os.getpid()} 40 12 {now - 2.0} -\n")
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
raw = nv.nvmlDeviceGetProcessUtilization(h, int((now - 1.0) * 1e6))
out = {"raw": sorted([s.pid, s.smUtil, s.memUtil] for s in raw)}
nv.nvmlShutdown()
src = NvmlSource()
src.discover()
out["uses"] = []
for since in (int((now - 1.0) * 1e6), None):
    time.sleep(0.3)
    [use] = src.process_use(since_us=since)
    out["uses"].append({"metric": use.metric, "use": {str(k): v for k, v in use.use.items()}})
out["dropped"] = src.details().get("dropped_samples", {})
src.close()
out["pid"] = os.getpid()
print(json.dumps(out))
"""


def run_script(script: str, tmp_path: Path, scenario: str, *args: str) -> dict[str, Any]:
    (tmp_path / "gpus.txt").write_text(scenario)
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=str(build_stub()),
        WATTLINE_NVML_SCENARIO=str(tmp_path / "gpus.txt"),
        WATTLINE_NVML_PROCS=str(tmp_path / "procs.txt"),
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "procs.txt"), *args],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out: dict[str, Any] = json.loads(done.stdout)
    out["stderr"] = done.stderr
    return out


def test_process_utilization_as_drivers_answer_it_gives_each_process_its_own_use(tmp_path: Path) -> None:
    """The size query answers the buffer size (zero entries after the samples), each process
    also has a sample stamped before lastSeen and an older one after it, and there is a
    pid 0 sample and a zombie at 250 % (the stand-in's default: no statement asks for them):
    the process's use is still its 40 % SM, the only entry, at both asks; each kind of
    left-out sample is counted, and logged once."""
    out = run_script(QUIRKS, tmp_path, f"gpu {GPU0} NVIDIA H100 80GB HBM3\nenergy 1000\nsample_period_ms 100\n")
    pid = out["pid"]
    # the stand-in really is unkind: a 100-entry buffer, mostly zeros, with the extras
    assert len(out["raw"]) == 100
    assert [pid, 40, 12] in out["raw"] and [0, 37, 0] in out["raw"] and [4194305, 250, 0] in out["raw"]
    assert out["uses"] == [{"metric": "sm", "use": {str(pid): 40.0}}] * 2
    dropped = out["dropped"][GPU0]
    assert set(dropped) == {"pid 0", "stamped at or before lastSeenTimeStamp", "over 100 %", "older sample of its pid"}
    assert dropped["stamped at or before lastSeenTimeStamp"] >= 1  # the second ask's
    assert out["stderr"].count("left out (over 100 %)") == 1


#: GPU 0 draws 100 W since its model's epoch; on GPU 1 this process has used 50 % SM (2 W
#: per percent) since half a second ago. Reads GPU 0's counter and GPU 1's power at a few
#: instants, then GPU 1's process samples.
DEFAULTS = r"""
import json, os, sys, time
import pynvml as nv
procs, now = sys.argv[1], time.time()
with open(procs, "w") as f:
    f.write(f"1 {os.getpid()} 50 0 {now - 0.5!r} -\n")
nv.nvmlInit()
h0, h1 = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)
reads = []
for _ in range(5):
    t = time.time()
    reads.append([t, nv.nvmlDeviceGetTotalEnergyConsumption(h0), nv.nvmlDeviceGetPowerUsage(h1)])
    time.sleep(0.037)
samples = nv.nvmlDeviceGetProcessUtilization(h1, 0)
print(json.dumps({"reads": reads, "samples": len(samples), "pid0": any(s.pid == 0 and s.smUtil for s in samples)}))
nv.nvmlShutdown()
"""


@pytest.mark.parametrize("kind", [False, True])
def test_the_stand_in_is_unkind_unless_told_kind(kind: bool, tmp_path: Path) -> None:
    """With no statement about them, a GPU's counter steps every 100 ms (a read is the energy
    up to the last step, on the 0.1 s grid of Unix time), its power reading is a 1 s average
    (a load that began 0.5 s ago shows about half) and its process samples come padded, with
    pid 0 among them; ``kind`` gives NVML's documented answers (the energy now, the power now,
    one sample per process)."""
    epoch = float(int(time.time()) - 10)
    scenario = (
        f"gpu {GPU0} NVIDIA H100 80GB HBM3\nenergy_model 100 0 {epoch}\n{'kind' if kind else ''}\n"
        f"gpu {GPU_SENSED} NVIDIA H100 80GB HBM3\nenergy ns\nenergy_model 0 2 {epoch}\n{'kind' if kind else ''}\n"
    )
    out = run_script(DEFAULTS, tmp_path, scenario)
    for t, energy_mj, power_mw in out["reads"]:  # t: just before the reads
        counted_to = epoch + energy_mj / 1e5  # 100 W: 1e5 mJ a second
        if kind:
            assert t - 1e-4 <= counted_to <= t + 0.01, (t, counted_to)
            assert power_mw == pytest.approx(100_000, abs=1)
        else:
            assert t - 0.1 - 1e-4 <= counted_to <= t + 0.01, (t, counted_to)
            assert abs(counted_to / 0.1 - round(counted_to / 0.1)) < 1e-3, counted_to  # on the 0.1 s grid
            assert 30_000 <= power_mw <= 75_000, power_mw  # 0.5-0.7 s of the last 1 s at 100 W
    assert (out["samples"], out["pid0"]) == ((1, False) if kind else (100, True))


#: A holder of a job (the job: this process, 20 % SM from 1 s ago) that had no job, so asked
#: nothing, at its previous ask 1 s ago; another process (no job's, the parent) used the GPU
#: fully from 4 s to 1.5 s ago: the driver still holds its samples.
FIRST_ASK = r"""
import json, os, sys, time
from wattline.agent.usage.process_use import UseTallies
from wattline.agent.sources.nvml import NvmlSource
procs, now = sys.argv[1], time.time()
with open(procs, "w") as f:
    f.write(f"0 {os.getppid()} 100 0 {now - 4.0} {now - 1.5}\n0 {os.getpid()} 20 0 {now - 1.0} -\n")
src = NvmlSource()
src.discover()
tallies, job_of = UseTallies(), {os.getpid(): "job"}.get
tallies.sample([], job_of, int((now - 1.0) * 1e9))
asked = time.time_ns()
tallies.sample([src], job_of, asked)
[t] = tallies.take("job").values()
print(json.dumps({"mine": t.mine, "total": t.total, "dt": asked - int((now - 1.0) * 1e9)}))
src.close()
"""


def test_a_holders_first_ask_after_having_no_job_counts_only_its_period(tmp_path: Path) -> None:
    """The pod and Slurm watchers ask no source while they have no job; the first ask after
    that must not count what the driver still holds from before (its last 100 samples,
    5 s at 50 ms): the job's 20 % is all the GPU's use over the period, not diluted into a
    mean over 5 s beside another process's 100 % that ended before the period (on the old
    code 4 of 54 %: a job's share 7 % for 100 %)."""
    out = run_script(FIRST_ASK, tmp_path, f"gpu {GPU0} NVIDIA H100 80GB HBM3\nenergy 1000\nsample_period_ms 50\n")
    assert out["total"] == out["mine"] > 0  # the job's use is all the GPU's over the period
    assert out["mine"] / out["dt"] == pytest.approx(20.0, abs=1.5)  # its mean, not diluted


#: Discovery notes and one process_use() of GPU 0.
NOTES_AND_USE = r"""
import json, sys
from wattline.agent.sources.nvml import NvmlSource
src = NvmlSource()
src.discover()
[use] = src.process_use(since_us=0)
print(json.dumps({"notes": [n.text for n in src.notes], "supported": use.supported, "use": use.use}))
src.close()
"""


def test_a_caller_without_privileges_is_told_in_one_line_and_its_mig_jobs_are_not_charged_zero(tmp_path: Path) -> None:
    """Drivers refuse an unprivileged caller (a container) a MIG instance's memory and the
    parent's process list: discovery says so in one note, and the GPU's per-process use is
    unsupported (the job is charged it by its claims), not an empty use that would charge a
    job on that instance nothing."""
    out = run_script(
        NOTES_AND_USE,
        tmp_path,
        f"gpu {GPU0} NVIDIA A100-SXM4-80GB\nenergy 1000 2000\nutil ns\nmemory 85899345920:0\nmig 1 7\nunprivileged\n"
        "mig_device 0 MIG-11111111-0000-4000-8000-000000000000 3 20937965568 0\n",
    )
    [refused] = [n for n in out["notes"] if "Insufficient Permissions" in n]
    assert "MIG instance memory" in refused and "charged by their claims" in refused
    assert (out["supported"], out["use"]) == (False, {})
    assert "Traceback" not in out["stderr"]


def test_init_refused_is_one_line(tmp_path: Path) -> None:
    """nvmlInit refused (NVML_ERROR_NO_PERMISSION: device nodes the caller may not open):
    `wattline sources` says so in one line and goes on."""
    (tmp_path / "gpus.txt").write_text("init_error 4\n")
    env = dict(os.environ, LD_LIBRARY_PATH=str(build_stub()), WATTLINE_NVML_SCENARIO=str(tmp_path / "gpus.txt"))
    done = subprocess.run(
        [sys.executable, "-m", "wattline.cli.main", "sources", "--source", "nvml"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("nvml")]
    assert lines == ["nvml       absent    NVML initialisation failed: Insufficient Permissions"], (
        done.stdout + done.stderr
    )
    assert "Traceback" not in done.stderr


GPU_SENSED = "GPU-7c7c7c7c-0000-4000-8000-000000000000"
IDLE_W, W_PER_SM, SM = 60.0, 2.0, 50.0
#: The stand-in's sensing (``power_sensing 100 25 1000``): every UPDATE_S it publishes the
#: mean of the power it sensed over the first WINDOW_S of each UPDATE_S whose window ended
#: in the last AVERAGE_S; wattline samples that reading every INTERVAL_S.
UPDATE_S, WINDOW_S, AVERAGE_S, INTERVAL_S = 0.1, 0.025, 1.0, 0.1
#: The integrated figure's bound at most this many times the most the lag can make (see the test).
BOUND_CAP = 3.0
#: The job's command: as it starts it puts SM % on GPU 0 until 3 s later, and SM % more from
#: 2.5 s (a step half a second before it exits); it exits when they end.
LOAD = r"""
import os, sys, time
now, pid, sm = time.time(), os.getpid(), float(sys.argv[2])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"0 {pid} {sm} 10 {now!r} {now + 3.0!r}\n0 {pid} {sm} 10 {now + 2.5!r} {now + 3.0!r}\n")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(max(0.0, now + 3.0 - time.time()))
"""

Load = tuple[float, float, float]  # SM percent, from, until (Unix s)


def model_j(loads: Sequence[Load], lo: float, hi: float) -> float:
    """The GPU's energy over ``[lo, hi]`` as the scenario's model draws it."""
    return IDLE_W * (hi - lo) + sum(W_PER_SM * sm * max(0.0, min(b, hi) - max(a, lo)) for sm, a, b in loads)


def sensed_w(loads: Sequence[Load], t: float) -> float:
    """The stand-in's power reading at ``t`` (``model_power_w`` with power_sensing): the mean
    of the sensed windows that ended in the AVERAGE_S before its last update."""
    last = math.floor(t / UPDATE_S) * UPDATE_S
    k = math.floor((last - WINDOW_S) / UPDATE_S)
    means = []
    while k * UPDATE_S + WINDOW_S > last - AVERAGE_S:
        means.append(model_j(loads, k * UPDATE_S, k * UPDATE_S + WINDOW_S) / WINDOW_S)
        k -= 1
    return math.fsum(means) / len(means)


def sensed_j(loads: Sequence[Load], lo: float, hi: float) -> tuple[float, float]:
    """The integral of the reading over ``[lo, hi]`` (it holds between two updates) and how
    far it moves there in all (the sum of its changes, W)."""
    edges = [lo, *(u * UPDATE_S for u in range(math.floor(lo / UPDATE_S) + 1, math.ceil(hi / UPDATE_S))), hi]
    levels = [sensed_w(loads, (a + b) / 2) for a, b in itertools.pairwise(edges)]
    moved = math.fsum(abs(b - a) for a, b in itertools.pairwise(levels))
    return math.fsum(w * (b - a) for w, (a, b) in zip(levels, itertools.pairwise(edges), strict=True)), moved


def lag_j(loads: Sequence[Load], lo: float, hi: float) -> float:
    """The most the reading's lag can make over ``[lo, hi]``, whatever reads it: each step of
    the load in there shows in full at most AVERAGE_S + UPDATE_S after it, so it is missed for
    at most that long (or until ``hi``)."""
    steps = [(W_PER_SM * sm, t) for sm, a, b in loads for t in (a, b) if lo < t < hi]
    return math.fsum(w * min(hi - t, AVERAGE_S + UPDATE_S) for w, t in steps)


def test_power_sensed_part_time_and_averaged_is_within_the_integrated_bound(tmp_path: Path) -> None:
    """A GPU whose driver offers no energy counter: wattline integrates
    ``nvmlDeviceGetPowerUsage``, on A100/H100 a 1 s average of power sensed 25 ms in every
    100 ms (UNKIND.md). The load steps up as the job starts and again 0.5 s before it ends,
    where a lagging average errs most. Both figures the job's GPU energy is checked against
    come from the scenario: the truth, the model's energy over the stored open and close; and
    the reading the stand-in gives, integrated over that window (what the lag makes of the
    truth). An ``integrated`` figure is the readings' integral (a
    figure that corrected the lag would be a model): it lies within what integrating 0.1 s
    samples of a reading that moves in 0.1 s steps can add of the readings' (each change of
    the reading x 1.5 sample intervals). The report's bound holds the truth, and is at most
    BOUND_CAP x the most the lag can make (each step x the 1.1 s until the reading shows it
    in full): the term charges the highest power the samples show, idle included, for a
    second at each edge, where the lag errs by the steps alone."""
    procs = tmp_path / "procs.txt"
    (tmp_path / "gpus.txt").write_text(
        f"driver 550.54.15\ngpu {GPU_SENSED} NVIDIA H100 80GB HBM3\nenergy ns\ninstant ns\n"
        f"energy_model {IDLE_W} {W_PER_SM} {time.time() - 60}\n"
        f"power_sensing {UPDATE_S * 1000:g} {WINDOW_S * 1000:g} {AVERAGE_S * 1000:g}\n"
        "util 50:20\nmemory 85899345920:1073741824\nlimit 700000\n"
    )
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=str(build_stub()),
        WATTLINE_NVML_SCENARIO=str(tmp_path / "gpus.txt"),
        WATTLINE_NVML_PROCS=str(procs),
        XDG_STATE_HOME=str(tmp_path / "state"),
    )
    db = f"sqlite:///{tmp_path / 'w.db'}"
    done = subprocess.run(
        [sys.executable, "-m", "wattline.cli.main", "run", "--job-id", "sensed", "--source", "nvml",
         "--interval", f"{INTERVAL_S:g}", "--store", db, "--no-report", "--",
         sys.executable, "-c", LOAD, str(procs), str(SM)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    with open_store(db) as store:
        report = build_report(store, "sensed")  # type: ignore[arg-type]
        stamps = {e.event: e.time_ns / 1e9 for e in store.job_events("sensed")}  # type: ignore[attr-defined]
    opened, closed = stamps["open"], stamps["close"]
    loads = [(float(sm), float(a), float(b)) for _g, _pid, sm, _m, a, b in (line.split() for line in procs.open())]
    truth = model_j(loads, opened, closed)
    sensed, moved = sensed_j(loads, opened, closed)
    windows = [w.components["gpu"] for w in (report.warmup, report.saturated_window) if "gpu" in w.components]
    figure, bound = sum(c.energy_j for c in windows), sum(c.bound.total_j for c in windows)
    assert {q for c in windows for q in c.by_quality} == {"integrated"}
    assert all(c.bound.integration_j > 0 for c in windows if c.energy_j > 0)
    # a sample holds a reading read somewhere in its interval (its stamp follows the read) and
    # the trapezoid spreads a change of it over the interval: each change lands at most 1.5
    # intervals from where it happened
    sampling = moved * 1.5 * INTERVAL_S
    assert abs(figure - sensed) <= sampling, (
        f"{figure:.1f} J: the stand-in's reading over the window is {sensed:.1f} J (the truth {truth:.1f} J)"
    )
    error, lag = abs(figure - truth), lag_j(loads, opened, closed)
    assert abs(truth - sensed) <= lag  # (the scenario's own arithmetic)
    assert error <= bound, (
        f"{figure:.1f} J is {error:.1f} J off the truth {truth:.1f} J, outside its bound {bound:.1f} J"
    )
    assert bound <= BOUND_CAP * lag, f"bound {bound:.1f} J > {BOUND_CAP} x the {lag:.1f} J the lag can make"
