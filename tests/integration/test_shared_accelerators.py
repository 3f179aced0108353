"""Jobs sharing one accelerator, end to end: each charged its share of it by use.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from nvml_stub.build import build_stub

from wattline import wire
from wattline.accounting.attribution import (
    Attribution,
    ChannelEnergy,
    JobWindow,
    UseInterval,
    UseTimeline,
    split_shared,
)
from wattline.accounting.device_shares import use_timelines
from wattline.accounting.window_energy import Interval
from wattline.collector.server import CollectorServer
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.quality import Quality
from wattline.reports.build import build_report
from wattline.reports.model import Report
from wattline.reports.report_json import report_json
from wattline.stores.factory import open_store
from wattline.stores.lineprotocol import LineProtocolError, job_event_point

GPU0 = "GPU-5a5a5a5a-0000-4000-8000-000000000000"
GPU1 = "GPU-6b6b6b6b-0000-4000-8000-000000000000"
W_PER_SM = 2.0  # W per SM percent
IDLE_GPU1_W = 50.0
REPLAY = Path(__file__).parents[1] / "helpers" / "neuron_replay.py"

#: A GPU process: says its pid (``argv[1]`` tag, to ``argv[2]``), waits for the go file
#: ``argv[3]`` (tag -> end of its use, Unix s), lives 1 s past its use (a CUDA process
#: tearing down: its last use samples are read before it exits) and exits. The test, once
#: every process is up, writes their use windows to the stand-in's procs file and the go file:
#: start-up time (a busy machine) never moves the truth.
WORKER = """
import json, os, sys, time
tag, pids, go = sys.argv[1:4]
with open(pids, "a") as f:
    f.write(f"{tag} {os.getpid()}\\n")
while not os.path.exists(go):
    time.sleep(0.02)
time.sleep(max(0.0, json.loads(open(go).read())[tag] - time.time()) + 1.0)
"""


def worker(tag: str, tmp_path: Path) -> list[str]:
    return [sys.executable, "-c", WORKER, tag, str(tmp_path / "pids.txt"), str(tmp_path / "go.json")]


def go(
    tmp_path: Path,
    plan: dict[str, tuple[float, float, float]],
    procs: Sequence[subprocess.Popen[str]] = (),
    lead_s: float = 1.0,
    gpu: str = "0",
) -> float:
    """Once every tag of ``plan`` (tag -> SM percent on GPU 0, start, end in s from T0) said
    its pid: T0 = now + ``lead_s``; writes the use windows and the go file; returns T0.
    Fails at once, with its stderr, when one of ``procs`` (the jobs) ended before."""
    pids_file, deadline = tmp_path / "pids.txt", time.monotonic() + 120
    while True:
        pids = dict(line.split() for line in pids_file.read_text().splitlines()) if pids_file.exists() else {}
        if set(plan) <= set(pids):
            break
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a job ended before its process started: {p.communicate()[1][-2000:]}")
        assert time.monotonic() < deadline, f"processes never started: {sorted(set(plan) - set(pids))}"
        time.sleep(0.05)
    t0 = time.time() + lead_s
    lines = "".join(f"{gpu} {pids[tag]} {sm} 10 {t0 + a} {t0 + b}\n" for tag, (sm, a, b) in plan.items())
    tmp = tmp_path / "procs.tmp"
    tmp.write_text(lines)
    tmp.replace(tmp_path / "procs.txt")
    (tmp_path / "go.tmp").write_text(json.dumps({tag: t0 + b for tag, (_sm, _a, b) in plan.items()}))
    (tmp_path / "go.tmp").replace(tmp_path / "go.json")
    return t0


#: The stand-in is as unkind as the hardware by default (tests/nvml_stub/UNKIND.md): GPU 0's
#: counter steps every STEP_S (here at a phase of its own), and its per-process utilization
#: comes padded to the driver's buffer, with stale samples, pid 0, a zombie at 250 % and
#: duplicate pids. KIND: NVML's documented semantics, for the test of them.
STEP_S = 0.1
UNKIND = f"energy_step_ms {STEP_S * 1000:g} 37\nprocess_quirks pad stale pid0 over100 dup\n"
KIND = "kind\n"


def scenario(path: Path, epoch: float, unkind: bool = True) -> Path:
    path.write_text(
        "driver 550.54.15\n"
        f"gpu {GPU0} NVIDIA H100 80GB HBM3\nenergy_model 0 {W_PER_SM} {epoch}\nsample_period_ms 10\n"
        f"{UNKIND if unkind else KIND}"
        "util 50:20\nmemory 85899345920:1073741824\nlimit 700000\n"
        # a second GPU that no job uses: idle power only
        f"gpu {GPU1} NVIDIA H100 80GB HBM3\nenergy_model {IDLE_GPU1_W} 0 {epoch}\nsample_period_ms 100\n"
        "util 0:0\nmemory 85899345920:0\nlimit 700000\n"
    )
    return path


def env_for(tmp_path: Path, epoch: float, unkind: bool = True) -> dict[str, str]:
    return {
        **os.environ,
        "LD_LIBRARY_PATH": str(build_stub()),
        "WATTLINE_NVML_SCENARIO": str(scenario(tmp_path / "gpus.txt", epoch, unkind)),
        "WATTLINE_NVML_PROCS": str(tmp_path / "procs.txt"),
        "WATTLINE_USE_PERIOD_S": "0.5",
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }


def wattline_run(
    db: Path, job: str, source: str, command: list[str], env: dict[str, str], extra: list[str] | None = None
) -> subprocess.Popen[str]:
    if not db.exists():  # created once, before concurrent runs open it
        open_store(f"sqlite:///{db}").close()
    return subprocess.Popen(
        [sys.executable, "-m", "wattline.cli.main", "run", "--job", job, "--job-id", job, "--source", source,
         "--interval", "0.1", "--store", f"sqlite:///{db}", "--no-report", *(extra or []), "--", *command],
        env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def finish(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        _out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]


def reports(db: Path, *jobs: str) -> dict[str, Report]:
    with open_store(f"sqlite:///{db}") as store:
        return {job: build_report(store, job) for job in jobs}  # type: ignore[arg-type]


def gpu_j(report: Report) -> float:
    return sum(w.components["gpu"].energy_j for w in (report.warmup, report.saturated_window) if "gpu" in w.components)


def gpu_bound_j(report: Report) -> float:
    """The report's own bound (J) on the job's GPU energy, both windows."""
    return sum(
        w.components["gpu"].bound.total_j for w in (report.warmup, report.saturated_window) if "gpu" in w.components
    )


#: A bound wider than this many times the error a scenario constructs is a defect too: it
#: would hold any figure. (The bound takes its power from the samples, which a stepping
#: counter shows at up to twice the truth; each of the two windows has its own two edges.)
BOUND_CAP = 4.0


def holds(figure: float, truth: float, bound: float, constructed: float) -> None:
    """Two-sided: ``figure`` within ``bound`` of ``truth``, and ``bound`` at most
    :data:`BOUND_CAP` x ``constructed``, the error the scenario's unkindness can make."""
    error = abs(figure - truth)
    assert error <= bound, (
        f"{figure:.2f} J is {error:.2f} J off the truth {truth:.2f} J, outside its bound {bound:.2f} J"
    )
    assert bound <= BOUND_CAP * constructed, f"bound {bound:.2f} J > {BOUND_CAP} x the {constructed:.2f} J constructed"


