"""`wattline run` as a user runs it: embedded sampling, exit status, signals, unit counting."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WATTLINE = [sys.executable, "-m", "wattline.cli.main"]


def run(tmp_path: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}", "COLUMNS": "200"}
    return subprocess.run([*WATTLINE, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


def report_of(tmp_path: Path, job_id: str) -> dict[str, Any]:
    out = run(tmp_path, "report", job_id, "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_readme_main_command_counts_every_unit_and_labels_estimates(tmp_path: Path) -> None:
    out = run(
        tmp_path,
        "run", "--job", "demo", "--kind", "inference", "--units", "documents", "--report-json", "r.json", "--",
        sys.executable, "-m", "wattline.workloads.demo", "--duration", "6", "--warmup", "1.5",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    processed = int(re.search(r"processed (\d+) documents", out.stdout).group(1))  # type: ignore[union-attr]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["schema"] == "wattline.report/1"
    assert report["units"]["total"] == processed
    assert report["units"]["warmup"] + report["units"]["measured"] == processed
    assert report["job"]["exit_code"] == 0 and report["job"]["closed"]
    measured = report["measured"]
    assert measured["energy_j"] > 0 and measured["j_per_unit"] > 0
    # No RAPL/NVML here: everything is a model estimate, and the report says so.
    assert set(measured["coverage"]["shares"]) == {"model"}
    assert "ESTIMATE" in out.stdout
    assert report["saturation"]["method"] in {"throughput-plateau", "none"}
    if report["saturation"]["saturated"]:
        assert 0 < report["durations_s"]["warmup"] < report["durations_s"]["total"]
    # the same job is listed and reported from the store alone, after the fact
    listed = run(tmp_path, "jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [j["id"] for j in json.loads(listed.stdout)] == [report["job"]["id"]]
    assert report_of(tmp_path, report["job"]["id"])["units"] == report["units"]


def test_exit_status_units_from_stdout_and_saturated_after(tmp_path: Path) -> None:
    script = "for i in 1 2 3 4 5 6; do echo processed 10 items; sleep 0.5; done; exit 3"
    out = run(
        tmp_path,
        "run", "--job", "sh", "--job-id", "sh-1", "--units-from-stdout", r"processed (\d+)", "--saturated-after", "1s",
        "--no-report", "--", "sh", "-c", script,
    )  # fmt: skip
    assert out.returncode == 3, out.stderr
    assert out.stdout.count("processed 10 items") == 6  # the command's output is passed through
    report = report_of(tmp_path, "sh-1")
    assert report["units"]["total"] == 60
    assert report["saturation"] == {**report["saturation"], "saturated": True, "method": "manual"}
    assert report["job"]["exit_code"] == 3


def test_events_file_from_any_language(tmp_path: Path) -> None:
    script = (
        'echo "units 5" >> "$WATTLINE_EVENTS"; echo "phase saturated" >> "$WATTLINE_EVENTS"; '
        'echo "units 7" >> "$WATTLINE_EVENTS"; echo "bogus line" >> "$WATTLINE_EVENTS"; sleep 0.5'
    )
    out = run(tmp_path, "run", "--job-id", "ev-1", "--no-report", "--", "sh", "-c", script)
    assert out.returncode == 0, out.stderr
    assert "ignored line" in out.stderr  # reported once, never fatal
    report = report_of(tmp_path, "ev-1")
    assert report["units"]["total"] == 12
    assert report["saturation"]["method"] == "manual"


def test_sigterm_is_forwarded_and_its_status_returned(tmp_path: Path) -> None:
    child = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); print('up', flush=True); time.sleep(60)"
    env = {**os.environ, "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}"}
    proc = subprocess.Popen(
        [*WATTLINE, "run", "--job-id", "sig-1", "--no-report", "--units-from-stdout", "up", "--", sys.executable, "-c", child],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "up"
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7
    assert report_of(tmp_path, "sig-1")["job"]["exit_code"] == 7


def test_missing_command_is_one_line_and_127(tmp_path: Path) -> None:
    out = run(tmp_path, "run", "--job-id", "x", "--no-report", "--", "/nonexistent/cmd")
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if "wattline: error" in line]
    assert lines == ["wattline: error: cannot start '/nonexistent/cmd': No such file or directory"]
    assert "Traceback" not in out.stderr
    assert report_of(tmp_path, "x")["job"]["exit_code"] == 127
