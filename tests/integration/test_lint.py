"""The tree stays ruff- and mypy-clean (strict), as the README's development section says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_check_and_format() -> None:
    check = run("ruff", "check", ".")
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = run("ruff", "format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_mypy_strict() -> None:
    out = run("mypy")
    assert out.returncode == 0, out.stdout + out.stderr