def within_stored_window(db: Path, job: str, start: float, end: float) -> tuple[float, float]:
    """``[start, end]`` (Unix s) cut to the job's window as its stored open and close events
    give it: the truth's time, never the report's."""
    with open_store(f"sqlite:///{db}") as store:
        events = store.job_events(job)  # type: ignore[attr-defined]
    [opened] = [e.time_ns / 1e9 for e in events if e.event == "open"]
    [closed] = [e.time_ns / 1e9 for e in events if e.event == "close"]
    assert opened < closed
    return max(start, opened), min(end, closed)


def spread_j(power_w: float, d_s: float, interval_s: float) -> float:
    """The most energy apportioning moves out of a job's use periods at one end: power
    ``power_w`` starts ``d_s`` after the first use period's start U0 (or stops ``d_s`` before
    the last one's end); a sample of ``interval_s`` straddling U0 with x s before it holds
    p (interval - x - d) J and spreads the fraction x / interval of it before U0: at most
    p (interval - d)² / (4 interval)."""
    return power_w * max(0.0, interval_s - d_s) ** 2 / (4 * interval_s)


#: The wrappers ask every 0.5 s here (WATTLINE_USE_PERIOD_S 0.5): a process that starts or
#: ends between two asks leaves that ask's split unsure (the bound's split term).
ASK_S = 0.5


def changes_j(power_w: float, share: float, changes: int = 2) -> float:
    """The most the split can be off where a job's part of the device changes by ``share``
    ``changes`` times: each change lies somewhere in one ask at ``power_w``."""
    return changes * ASK_S * power_w * share


def stepping_j(power_w: float, windows: int = 2) -> float:
    """The most a counter stepping every STEP_S can be off over ``windows`` windows at
    ``power_w``: a read at each edge lags the truth by up to one step."""
    return windows * 2 * power_w * STEP_S


#: How long the two jobs' processes use GPU 0 together: long enough that a split 3 points
#: off (72/28 for 75/25) is more than :func:`misfit_j` allows at the two changes.
TOGETHER_S = 20.0
#: The wrappers' energy samples (--interval): a sample's energy is spread evenly over it.
INTERVAL_S = 0.1


