"""Settings ``wattline sweep`` applies itself, always restored: the cpufreq ceiling (a fake
cpufreq sysfs tree under ``--sysfs-root``) and the NVIDIA power limit (through the NVML
stand-in, whose limits outlive a process as the driver's do: ``tests/nvml_stub``). Restored
at the end, after Ctrl-C, and after ``kill -9`` of the sweep by the next wattline process;
refused without permission in one line, exit 2, nothing changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from nvml_stub.build import build_stub
from procs import CLI, clean_env
from schema_check import schema_errors
from sysfs_trees import write_attr
from waits import wait_until

MAX_KHZ = 3000000


def cpufreq_tree(root: Path, policies: int = 2) -> list[Path]:
    """policyN directories as the cpufreq driver lays them out (kHz); their scaling_max_freq files."""
    files = []
    for n in range(policies):
        d = root / f"sys/devices/system/cpu/cpufreq/policy{n}"
        for name, value in (
            ("cpuinfo_min_freq", 800000), ("cpuinfo_max_freq", MAX_KHZ), ("scaling_max_freq", MAX_KHZ),
            ("scaling_governor", "powersave"), ("scaling_available_governors", "performance powersave"),
        ):  # fmt: skip
            write_attr(d / name, value)
        files.append(d / "scaling_max_freq")
    return files


def env_for(tmp_path: Path, **more: str) -> dict[str, str]:
    return {
        **clean_env(),
        "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        **more,
    }


#: Runs its arguments with SIGINT and SIGQUIT at their defaults, as a terminal's foreground
#: job has them: a suite started in the background (``cmd &`` in a script) passes them on
#: ignored, and a process that starts with Ctrl-C ignored keeps ignoring it (Python too).
FOREGROUND = [sys.executable, "-c", "import os, signal as s, sys; s.signal(s.SIGINT, s.SIG_DFL); "
              "s.signal(s.SIGQUIT, s.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"]  # fmt: skip


def sweep(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*FOREGROUND, *CLI, "sweep", "--source", "cpu_model", "--repeat", "1", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def signal_states(pid: int) -> list[str]:
    """Each thread of ``pid`` and of its children: name, state, blocked, ignored and caught
    signals, as /proc shows them (the Ctrl-C test says them when the sweep did not stop)."""
    out = []
    with contextlib.suppress(psutil.Error):
        for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            with contextlib.suppress(OSError):
                for task in sorted(Path(f"/proc/{p.pid}/task").iterdir()):
                    fields = dict(
                        line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line
                    )
                    keys = ("Name", "State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
                    out.append(f"{p.pid}/{task.name} " + " ".join(fields.get(k, "?").strip() for k in keys))
    return out


def kill_9(proc: subprocess.Popen[str]) -> None:
    """``kill -9`` the sweep wherever it is (even creating its store), and the command it ran.

    Stopped first, so that the children listed are all it has: a command it starts between
    the listing and the kill would outlive it (in its own process group)."""
    proc.send_signal(signal.SIGSTOP)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.wait()
    for child in children:
        child.kill()


def next_wattline_command(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``wattline jobs``, the next wattline command on the host after the sweep died. It lists
    the sweep's jobs, or finds no store when the kill came before the sweep had created it."""
    out = subprocess.run([*CLI, "jobs", "--no-energy"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 or (out.returncode == 2 and "error: no store at" in out.stderr), out.stderr
    return out


#: ``python -c FAILS_AT_1_2GHZ VALUE SEEN FILE...``: appends what the setting FILEs hold to
#: SEEN, counts 5 units every 0.1 s for 0.6 s, saturated from its start, and exits 3 where
#: VALUE is 1.2GHz, else 0.
FAILS_AT_1_2GHZ = (
    "import os, sys, time; "
    "open(sys.argv[2], 'a').write(' '.join(open(f).read().strip() for f in sys.argv[3:]) + '\\n'); "
    "ev = open(os.environ['WATTLINE_EVENTS'], 'a'); ev.write('phase saturated\\n'); ev.flush(); "
    "[(time.sleep(0.1), ev.write('units 5\\n'), ev.flush()) for _ in range(6)]; "
    "sys.exit(3 if sys.argv[1] == '1.2GHz' else 0)"
)


def test_cpufreq_ceiling_per_point_restored_at_the_end_even_when_a_point_fails(tmp_path: Path) -> None:
    """The command fails at one point: the other still runs (its setting applied), the
    settings are restored, the answer is printed (valid against the published schema, the
    failed point without figures) and the sweep exits 1 with one line naming the point."""
    files = cpufreq_tree(tmp_path / "host")
    seen = tmp_path / "seen"
    args = ["--sysfs-root", str(tmp_path / "host"), "--param", "cpu_max_freq=1.2GHz,2000MHz"]
    command = [sys.executable, "-c", FAILS_AT_1_2GHZ, "{cpu_max_freq}", str(seen), *map(str, files)]
    proc = sweep([*args, "--share-rule", "exclusive", "--json", "--", *command], env_for(tmp_path))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    assert seen.read_text().splitlines() == ["1200000 1200000", "2000000 2000000"]
    assert [f.read_text().strip() for f in files] == [str(MAX_KHZ)] * 2
    assert not list((tmp_path / "state/wattline/outbox/restore").glob("*.json"))
    data = json.loads(out)
    assert schema_errors("sweep", data) == []
    sweep_id = data["sweep"]
    errors = [line for line in err.splitlines() if "error" in line]
    assert errors == [
        f"wattline sweep {sweep_id}: error: a point failed: cpu_max_freq=1.2GHz (exit 3 in 1 of 1 runs); "
        f"the other runs ran; run the failed ones again with: wattline sweep --resume {sweep_id}"
    ], err
    assert "Traceback" not in err and err.splitlines()[-1] == errors[0]
    ok, failed = data["points"]
    assert ok["params"] == {"cpu_max_freq": "2000MHz"} and ok["rank"] == 1 and ok["problems"] == []
    assert ok["runs_ok"] == 1 and ok["j_per_unit"]["mean"] > 0
    assert failed["params"] == {"cpu_max_freq": "1.2GHz"} and failed["rank"] is None
    assert failed["problems"] == ["failed (exit 3)"] and (failed["runs"], failed["runs_ok"]) == (1, 0)
    assert failed["j_per_unit"] is None and not failed["pareto"] and failed["advantage_over_next"] is None
    assert [c["params"] for c in data["choices"]] == [{"cpu_max_freq": "2000MHz"}]


@pytest.mark.parametrize("how", ["ctrl-c", "kill -9"])
def test_cpufreq_restored_after_ctrl_c_and_after_kill_9(tmp_path: Path, how: str) -> None:
    files = cpufreq_tree(tmp_path / "host")
    env = env_for(tmp_path)
    args = ["--sysfs-root", str(tmp_path / "host"), "--param", "cpu_governor=performance", "--param", "s=1", "--"]
    proc = sweep([*args, "sleep", "{s}0"], env)
    governor = files[0].parent / "scaling_governor"
    wait_until(lambda: governor.read_text().strip() == "performance", "the governor set")
    if how == "ctrl-c":
        before = signal_states(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends it to the foreground group
        after = signal_states(proc.pid)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, f"{err}\nbefore the kill: {before}\nafter it: {after}"
        assert "resume with: wattline sweep --resume" in err
    else:
        kill_9(proc)
        assert governor.read_text().strip() == "performance"  # the sweep could not restore it
        out = next_wattline_command(env)
        assert "restored cpu_governor" in out.stderr
    assert governor.read_text().strip() == "powersave"
    assert not list((tmp_path / "state/wattline/outbox/restore").glob("*.json"))


def test_cpufreq_not_permitted_changes_nothing(tmp_path: Path) -> None:
    # a read-only sysfs attribute refuses even root: the policy's ceiling points at one
    readonly = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
    try:
        readonly.open("w").close()
        pytest.skip("no read-only sysfs attribute here to stand for a refused write")
    except PermissionError:
        pass
    except OSError:
        pytest.skip("no read-only sysfs attribute here to stand for a refused write")
    files = cpufreq_tree(tmp_path / "host")
    files[1].unlink()
    files[1].symlink_to(readonly)
    governor = files[0].parent / "scaling_governor"
    args = [
        "--sysfs-root",
        str(tmp_path / "host"),
        "--param",
        "cpu_governor=performance",
        "--param",
        "cpu_max_freq=1GHz",
    ]
    out = subprocess.run(
        [*CLI, "sweep", *args, "--", "true"], env=env_for(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "nothing changed" in out.stderr, out.stderr
    assert governor.read_text().strip() == "powersave" and files[0].read_text().strip() == str(MAX_KHZ)


SCENARIO = "gpu GPU-sweep-0 NVIDIA Stub H100\nmgmt_limit 350000\nenergy 1000\n"


def nvml_env(tmp_path: Path, **more: str) -> dict[str, str]:
    (tmp_path / "gpus.txt").write_text(SCENARIO)
    return env_for(
        tmp_path,
        LD_LIBRARY_PATH=str(build_stub()),
        WATTLINE_NVML_SCENARIO=str(tmp_path / "gpus.txt"),
        NVML_STUB_LIMITS=str(tmp_path / "limits"),
        **more,
    )


def limit_now(env: dict[str, str]) -> int:
    """The GPU's power limit as another process reads it through NVML (mW)."""
    code = (
        "import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetPowerManagementLimit(n.nvmlDeviceGetHandleByIndex(0)))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30, check=True)
    return int(out.stdout)


def test_nvml_power_limit_set_per_point_restored_at_the_end(tmp_path: Path) -> None:
    env = nvml_env(tmp_path)
    code = "import pynvml as n, sys; n.nvmlInit(); print(n.nvmlDeviceGetPowerManagementLimit(n.nvmlDeviceGetHandleByIndex(0)), file=open(sys.argv[1], 'a'))"
    proc = sweep(["--param", "power_limit=150,200W", "--", sys.executable, "-c", code, str(tmp_path / "seen")], env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert (tmp_path / "seen").read_text().split() == ["150000", "200000"]
    assert limit_now(env) == 350000


def test_nvml_power_limit_restored_after_kill_9(tmp_path: Path) -> None:
    env = nvml_env(tmp_path)
    proc = sweep(["--param", "power_limit=200", "--param", "s=1", "--", "sleep", "{s}0"], env)
    wait_until(
        lambda: (tmp_path / "limits").exists() and "200000" in (tmp_path / "limits").read_text(), "the power limit set"
    )
    kill_9(proc)
    assert limit_now(env) == 200000
    out = next_wattline_command(env)
    assert "restored power_limit" in out.stderr, out.stderr
    assert limit_now(env) == 350000


def test_nvml_power_limit_refused_without_permission(tmp_path: Path) -> None:
    env = nvml_env(tmp_path, NVML_STUB_SET_ERROR="4")
    out = subprocess.run(
        [*CLI, "sweep", "--param", "power_limit=200", "--", "true"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "nothing changed" in out.stderr, out.stderr
    assert "Insufficient Permissions" in out.stderr
    assert not (tmp_path / "limits").exists() and limit_now(env) == 350000


def dead_sweep(outbox: Path, host: Path) -> Path:
    """A process that recorded the governor, set it to performance and died without restoring
    it (``os._exit``, as ``kill -9`` leaves it); the record's path."""
    code = (
        "import os, sys; from pathlib import Path; from wattline.agent.tuning.cpufreq import CpuFreq;"
        "from wattline.agent.tuning.records import Applied;"
        "a = Applied(Path(sys.argv[1]), [CpuFreq('cpu_governor', Path(sys.argv[2]))], 'sweep dead');"
        "a.set({'cpu_governor': 'performance'}); print(a.path, flush=True); os._exit(0)"
    )
    restore = outbox / "restore"
    out = subprocess.run(
        [sys.executable, "-c", code, str(restore), str(host)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip())


def test_a_restore_whose_restorer_died_midway_is_claimed_again(tmp_path: Path) -> None:
    from wattline.agent.tuning.records import restore_dead

    files = cpufreq_tree(tmp_path / "host")
    governor = files[0].parent / "scaling_governor"
    record = dead_sweep(tmp_path / "ob", tmp_path / "host")
    assert governor.read_text().strip() == "performance"
    # claimed by a process that is gone now (its pid, and start ticks no process has)
    claimed = record.with_name(f"{record.name}.{os.getpid()}-1.claimed")
    record.rename(claimed)
    # one claimed by this live process is its to finish: left alone
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: start time
    live = record.with_name(f"r1-{'0' * 12}.json.{os.getpid()}-{ticks}.claimed")
    live.write_text(claimed.read_text())
    assert restore_dead(record.parent) == 1
    assert governor.read_text().strip() == "powersave"
    assert sorted(p.name for p in record.parent.iterdir()) == [live.name]


def test_the_agent_restores_a_dead_sweep_at_start(tmp_path: Path) -> None:
    """``python -m wattline.agent`` (the lean entry a unit runs; no ``wattline`` command) puts
    back what a dead sweep left under its outbox."""
    files = cpufreq_tree(tmp_path / "host")
    governor = files[0].parent / "scaling_governor"
    record = dead_sweep(tmp_path / "ob", tmp_path / "host")
    agent = subprocess.Popen(
        [sys.executable, "-m", "wattline.agent", "--sysfs-root", str(tmp_path / "host"), "--source", "cpu_model",
         "--collector", "127.0.0.1:9", "--spool-dir", "memory", "--outbox-dir", str(tmp_path / "ob")],
        env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(
            lambda: governor.read_text().strip() == "powersave" or agent.poll() is not None, "the governor restored"
        )
    finally:
        agent.terminate()
        _, err = agent.communicate(timeout=30)
    assert governor.read_text().strip() == "powersave", err[-2000:]
    assert "restored cpu_governor as they were before sweep dead" in err
    assert not record.exists() and not list(record.parent.iterdir())
