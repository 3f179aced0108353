"""The live line of ``wattline run``: on a terminal's stderr, refreshed every second; off
when stderr is not a terminal or with --quiet; the command's output and status untouched."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

WATTLINE = [sys.executable, "-m", "wattline.cli.main", "--log-level", "warning"]
# 10 units every 0.5 s for 4 s: 20 units/s
SCRIPT = 'for i in 1 2 3 4 5 6 7 8; do echo "units 10" >> "$WATTLINE_EVENTS"; sleep 0.5; done; echo done; exit 4'


def run(tmp_path: Path, *extra: str, tty: bool = True) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of a job running SCRIPT, its stderr a terminal or a pipe."""
    args = [*WATTLINE, "run", "--job", "live", "--units", "documents", "--no-report", "--source", "cpu_model", *extra]
    env = {**os.environ, "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}"}
    if not tty:
        out = subprocess.run([*args, "--", "sh", "-c", SCRIPT], capture_output=True, text=True, timeout=60, env=env)
        return out.returncode, out.stdout, out.stderr
    master, slave = pty.openpty()
    proc = subprocess.Popen([*args, "--", "sh", "-c", SCRIPT], stdout=subprocess.PIPE, stderr=slave, text=True, env=env)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # the terminal closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    stdout = proc.communicate(timeout=60)[0]
    reader.join(timeout=10)
    os.close(master)
    return proc.returncode, stdout, b"".join(chunks).decode()


LINE = re.compile(r"live  00:0(\d)  (\d+\.\d\d) W \(estimate\)  ([\d,.]+) J  ([\d,]+) documents/s  (.+?)\s*$")


def test_live_line_on_a_terminal(tmp_path: Path) -> None:
    status, stdout, stderr = run(tmp_path, "--saturated-after", "2s")
    assert status == 4 and stdout == "done\n"  # the command's output and status pass through
    lines = [m for part in stderr.split("\r") if (m := LINE.match(part))]
    assert len(lines) >= 3, stderr  # refreshed every second for a 4 s job
    seconds = [int(m.group(1)) for m in lines]
    assert seconds == sorted(seconds) and seconds[0] <= 1
    assert all(float(m.group(2)) > 0 for m in lines)  # power now: the CPU model's estimate
    energies = [float(m.group(3).replace(",", "")) for m in lines]
    assert energies == sorted(energies) and energies[-1] > 0  # energy so far grows
    assert 10 <= int(lines[-1].group(4).replace(",", "")) <= 30  # ~20 units/s
    assert lines[0].group(5) == "warming up" and lines[-1].group(5) == "saturated at 2 s"
    assert stderr.rstrip("\r").split("\r")[-1].strip() == ""  # erased at the end


def test_no_live_line_off_a_terminal_or_with_quiet(tmp_path: Path) -> None:
    status, stdout, stderr = run(tmp_path, tty=False)
    assert (status, stdout) == (4, "done\n") and "documents/s" not in stderr, stderr
    status, _, stderr = run(tmp_path, "--quiet")
    assert status == 4 and "documents/s" not in stderr, stderr