def misfit_j(power_w: float, sm_mine: float, sm_other: float, changes: int = 2) -> float:
    """The most a split by rate (use_split: each job at its own period's mean) can be off for
    a job using ``sm_mine`` beside another job using ``sm_other`` when both their processes
    start (and end) together at a ``power_w`` device and every period either holder records
    reads their ratio, at each of ``changes``:

    - after a change, until both holders have asked (one ask each), a job's period that saw
      its process for a fraction f of it has the rate ``sm x f``: on the piece before the
      earlier ask both are partial, on the one until the later ask one is; the largest error
      of the two pieces over every f and g, x the power x ASK_S;
    - the counter lags by up to a step, and a sample's energy is spread evenly over it: a
      joule lands up to STEP_S + INTERVAL_S from where it was drawn, where a job's weight may
      be anything, so off by at most the larger of its share and the other's."""
    share, grid = sm_mine / (sm_mine + sm_other), [i / 200 for i in range(1, 201)]

    def off(f: float, g: float) -> float:  # f, g: the parts of the two asks that saw the processes
        both = sm_mine * f / (sm_mine * f + sm_other * g)
        one = sm_mine / (sm_mine + sm_other * g) if f < g else sm_mine * f / (sm_mine * f + sm_other)
        return min(f, g) * abs(both - share) + abs(f - g) * abs(one - share)

    rates = max(off(f, g) for f in grid for g in grid)
    return changes * power_w * (ASK_S * rates + (STEP_S + INTERVAL_S) * max(share, 1 - share))


def test_two_jobs_on_one_gpu_get_their_measured_shares(tmp_path: Path) -> None:
    """A (a grandchild of its `wattline run`, through sh) uses 60 % SM, B 20 %, both from T0
    to T1 (TOGETHER_S) on GPU 0: A gets 75 % and B 25 % of GPU 0's energy (all dynamic: 0 W
    idle), each within :func:`misfit_j` of its truth (less than a 72/28 split is off by),
    neither is charged GPU 1 (no job's process used it; no --devices), and for GPU 0
    the span's energy = A + B + unattributed exactly."""
    env = env_for(tmp_path, epoch=time.time() - 100.0)
    db = tmp_path / "w.db"
    a = wattline_run(db, "job-a", "nvml", ["sh", "-c", " ".join(map(_q, worker("a", tmp_path))) + "; sleep 1"], env)
    b = wattline_run(db, "job-b", "nvml", worker("b", tmp_path), env)
    t0 = go(tmp_path, {"a": (60, 0.0, TOGETHER_S), "b": (20, 0.0, TOGETHER_S)}, [a, b])
    t1 = t0 + TOGETHER_S
    finish([a, b])
    got = reports(db, "job-a", "job-b")
    truth = W_PER_SM * 80 * (t1 - t0)  # GPU 0's energy, all of it in [T0, T1)
    for job, sm, other in (("job-a", 60, 20), ("job-b", 20, 60)):
        share = sm / (sm + other)
        start, end = within_stored_window(db, job, t0, t1)
        mine = share * W_PER_SM * 80 * (end - start)
        assert abs(gpu_j(got[job]) - mine) <= misfit_j(W_PER_SM * 80, sm, other), (job, gpu_j(got[job]), mine)
        holds(
            gpu_j(got[job]),
            mine,
            gpu_bound_j(got[job]),
            share * stepping_j(W_PER_SM * 80) + changes_j(W_PER_SM * 80, share),
        )
    for job in ("job-a", "job-b"):
        [ds] = got[job].device_shares  # GPU 0 only: GPU 1 was used by no process of the job
        assert (ds.device, ds.basis) == (GPU0, "measured share")
        assert ds.split_by_use_j == pytest.approx(ds.energy_j, rel=1e-9)
        assert any("measured share" in n and "derived from utilization" in n for n in got[job].notes)
        # the split's own term, per device and in the bound: the processes came and went
        # between two of the wrapper's asks, and the note says what it is for
        windows = (got[job].warmup, got[job].saturated_window)
        split_j = sum(w.components["gpu"].bound.split_j for w in windows if "gpu" in w.components)
        assert ds.split_bound_j == pytest.approx(split_j, rel=1e-9) and split_j > 0
        assert any(f"± {split_j:.1f} J where processes started or ended" in n for n in got[job].notes)
        split = report_json(got[job])["measured"]["coverage"]["split_by_use_fraction"]
        assert split == pytest.approx(gpu_j(got[job]) / (got[job].saturated_window.energy_j + got[job].warmup.energy_j))
    da, db_ = got["job-a"].device_shares[0], got["job-b"].device_shares[0]
    assert da.span_energy_j == pytest.approx(db_.span_energy_j, rel=1e-9)
    # the span's edges are the counter's reads: each lags by up to a step (the report bounds
    # jobs' figures, not the span, so the constructed error is the tolerance)
    assert abs(da.span_energy_j - truth) <= stepping_j(W_PER_SM * 80, windows=1)
    assert math.isclose(da.span_energy_j, da.energy_j + db_.energy_j + da.unattributed_j, rel_tol=1e-9)
    # B's run ends first and writes B's summary; A's use events after that change B's part,
    # so A's close writes B's summary again: each stored summary is the job's figure now
    with open_store(f"sqlite:///{db}") as store:
        stored = {s.job_id: s.fields["energy_total_j"] for s in store.job_summaries()}  # type: ignore[attr-defined]
    for job in ("job-a", "job-b"):
        assert stored[job] == pytest.approx(got[job].warmup.energy_j + got[job].saturated_window.energy_j, rel=1e-9)


