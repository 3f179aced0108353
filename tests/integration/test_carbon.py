"""Carbon intensity over time: a CSV (time,gco2_per_kwh) applied interval by interval to a
stored job of known power (tests/helpers/synthetic_job.py), checked against a hand calculation."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from synthetic_job import LENGTH_S, T0, WARMUP_S, S, make_store
from test_bounds import T0 as BOUNDS_T0
from test_bounds import Series, write_job

from wattline.reports.build import build_report
from wattline.reports.intensity import read_series
from wattline.reports.model import ReportSettings
from wattline.stores.sqlite.store import SqliteStore

WATTLINE = [sys.executable, "-m", "wattline.cli.main"]
HOST_W = 36.0 + 54.0  # synth's two hosts in the measured window: (30+5+1) W x 1 and x 1.5
CHANGE_S = 30.5  # the grid goes from 100 to 500 gCO2/kWh mid-sample


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WATTLINE, *args], capture_output=True, text=True, timeout=120, env=dict(os.environ))


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_store(tmp_path_factory.mktemp("store") / "w.db", {"synth": ("node-1", "node-2"), "other": ("node-1",)})


@pytest.fixture
def grid(tmp_path: Path) -> Path:
    path = tmp_path / "grid.csv"
    path.write_text(
        "time,gco2_per_kwh,zone\n"
        "2025-12-31T23:59:00Z,100,DE\n"  # before the job: holds until the change
        f"{(T0 + int(CHANGE_S * S)) / S},500,DE\n"  # Unix seconds
    )
    return path


def hand_co2_g(pue: float = 1.0) -> float:
    """gCO2 of synth's measured window: energy before the change x 100, after it x 500."""
    before_j = HOST_W * (CHANGE_S - WARMUP_S)
    after_j = HOST_W * (LENGTH_S - CHANGE_S)
    return (before_j * 100 + after_j * 500) / 3.6e6 * pue


def report(store_url: str, job_id: str, *args: str) -> dict[str, Any]:
    out = cli("report", job_id, "--json", "--store", store_url, *args)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_a_two_level_csv_gives_the_hand_calculated_co2(store_url: str, grid: Path) -> None:
    got = report(store_url, "synth", "--carbon-intensity", str(grid))
    assert got["measured"]["co2_g_per_run"] == pytest.approx(hand_co2_g(), rel=1e-9)  # 0.42 g
    effective = hand_co2_g() * 3.6e6 / (HOST_W * (LENGTH_S - WARMUP_S))
    assert got["policy"]["carbon_intensity_g_per_kwh"] == pytest.approx(effective)  # 336, not the mean 300
    assert any(n.startswith(f"carbon intensity from {grid}: applied interval by interval") for n in got["notes"])
    with_pue = report(store_url, "synth", "--carbon-intensity", str(grid), "--pue", "1.2")
    assert with_pue["measured"]["co2_g_per_run"] == pytest.approx(hand_co2_g(1.2), rel=1e-9)
    constant = report(store_url, "synth", "--carbon-intensity", "100")
    assert constant["measured"]["co2_g_per_run"] == pytest.approx(HOST_W * 50 * 100 / 3.6e6)
    assert not any("carbon intensity from" in n for n in constant["notes"])


def test_jobs_csv_and_the_python_api_apply_it_too(store_url: str, grid: Path) -> None:
    out = cli("jobs", "--csv", "--store", store_url, "--carbon-intensity", str(grid))
    assert out.returncode == 0, out.stderr
    rows = {r["job_id"]: r for r in csv.DictReader(io.StringIO(out.stdout))}
    assert float(rows["synth"]["co2_g_per_run"]) == pytest.approx(hand_co2_g(), rel=1e-9)
    with SqliteStore(store_url.removeprefix("sqlite://")) as store:
        r = build_report(store, "synth", ReportSettings(carbon_series=read_series(grid)))
    assert r.figures.co2_per_run_g == pytest.approx(hand_co2_g(), rel=1e-9)


