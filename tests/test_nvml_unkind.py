"""NvmlSource against the stand-in's unkind scenarios (tests/nvml_stub/UNKIND.md): what real
drivers do that NVML's documentation does not promise, each a statement of the scenario file.

Each case runs in a fresh interpreter with the stand-in first on the loader path (pynvml
loads ``libnvidia-ml.so.1`` once per process) and prints JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from nvml_stub.build import build_stub

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
    pid 0 sample and a zombie at 250 %: the process's use is still its 40 % SM, the only
    entry, at both asks; each kind of left-out sample is counted, and logged once."""
    out = run_script(
        QUIRKS,
        tmp_path,
        f"gpu {GPU0} NVIDIA H100 80GB HBM3\nenergy 1000\nsample_period_ms 100\n"
        "process_quirks pad stale pid0 over100 dup\n",
    )
    pid = out["pid"]
    # the stand-in really is unkind: a 100-entry buffer, mostly zeros, with the extras
    assert len(out["raw"]) == 100
    assert [pid, 40, 12] in out["raw"] and [0, 37, 0] in out["raw"] and [4194305, 250, 0] in out["raw"]
    assert out["uses"] == [{"metric": "sm", "use": {str(pid): 40.0}}] * 2
    dropped = out["dropped"][GPU0]
    assert set(dropped) == {"pid 0", "stamped at or before lastSeenTimeStamp", "over 100 %", "older sample of its pid"}
    assert dropped["stamped at or before lastSeenTimeStamp"] >= 1  # the second ask's
    assert out["stderr"].count("left out (over 100 %)") == 1


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