def test_a_job_whose_process_vanishes_is_charged_only_while_it_used_the_gpu(tmp_path: Path) -> None:
    """The job's worker uses 30 % SM from T0 to T1 and exits; the job runs on 3 s. A process
    of no job uses 10 % from T0 to T2: the job gets 75 % of [T0, T1), nothing after, and the
    stranger's part stays unattributed (never charged to the job)."""
    env = env_for(tmp_path, epoch=time.time() - 100.0)
    db = tmp_path / "w.db"
    stranger = subprocess.Popen(worker("stranger", tmp_path), env=env)
    job = wattline_run(db, "job-v", "nvml", ["sh", "-c", " ".join(map(_q, worker("v", tmp_path))) + "; sleep 3"], env)
    t0 = go(tmp_path, {"v": (30, 0.0, 4.0), "stranger": (10, 0.0, 7.0)}, [job])
    t1 = t0 + 4.0
    finish([job])
    stranger.wait(timeout=30)
    got = reports(db, "job-v")["job-v"]
    t0, t1 = within_stored_window(db, "job-v", t0, t1)
    during = W_PER_SM * 40 * (t1 - t0)
    # the job's share changes at T1 (75 % to 0), so a step there can move its energy too
    holds(
        gpu_j(got),
        0.75 * during,
        gpu_bound_j(got),
        0.75 * stepping_j(W_PER_SM * 40, windows=3) + changes_j(W_PER_SM * 40, 0.75),
    )
    [ds] = got.device_shares
    assert ds.unattributed_j == pytest.approx(ds.span_energy_j - ds.energy_j, rel=1e-9)
    # the stranger's part, and its time alone: at least its share of [T0, T1), less a step
    assert ds.unattributed_j >= 0.25 * during - stepping_j(W_PER_SM * 40, windows=1)


