"""bench/run works: its cheapest part in quick mode, and the shape of the JSON it writes.

Only the shape is checked: performance is measured by bench/run, never asserted in tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_run_quick_accuracy_writes_the_json(tmp_path: Path) -> None:
    out = tmp_path / "latest.json"
    env = {**os.environ, "WATTLINE_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(REPO / "bench" / "run"), "--quick", "--only", "accuracy", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "| accuracy" in proc.stdout  # the table
    doc = json.loads(out.read_text())
    assert doc["quick"] is True and doc["errors"] == {}
    assert {"cpu", "cores", "memory_gib", "python"} <= set(doc["machine"])
    accuracy = doc["parts"]["accuracy"]
    assert accuracy["cases"] >= 3 and "sqlite" in accuracy["worst_error"]
    assert all(isinstance(e, float) for errors in accuracy["errors"].values() for e in errors)
    rows = doc["targets"]
    assert rows and all({"part", "figure", "value", "yardstick", "ratio", "target", "met"} <= set(r) for r in rows)
    assert {r["part"] for r in rows} == {"accuracy"}


def test_bench_run_refuses_an_unknown_part(tmp_path: Path) -> None:
    env = {**os.environ, "WATTLINE_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(REPO / "bench" / "run"), "--only", "nonsense", "--out", str(tmp_path / "x.json")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 2 and "unknown part" in proc.stderr
