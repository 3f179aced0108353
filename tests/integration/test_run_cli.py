"""`wattline run` as a user runs it: embedded sampling, exit status, signals, unit counting."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
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
        sys.executable, "-m", "wattline.reference.demo", "--duration", "6", "--warmup", "1.5",
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
    assert set(measured["coverage"]["fractions"]) == {"model"}
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
    """As a shell: 127 not found, 126 not executable; a command that never started is no job
    (the store is not even created)."""
    (tmp_path / "script.sh").write_text("echo hi\n")  # not executable
    for command, status, why in (
        ("/nonexistent/cmd", 127, "No such file or directory"),
        ("no-such-command-wattline", 127, "command not found"),
        (str(tmp_path / "script.sh"), 126, "Permission denied"),
        (str(tmp_path), 126, "Is a directory"),
    ):
        out = run(tmp_path, "run", "--job-id", "x", "--no-report", "--", command)
        assert out.returncode == status, out.stderr
        assert out.stderr == f"wattline: error: {command}: {why}\n"
    assert not (tmp_path / "w.db").exists()


CATCHER = """
import pathlib, signal, sys, time
log = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGINT, lambda *_: log.open("a").write("INT\\n"))
(log.parent / "ready").write_text("1")
deadline = time.time() + 30
while time.time() < deadline and not log.exists():
    time.sleep(0.05)
time.sleep(1.5)  # a second copy of the signal would arrive within this
sys.exit(5)
"""


def _wait_ready(tmp_path: Path) -> None:
    deadline = time.time() + 60
    while not (tmp_path / "ready").exists():
        assert time.time() < deadline, "the command never started"
        time.sleep(0.05)


def _catcher(tmp_path: Path) -> list[str]:
    (tmp_path / "catch.py").write_text(CATCHER)
    return [*WATTLINE, "run", "--no-report", "--", sys.executable, str(tmp_path / "catch.py"), str(tmp_path / "ints")]


def test_ctrl_c_without_a_terminal_reaches_the_command_once(tmp_path: Path) -> None:
    """setsid / a scheduler: SIGINT to the wrapper's process group, or to the wrapper alone,
    reaches the command exactly once (it used to get the group's copy and a forwarded one)."""
    env = {**os.environ, "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}"}
    for to_group in (True, False):
        for name in ("ready", "ints"):
            (tmp_path / name).unlink(missing_ok=True)
        proc = subprocess.Popen(
            _catcher(tmp_path), env=env, cwd=tmp_path, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _wait_ready(tmp_path)
        if to_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 5, err
        assert (tmp_path / "ints").read_text() == "INT\n", f"group={to_group}"


def test_ctrl_c_in_a_terminal_reaches_the_command_once(tmp_path: Path) -> None:
    """In the foreground of a terminal, the terminal's Ctrl-C reaches the command once."""
    import pty

    env = {**os.environ, "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}"}
    argv = _catcher(tmp_path)
    pid, master = pty.fork()
    if pid == 0:  # the child: session leader, the pty its controlling terminal, foreground
        os.chdir(tmp_path)
        os.execve(argv[0], argv, env)
    try:
        _wait_ready(tmp_path)
        os.write(master, b"\x03")  # Ctrl-C: the terminal signals its foreground process group
        deadline = time.time() + 60
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.time() < deadline
            if select.select([master], [], [], 0.05)[0]:  # keep the pty drained
                with contextlib.suppress(OSError):
                    os.read(master, 65536)
    finally:
        os.close(master)
    assert os.waitstatus_to_exitcode(status) == 5
    assert (tmp_path / "ints").read_text() == "INT\n"


def test_json_stdout_is_only_json_and_sources_are_one_line(tmp_path: Path) -> None:
    """--json: stdout parses as the report alone, CMD's stdout goes to stderr (counted by
    --units-from-stdout all the same); discovery is one line, not a log line per source."""
    out = run(
        tmp_path, "run", "--job-id", "j-json", "--json", "--units-from-stdout", r"did (\d+)", "--",
        "sh", "-c", "echo did 4; echo did 3",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["units"]["total"] == 7
    assert "did 4\ndid 3\n" in out.stderr
    sources = [line for line in out.stderr.splitlines() if line.startswith("wattline: sources: ")]
    assert len(sources) == 1 and "measuring" in sources[0], out.stderr
    assert " INFO " not in out.stderr, out.stderr