def _q(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


#: A Neuron runtime process: maps recorded runtime pid ``argv[1]`` to itself in the replay's
#: pid map ``argv[2]``, runs ``argv[3]`` seconds, exits; it appends "<pid> <mapped> <exiting>"
#: (Unix s) to ``argv[4]``: the span in which the stream reports it as its job's runtime.
RUNTIME = """
import os, sys, time
with open(sys.argv[2], "a") as f:
    f.write(f"{sys.argv[1]} {os.getpid()}\\n")
mapped = time.time()
time.sleep(float(sys.argv[3]))
with open(sys.argv[4], "a") as f:
    f.write(f"{os.getpid()} {mapped} {time.time()}\\n")
"""

#: The constructed Neuron device: trn1 (the power table's 300 W max, 60 W idle, idle added
#: to the driver's figure) at the power line's 20 % average: 60 + 0.20 x 300 W, constant.
TRN1_MAX_W, TRN1_IDLE_W, POWER_AVG_PCT = 300.0, 60.0, 20.0
NEURON_W = TRN1_IDLE_W + POWER_AVG_PCT / 100 * TRN1_MAX_W
#: neuron-monitor's (the replay's) report period: a runtime's use is known to within one.
REPORT_S = 0.1


def two_runtime_stream(path: Path) -> Path:
    """The recorded trn1.2xlarge report 2 (one device, two NeuronCores) with two runtimes:
    pid 7001 keeps NeuronCore 0 busy 60 %, pid 7002 NeuronCore 1 20 %: of the device
    (30 % + 10 %), 7001 has 75 % of the use, 7002 25 %."""
    recorded = Path(__file__).parents[1] / "fixtures/neuron/trn1.2xlarge_wandb_stream.ndjson"
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
    on neuron0: job A's runtime has 75 % of the device's NeuronCore use, B's 25 %. The truth
    is the test's: the device draws NEURON_W (its power line and the trn1 table), so each job
    is charged its share x NEURON_W x its stored window, less only what the scenario leaves
    open (before its process became the runtime, after it exited, a report period at each
    end); labelled a measured share, and A + B + unattributed = the device's energy."""
    pid_map, spans = tmp_path / "pids.txt", tmp_path / "spans.txt"
    config = tmp_path / "wattline.toml"
    path_env = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    config.write_text(
        "[sources.neuron]\n"
        f'monitor_path = "{REPLAY}"\n'
        f'monitor_args = ["--period", "{REPORT_S}"]\n'
        f'monitor_env = {{ PATH = "{path_env}", NEURON_REPLAY_FILE = "{two_runtime_stream(tmp_path / "s.ndjson")}", '
        f'NEURON_REPLAY_PID_MAP = "{pid_map}" }}\n'
        "period_s = 0.1\n"
        'device_type = "trn1"\n'
    )
    root = tmp_path / "host"
    power = root / "sys/devices/virtual/neuron_device/neuron0/stats/power/utilization"
    power.parent.mkdir(parents=True)
    (root / "sys/devices/virtual/neuron_device/neuron0/info/architecture").mkdir(parents=True)
    # min 10 %, max 30 %, average POWER_AVG_PCT of the device's max power
    power.write_text(f"POWER_STATUS_VALID,{int(time.time()) // 60 * 60},10.00,30.00,{POWER_AVG_PCT:.2f}\n")
    env = {**os.environ, "WATTLINE_USE_PERIOD_S": "0.5", "XDG_STATE_HOME": str(tmp_path / "state")}
    db = tmp_path / "w.db"
    extra = ["--config", str(config), "--sysfs-root", str(root)]
    jobs = [
        wattline_run(db, job, "neuron", [sys.executable, "-c", RUNTIME, rec, str(pid_map), "6", str(spans)], env, extra)
        for job, rec in (("job-a", "7001"), ("job-b", "7002"))
    ]
    finish(jobs)
    got = reports(db, "job-a", "job-b")
    mapped = {int(pid): (float(a), float(b)) for pid, a, b in (line.split() for line in spans.read_text().splitlines())}
    live = {rec: int(pid) for rec, pid in (line.split() for line in pid_map.read_text().splitlines())}
    with open_store(f"sqlite:///{db}") as store:
        uses = {
            job: [e for e in store.job_events(job) if e.event == "use" and e.fields["device"] != "cpu:host"]
            for job in got
        }
    for job, rec, share in (("job-a", "7001", 0.75), ("job-b", "7002", 0.25)):
        # the wrapper measured the constructed ratio (its first period may begin before the
        # process became the runtime)
        assert uses[job] and all(e.fields["device"] == "neuron:0" for e in uses[job])
        ratios = [e.fields["job_use"] / e.fields["device_use"] for e in uses[job]]
        assert ratios[0] <= share * 1.01 and ratios[1:] == pytest.approx([share] * (len(ratios) - 1), rel=0.01)
        [ds] = got[job].device_shares
        assert (ds.device, ds.basis) == ("neuron0", "measured share")
        opened, closed = within_stored_window(db, job, -math.inf, math.inf)
        became, exited = mapped[live[rec]]
        assert opened < became < exited <= closed
        truth = share * NEURON_W * (closed - opened)
        # outside [became, exited) no constructed ratio holds: the rule may give the job
        # anything from none of the device to all of it; inside, its use is known to a report
        unknown_s = (became - opened) + (closed - exited)
        tolerance = NEURON_W * unknown_s + share * NEURON_W * 2 * REPORT_S
        assert abs(ds.energy_j - truth) <= tolerance, (ds.energy_j, truth, tolerance)
        assert ds.device_energy_j == pytest.approx(NEURON_W * (closed - opened), rel=1e-3)
    da, db_ = got["job-a"].device_shares[0], got["job-b"].device_shares[0]
    assert math.isclose(da.span_energy_j, da.energy_j + db_.energy_j + da.unattributed_j, rel_tol=1e-9)


# -- the sharing rule itself, on synthetic timelines ------------------------------------

S = 10**9


def _gpu(intervals: list[tuple[int, int, float]]) -> ChannelEnergy:
    return ChannelEnergy("h", "gpu", "GPU-x", Quality.COUNTER, [Interval(a, b, e) for a, b, e in intervals])


def _job(job_id: str, uses: list[tuple[int, int, float, float]], devices: frozenset[str] = frozenset()) -> JobWindow:
    timeline = UseTimeline(UseInterval(a, b, j, d) for a, b, j, d in uses)
    return JobWindow(job_id, "h", 0, 100 * S, devices, {"gpu:GPU-x": timeline} if uses else {})


def _charged(att: Attribution) -> dict[str | None, float]:
    return {s.job_id: s.energy_j for s in att.shares}


def test_measured_use_splits_a_device_and_the_rest_is_stated() -> None:
    """100 W for 10 s. 0-4 s: A 60 %, B 20 % of 100 % used (20 % by a stranger); 4-6 s the
    device idles with both on it (rule "equal"); 6-8 s only the stranger uses it; 8-10 s no
    use was measured and nobody claims it. Conservation is exact."""
    gpu = _gpu([(t * S, (t + 1) * S, 100.0) for t in range(10)])
    a = _job("a", [(0, 4 * S, 60, 100), (4 * S, 6 * S, 0, 0), (6 * S, 8 * S, 0, 10)])
    b = _job("b", [(0, 4 * S, 20, 100), (4 * S, 6 * S, 0, 0)])
    att = split_shared([gpu], [a, b], "equal")
    got = _charged(att)
    assert got["a"] == pytest.approx(0.6 * 400 + 100, rel=1e-12)
    assert got["b"] == pytest.approx(0.2 * 400 + 100, rel=1e-12)
    assert got[None] == pytest.approx(0.2 * 400 + 200 + 200, rel=1e-12)
    assert math.fsum(got.values()) == 1000.0
    measured = {s.job_id: s.split_by_use_j for s in att.shares}
    assert measured["a"] == pytest.approx(240 + 100) and measured["b"] == pytest.approx(80 + 100)


def test_shares_above_one_are_scaled_and_claims_rule_where_no_use_was_measured() -> None:
    """Two wrappers that sampled at different instants report 80 % and 40 %: scaled to 2/3,
    1/3. Where no use interval covers the device, a job that claims it gets it in full."""
    gpu = _gpu([(0, 2 * S, 200.0), (2 * S, 4 * S, 200.0)])
    a = _job("a", [(0, 2 * S, 80, 100)], frozenset({"gpu:GPU-x"}))
    b = _job("b", [(0, 2 * S, 40, 100)])
    got = _charged(split_shared([gpu], [a, b], "equal"))
    assert got["a"] == pytest.approx(200 * 2 / 3 + 200, rel=1e-12)
    assert got["b"] == pytest.approx(200 / 3, rel=1e-12)
    assert None not in got


def test_use_events_rejected_on_the_wire_when_malformed() -> None:
    """The collector's one validation: a USE event names its device, a positive period and
    finite uses >= 0; bad ones are refused with the reason, never stored."""
    builder = EventBuilder(JobSpec("j", "j"))
    good = builder.make(wire.pb.JobEvent.KIND_USE, use_device="gpu:GPU-x", use_period_ns=S, job_use=1, device_use=2)
    tags, fields, _ = job_event_point({"host": "h"}, good)
    assert tags["event"] == "use" and fields["job_use"] == 1.0 and fields["device"] == "gpu:GPU-x"
    for bad in (
        {"use_device": "", "use_period_ns": S},
        {"use_device": "gpu:x", "use_period_ns": 0},
        {"use_device": "gpu:x", "use_period_ns": S, "job_use": math.nan},
        {"use_device": "gpu:x", "use_period_ns": S, "device_use": -1.0},
    ):
        with pytest.raises(LineProtocolError):
            job_event_point({"host": "h"}, builder.make(wire.pb.JobEvent.KIND_USE, **bad))


#: Runs with the stand-in loaded: the NVML per-process calls as pynvml makes them.
NVML_SEMANTICS = r"""
import json, os, sys, time
import pynvml as nv
from wattline.agent.sources.nvml import NvmlSource
procs, now = sys.argv[1], time.time()
with open(procs, "w") as f:
    f.write(f"0 {os.getpid()} 40 12 {now - 0.4} -\n")             # this process: 40 % SM, 12 % memory
    f.write(f"0 4194303 90 90 {now - 0.4} -\n")                    # a pid that does not exist
    f.write(f"0 {os.getppid()} 70 0 {now - 0.6} {now - 0.5}\n")  # a process whose use ended
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
out = {"running": sorted(p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h))}
buffered = nv.nvmlDeviceGetProcessUtilization(h, 0)  # all the driver keeps
out["buffered"] = sorted([s.pid, s.smUtil, s.memUtil, s.timeStamp] for s in buffered)
samples = nv.nvmlDeviceGetProcessUtilization(h, int((now - 0.3) * 1e6))
out["samples"] = [[s.pid, s.smUtil, s.memUtil, s.timeStamp] for s in samples]
newest = max(s.timeStamp for s in samples)
try:
    nv.nvmlDeviceGetProcessUtilization(h, newest + 10**9)
    out["after"] = "samples"
except nv.NVMLError_NotFound:
    out["after"] = "NotFound"
nv.nvmlShutdown()
src = NvmlSource()
src.discover()
[use] = [u for u in src.process_use(since_us=int((now - 0.3) * 1e6)) if u.device.endswith("5a5a5a5a-0000-4000-8000-000000000000")]
out["use"] = {"key": use.key, "metric": use.metric, "use": {str(k): v for k, v in use.use.items()}}
src.close()
out["pid"], out["now"] = os.getpid(), now
print(json.dumps(out))
"""


def test_stand_in_serves_per_process_utilization_as_nvml_documents_it(tmp_path: Path) -> None:
    """Through the real pynvml: running compute processes are the live ones in their window;
    nvmlDeviceGetProcessUtilization gives one sample per process with use in the driver's
    buffer newer than lastSeen (0: all of it; SM and memory percent, the mean over those
    sample periods, a CPU time stamp in microseconds, not in the future) and
    NVML_ERROR_NOT_FOUND when there is none newer;
    NvmlSource.process_use reads them. (The documented semantics: the kind stand-in.)"""
    env = env_for(tmp_path, epoch=time.time() - 100, unkind=False)
    done = subprocess.run(
        [sys.executable, "-c", NVML_SEMANTICS, env["WATTLINE_NVML_PROCS"]],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    out = json.loads(done.stdout)
    assert out["running"] == [out["pid"]]
    ended = [p for p in out["buffered"] if p[0] == os.getpid()]
    # 70 % for 0.1 s of the 1 s (100 samples of 10 ms) the driver keeps: a mean of 7 %
    assert ended and ended[0][1:3] == [7, 0] and ended[0][3] < (out["now"] - 0.5) * 1e6 + 10_000
    [[pid, sm, mem, stamp]] = out["samples"]
    assert (pid, sm, mem) == (out["pid"], 40, 12)
    assert (out["now"] - 0.3) * 1e6 <= stamp <= out["now"] * 1e6 + 1e6 and stamp % 10_000 == 0
    assert out["after"] == "NotFound"
    assert out["use"] == {"key": f"gpu:{GPU0}", "metric": "sm", "use": {str(out["pid"]): 40.0}}


#: The Job API in a process that is itself the GPU's user (a worker, see WORKER).
JOB_API = """
import json, os, sys, time
from wattline.jobs.wrappers.job import Job
pids, go = sys.argv[1:3]
with Job("api", job_id="job-api"):
    with open(pids, "a") as f:
        f.write(f"api {os.getpid()}\\n")
    while not os.path.exists(go):
        time.sleep(0.02)
    time.sleep(max(0.0, json.loads(open(go).read())["api"] - time.time()) + 1.0)
"""


def test_the_job_api_measures_the_calling_process(tmp_path: Path) -> None:
    """Job(...) without devices, in the process that uses GPU 0 (alone, 40 % SM for 4 s):
    charged GPU 0's energy then (measured share 100 %), none of the idle GPU 1. The Job API
    samples embedded at the default 1 s, and an energy sample that straddles the first use
    period's start spreads its energy evenly: up to one such sample at each end (80 J at
    most) can fall outside the measured periods, unattributed."""
    env = {**env_for(tmp_path, epoch=time.time() - 100.0), "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", JOB_API, str(tmp_path / "pids.txt"), str(tmp_path / "go.json")],
        env=env, text=True, stderr=subprocess.PIPE,
    )  # fmt: skip
    t0 = go(tmp_path, {"api": (40, 0.0, 4.0)}, [proc])
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    got = reports(tmp_path / "w.db", "job-api")["job-api"]
    [ds] = got.device_shares
    assert (ds.device, ds.basis) == (GPU0, "measured share")
    t0, t1 = within_stored_window(tmp_path / "w.db", "job-api", t0, t0 + 4.0)
    truth = W_PER_SM * 40 * (t1 - t0)
    # the device's energy over the job's window: the counter's steps at its two edges
    assert abs(ds.device_energy_j - truth) <= stepping_j(W_PER_SM * 40, windows=1)
    # charged over the use periods the Job recorded (an ask comes late under load), less at
    # most the two straddling 1 s samples
    with open_store(f"sqlite:///{tmp_path / 'w.db'}") as store:
        uses = [e for e in store.job_events("job-api") if e.event == "use" and e.fields["device"] != "cpu:host"]
    busy_s = sum(max(0.0, min(e.time_ns / 1e9, t1) - max((e.time_ns - e.fields["period_ns"]) / 1e9, t0)) for e in uses)
    assert busy_s > 2.0
    # Two-sided: within the report's bound, less what apportioning the Job API's 1 s samples
    # can push out of the use periods at each end
    first = min((e.time_ns - e.fields["period_ns"]) / 1e9 for e in uses)
    last = max(e.time_ns / 1e9 for e in uses)
    p = W_PER_SM * 40
    spread = spread_j(p, t0 - first, 1.0) + spread_j(p, last - t1, 1.0)
    bound = gpu_bound_j(got)
    assert truth - bound - spread <= gpu_j(got) <= truth + bound
    assert bound <= BOUND_CAP * stepping_j(p)
    assert ds.energy_j + ds.unattributed_j == pytest.approx(ds.span_energy_j, rel=1e-9)


@pytest.mark.parametrize("kind", ["sqlite", "influxdb1"])
def test_use_events_cross_the_wire_into_every_store_and_back(kind: str, tmp_path: Path, request: Any) -> None:
    """USE events pushed over gRPC to a real collector are stored (SQLite, a real influxd
    1.x) and read back as the same use intervals, steady or not; a malformed one is
    refused, counted."""
    url, database = f"sqlite:///{tmp_path / 'w.db'}", "wattline"
    if kind == "influxdb1":
        influx = request.getfixturevalue("influxd")
        url, database = influx.url, influx.new_database()
    builder = EventBuilder(JobSpec("j-use", "j"))
    t = time.time_ns() // 10**9 * 10**9
    events = [
        builder.open(t),
        builder.make(wire.pb.JobEvent.KIND_USE, t + 5 * S, use_device=f"gpu:{GPU0}", use_period_ns=5 * S,
                     job_use=45.5, device_use=60.0, use_metric="sm", use_steady=True),
        builder.make(wire.pb.JobEvent.KIND_USE, t + 10 * S, use_device="neuron:0", use_period_ns=5 * S,
                     job_use=30.0, device_use=40.0, use_metric="neuroncore"),
        builder.make(wire.pb.JobEvent.KIND_USE, t + 10 * S, use_device="", use_period_ns=5 * S),
        builder.close(0, t + 11 * S),
    ]  # fmt: skip
    batch = wire.Batch(stream_id="s", seq=1, job_events=events)
    batch.host.host_id = "h"
    with open_store(url, database=database) as store:
        server = CollectorServer(store, "127.0.0.1:0")
        server.start()
        try:
            ack = wire.telemetry_stub(grpc.insecure_channel(f"127.0.0.1:{server.port}")).Push(batch, timeout=30)
        finally:
            server.stop()
        assert (ack.written, ack.rejected) == (4, 1)
        got = use_timelines(store.job_events("j-use"), "h")  # type: ignore[attr-defined]
    assert {k: v.intervals for k, v in got.items()} == {
        f"gpu:{GPU0}": (UseInterval(t, t + 5 * S, 45.5, 60.0, "sm", steady=True),),
        "neuron:0": (UseInterval(t + 5 * S, t + 10 * S, 30.0, 40.0, "neuroncore"),),
    }


GPU_MIG = "GPU-7c7c7c7c-0000-4000-8000-000000000000"


#: A100-SXM4-80GB as nvidia-smi shows it: 81920 MiB; MIG 2g.20gb 19968 MiB, 3g.40gb 40192 MiB
#: (instances are not round fractions of the GPU, nor do they sum to it).
MIB = 1 << 20
A100_MIB, MIG_2G_MIB, MIG_3G_MIB = 81920, 19968, 40192


def test_a_job_on_a_mig_instance_gets_its_instances_share_of_the_parent(tmp_path: Path) -> None:
    """A MIG-enabled A100 80GB with a 2g.20gb instance (19968 of its 81920 MiB): the job's
    process runs on it (NVML has no per-process utilization on MIG) and the parent draws
    100 W meanwhile. The job is charged 19968/81920 of the parent's energy while its process
    ran (a rule by instance size, labelled so), the parent is counted once, and the rest is
    unattributed. The truth is what the test set: the process's use window and the parent's
    power, never the use periods the job recorded."""
    env = env_for(tmp_path, epoch=time.time() - 100.0)
    Path(env["WATTLINE_NVML_SCENARIO"]).write_text(
        "driver 550.54.15\n"
        f"gpu {GPU_MIG} NVIDIA A100-SXM4-80GB\nenergy_model 0 {W_PER_SM} {time.time() - 100}\n{UNKIND}util ns\n"
        f"memory {A100_MIB * MIB}:0\nlimit 400000\nmig 1 7\n"
        f"mig_device 0 MIG-11111111-0000-4000-8000-000000000000 3 {MIG_2G_MIB * MIB} 0\n"
        f"mig_device 2 MIG-22222222-0000-4000-8000-000000000000 1 {MIG_3G_MIB * MIB} 0\n"
    )
    db = tmp_path / "w.db"
    job = wattline_run(db, "job-m", "nvml", worker("m", tmp_path), env)
    t0 = go(tmp_path, {"m": (50, 0.0, 4.0)}, [job], gpu="0/0")
    finish([job])
    got = reports(db, "job-m")["job-m"]
    # the truth's time is the job's stored window: the process's use lies inside it
    assert within_stored_window(db, "job-m", t0, t0 + 4.0) == (t0, t0 + 4.0)
    p, share = W_PER_SM * 50, MIG_2G_MIB / A100_MIB
    truth = p * 4.0
    [ds] = got.device_shares
    assert (ds.device, ds.basis) == (GPU_MIG, "MIG instance share")
    assert abs(ds.span_energy_j - truth) <= stepping_j(p, windows=1)
    # the stored USE events say the instance's share while its process held it, then 0
    with open_store(f"sqlite:///{db}") as store:
        uses = [e for e in store.job_events("job-m") if e.event == "use" and e.fields["device"] != "cpu:host"]
    held = [e.fields["job_use"] / e.fields["device_use"] for e in uses]
    n = len([r for r in held if r > 0])
    assert n and held[:n] == pytest.approx([share] * n) and held[n:] == [0.0] * (len(held) - n)
    # A MIG process is seen running at each ask (every 0.5 s here), not sampled in between:
    # its start and its end each lie somewhere in one ask, where the job's part of the parent
    # is its share or none (changes_j), and the counter's steps move the parent's energy by
    # up to a step at each (stepping_j). The truth is the scenario's: the share of the parent's
    # 100 W over the process's 4 s; the figure within that error of it, and within its bound.
    constructed = share * stepping_j(p) + changes_j(p, share)
    assert abs(gpu_j(got) - share * truth) <= constructed, (gpu_j(got), share * truth, constructed)
    holds(gpu_j(got), share * truth, gpu_bound_j(got), constructed)
    assert ds.energy_j + ds.unattributed_j == pytest.approx(ds.span_energy_j, rel=1e-9)
    assert any("MIG instance's share" in n and "not a measurement" in n for n in got.notes)


def test_a_job_whose_processes_used_no_gpu_is_charged_none(tmp_path: Path) -> None:
    """No --devices, and no process of the job on any GPU (per-process use was read, so the
    close says so): the job is charged neither GPU, not the idle GPU 1's 50 W."""
    env = env_for(tmp_path, epoch=time.time() - 100.0)
    db = tmp_path / "w.db"
    finish([wattline_run(db, "job-cpu", "nvml", ["sleep", "2"], env)])
    got = reports(db, "job-cpu")["job-cpu"]
    with open_store(f"sqlite:///{db}") as store:
        [close] = [e for e in store.job_events("job-cpu") if e.event == "close"]
    assert set(close.fields["use_scope"].split(",")) == {f"gpu:{GPU0}", f"gpu:{GPU1}"}
    assert gpu_j(got) == 0.0 and got.device_shares == []
