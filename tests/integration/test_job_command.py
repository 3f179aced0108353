"""`wattline run` once its command has run (wattline/jobs/wrappers/job_command.py): a report that cannot be
written is one line and the command's exit status stays; --no-report with --report-json
writes the file and prints no table; the report command it prints pastes into a shell."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from procs import start_collector
from servers import free_port

WATTLINE = [sys.executable, "-m", "wattline.cli.main", "--log-level", "warning"]


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}", "COLUMNS": "200"}
    return subprocess.run([*WATTLINE, *args], capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path)


@pytest.mark.parametrize(("status", "expected"), [(3, 3), (0, 1)])
def test_a_report_that_cannot_be_written_keeps_the_commands_status(tmp_path: Path, status: int, expected: int) -> None:
    missing = tmp_path / "no-such-dir" / "r.json"
    out = run(
        tmp_path, "run", "--job-id", f"s{status}", "--report-json", str(missing), "--", "sh", "-c", f"exit {status}"
    )
    assert out.returncode == expected, out.stderr
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert errors == [f"wattline: error: report: [Errno 2] No such file or directory: '{missing}'"], out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    # the job itself was recorded: its report reads from the store afterwards
    again = run(tmp_path, "report", f"s{status}", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["job"]["exit_code"] == status, again.stderr


def test_no_report_with_report_json_writes_the_file_alone(tmp_path: Path) -> None:
    out = run(tmp_path, "run", "--job-id", "quiet", "--no-report", "--report-json", "r.json", "--", "true")
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["schema"] == "wattline.report/1" and report["job"]["id"] == "quiet"


def test_the_report_hint_pastes_into_a_shell_whatever_the_job_id(tmp_path: Path) -> None:
    """Through a collector whose store ``run`` does not know, ``run`` prints the report's
    command: pasted into bash (the store filled in) it gives the job's report, even for an id
    with a space and a quote."""
    job_id = "a b'c"
    store = f"sqlite:///{tmp_path / 'c.db'}"
    port = free_port()
    collector = start_collector(port, ["--store", store], tmp_path / "collector.log")
    try:
        out = run(tmp_path, "run", "--collector", f"127.0.0.1:{port}", "--job-id", job_id, "--", "true")
    finally:
        assert collector.terminate() == 0
    assert out.returncode == 0, out.stderr
    [hint] = [line.split("report: ", 1)[1] for line in out.stderr.splitlines() if "report: wattline report" in line]
    pasted = hint.replace("<the collector's store>", shlex.quote(store)) + " --json"
    cli = " ".join(shlex.quote(a) for a in WATTLINE)
    shell = subprocess.run(
        ["bash", "-c", f'wattline() {{ {cli} "$@"; }}; {pasted}'], capture_output=True, text=True, timeout=90
    )
    assert shell.returncode == 0, shell.stderr
    assert json.loads(shell.stdout)["job"]["id"] == job_id
