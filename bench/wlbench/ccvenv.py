"""bench/.venv: the peers and profilers of bench/requirements.txt, apart from the project's venv."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wlbench.common import BENCH, PYTHON, Proc, RusagePopen

VENV = BENCH / ".venv"
REQUIREMENTS = BENCH / "requirements.txt"
_why = ""


def python() -> Path | None:
    """bench/.venv's python with CodeCarbon importable, creating the venv if needed; None if impossible."""
    global _why
    exe = VENV / "bin" / "python"
    if exe.exists() and _imports(exe):
        return exe
    try:
        if not exe.exists():
            subprocess.run([PYTHON, "-m", "venv", str(VENV)], check=True, capture_output=True, timeout=120)
        subprocess.run(
            [str(exe), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        stderr = getattr(exc, "stderr", b"") or b""
        _why = f"bench/.venv: cannot install {REQUIREMENTS.name}: {exc} {stderr.decode(errors='replace')[-300:]}"
        return None
    if not _imports(exe):
        _why = "bench/.venv: codecarbon does not import"
        return None
    return exe


def why_missing() -> str:
    return _why or "not run in this mode"


def _imports(exe: Path) -> bool:
    return subprocess.run([str(exe), "-c", "import codecarbon"], capture_output=True, timeout=120).returncode == 0


@dataclass
class Probe:
    proc: Proc

    def finish(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """Wait for the probe to end by itself; its figures, whole run from ``os.wait4``."""
        popen = self.proc.popen
        try:
            out, _ = popen.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": "CodeCarbon probe did not finish", "log": self.proc.tail()}
        return {"error": "CodeCarbon probe failed", "log": self.proc.tail()} if not out else _figures(out, popen)


def _figures(out: bytes, popen: subprocess.Popen[bytes]) -> dict[str, Any]:
    doc = json.loads(out.decode().strip().splitlines()[-1])
    rusage = getattr(popen, "rusage", None)
    whole = rusage.ru_utime + rusage.ru_stime if rusage is not None else None
    return {
        "steady_ms_per_measurement": doc["steady_cpu_s"] / doc["steady_measurements"] * 1e3
        if doc["steady_measurements"]
        else None,
        "steady_measurements": doc["steady_measurements"],
        "measurements": doc["measurements"],
        "whole_run_cpu_s": whole,
        "whole_run_ms_per_measurement": whole / doc["measurements"] * 1e3 if whole and doc["measurements"] else None,
        "hwm_mib": doc["hwm_kib"] / 1024,
    }


def start_probe(exe: Path, interval_s: float, warm_s: float, window_s: float, log: Path) -> Probe:
    script = Path(__file__).with_name("cc_probe.py")
    argv = [str(exe), str(script), repr(interval_s), str(warm_s), str(window_s)]
    return Probe(Proc(argv, log, stdout=subprocess.PIPE, popen=RusagePopen))