def test_compare_takes_one_intensity_per_side(store_url: str, grid: Path) -> None:
    out = cli(
        "compare", "synth", "other", "--json", "--store", store_url,
        "--carbon-intensity-a", "100", "--carbon-intensity-b", str(grid),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    co2 = json.loads(out.stdout)["co2_g_per_million_units"]
    assert co2["a"] == pytest.approx(2.25e6 / 3.6e6 * 100)  # 2.25 J per unit at 100
    assert co2["b"] == pytest.approx(1.8e6 / 3.6e6 * 500)  # "other" runs after the change: 500 holds on


def test_a_window_before_the_first_row_says_so(store_url: str, tmp_path: Path) -> None:
    late = tmp_path / "late.csv"
    late.write_text(f"time,gco2_per_kwh\n{(T0 + 40 * S) / S},200\n")
    got = report(store_url, "synth", "--carbon-intensity", str(late))
    assert got["measured"]["co2_g_per_run"] == pytest.approx(HOST_W * 50 * 200 / 3.6e6)
    assert any("after the window began: its first value used before" in n for n in got["notes"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it as a CSV file"),
        ("when,value\n2026-01-01T00:00:00Z,100\n", "needs a header with time and gco2_per_kwh"),
        ("time,gco2_per_kwh\n2026-01-01T00:00:00Z,-5\n", "line 2: gco2_per_kwh '-5' is not a non-negative number"),
        ("time,gco2_per_kwh\nyesterday,5\n", "line 2: time 'yesterday' is not ISO 8601 or Unix seconds"),
        ("time,gco2_per_kwh\n", "no rows"),
        ("time,gco2_per_kwh\n1767225600,5\n1767225600,6\n", "two rows for one time"),
    ],
)
def test_bad_intensity_files_are_one_line(store_url: str, tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "bad.csv"
    if content is not None:
        path.write_text(content)
    out = cli("report", "synth", "--store", store_url, "--carbon-intensity", str(path))
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, out.stderr
    negative = cli("report", "synth", "--store", store_url, "--carbon-intensity", "-3")
    assert negative.returncode == 2 and "not a non-negative number" in negative.stderr


def test_varying_power_under_a_changing_intensity_is_weighted_by_energy(tmp_path: Path) -> None:
    """Power the test sets: 50 W for 20 s, then 150 W for 20 s; the grid goes from 100 to 500
    gCO2/kWh at 10.5 s (mid-sample). Weighted by energy the window's intensity is 447.5
    g/kWh, by time 395: only the energy weighting docs/reports.md names gives this CO2."""
    power = lambda t: 50.0 if t < 20 else 150.0  # noqa: E731
    store = write_job(tmp_path / "w.db", "vary", [Series("rapl", "cpu_package", "package-0", "counter", power)],
                      (0.0, 40.0))  # fmt: skip
    change_s = 10.5
    csv_path = tmp_path / "grid.csv"
    csv_path.write_text(f"time,gco2_per_kwh\n{BOUNDS_T0 / S - 60},100\n{BOUNDS_T0 / S + change_s},500\n")
    before_j, after_j = 50.0 * change_s, 50.0 * (20 - change_s) + 150.0 * 20
    truth_g = (before_j * 100 + after_j * 500) / 3.6e6
    time_weighted_g = (before_j + after_j) * (100 * change_s + 500 * (40 - change_s)) / 40 / 3.6e6
    assert abs(truth_g - time_weighted_g) > 0.1 * truth_g  # the data tells the two rules apart
    got = report(store, "vary", "--carbon-intensity", str(csv_path))
    # RAPL counters at 1 ms: the energy is exact to about 1e-5; the intensity is exact
    assert got["measured"]["co2_g_per_run"] == pytest.approx(truth_g, rel=1e-4)
    assert got["policy"]["carbon_intensity_g_per_kwh"] == pytest.approx(
        truth_g * 3.6e6 / (before_j + after_j), rel=1e-4
    )
