"""Figures, the HTML page and CSV of a stored job with known power and units
(tests/helpers/synthetic_job.py), through the CLI as a user runs it."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from synthetic_job import BUSY_RATE, T0, WARM_RATE, WARMUP_S, S, add_job, make_store, truth

from wattline.reports.build import build_report
from wattline.reports.timeline import build_timeline
from wattline.stores.sqlite.store import SqliteStore

WATTLINE = [sys.executable, "-m", "wattline.cli.main"]
JOBS = {"synth": ("node-1", "node-2"), "other": ("node-1",)}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WATTLINE, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_store(tmp_path_factory.mktemp("store") / "w.db", JOBS)


def report_of(store_url: str, job_id: str, *args: str) -> dict[str, Any]:
    out = cli("report", job_id, "--json", "--store", store_url, *args)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_timeline_holds_the_known_power_and_throughput(store_url: str) -> None:
    with SqliteStore(store_url.removeprefix("sqlite://")) as store:
        report = build_report(store, "synth")
        timeline = build_timeline(store, report)
    assert timeline.bins == 60  # one bin per 1 s sample over the 60 s job
    for component in ("cpu_package", "dram"):
        got = timeline.energy_j(("node-1", component, "counter")) + timeline.energy_j(("node-2", component, "counter"))
        assert got == pytest.approx(truth("warmup", component, 2) + truth("measured", component, 2), rel=1e-12)
    assert timeline.energy_j(("node-2", "nic", "model")) == pytest.approx(1.5 * 60)
    assert not any(c == "cpu_core" for _h, c, _q in timeline.power_w)  # a sub-domain: not in totals
    assert ("node-1", "rapl", "cpu_core", "package-0/core", "counter") in timeline.series  # but in provenance
    assert timeline.power_w[("node-1", "cpu_package", "counter")][:WARMUP_S] == pytest.approx([10.0] * WARMUP_S)
    assert timeline.power_w[("node-2", "cpu_package", "counter")][WARMUP_S:] == pytest.approx([45.0] * 50)
    # both hosts count their units: the job's throughput is their sum
    assert timeline.units_per_s == pytest.approx([2 * WARM_RATE] * WARMUP_S + [2 * BUSY_RATE] * 50)


def test_plot_png_and_svg_show_estimates_warmup_saturation_and_throughput(store_url: str, tmp_path: Path) -> None:
    png, svg, by_host = tmp_path / "p.png", tmp_path / "p.svg", tmp_path / "h.svg"
    for path, extra in ((png, ()), (svg, ()), (by_host, ("--by-host",))):
        out = cli("report", "synth", "--store", store_url, "--plot", str(path), *extra)
        assert out.returncode == 0, out.stderr
        assert f"wrote {path}" in out.stderr and "Saturated window" in out.stdout  # the table still prints
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png.read_bytes()[16:20], "big"), int.from_bytes(png.read_bytes()[20:24], "big")
    assert (width, height) == (1000, 520)
    text = _svg_text(svg)
    assert "nic — ESTIMATE (model)" in text and "cpu_package (counter, measured)" in text
    assert "warm-up (excluded from figures)" in text and "saturated at 10.0 s" in text
    assert (
        "throughput (documents/s)" in text
        and "saturated window: 4.5 kJ, 2.25 J/document (partly ESTIMATE (3 % model))" in text
    )  # 1.5 x (30+5+1) x 50
    assert "<pattern" in svg.read_text()  # the estimate is hatched
    host_text = _svg_text(by_host)
    assert "node-1 (3% ESTIMATE)" in host_text and "node-2 (3% ESTIMATE)" in host_text
    assert "power (W) per host" in host_text


def _svg_text(path: Path) -> str:
    root = ET.fromstring(path.read_text())  # well-formed SVG
    return " ".join(t.strip() for t in root.itertext() if t.strip())


def test_bad_plot_paths_and_a_missing_extra_are_one_line(store_url: str, tmp_path: Path) -> None:
    for args in (("--plot", "x.jpg"), ("--html", "x.pdf"), ("--plot", str(tmp_path / "no" / "dir" / "x.png"))):
        out = cli("report", "synth", "--store", store_url, *args)
        assert out.returncode == 2, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    blocker = tmp_path / "block" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(blocker.parent), os.environ.get("PYTHONPATH", "")])}
    out = cli("report", "synth", "--store", store_url, "--plot", str(tmp_path / "p.png"), env=env)
    assert out.returncode == 2
    assert out.stderr.strip() == "wattline: error: plots need matplotlib: pip install 'wattline[plot]'"
    assert cli("report", "synth", "--store", store_url, env=env).returncode == 0  # only plots need it


def test_compare_plot_draws_the_study_bars_with_each_change(store_url: str, tmp_path: Path) -> None:
    svg = tmp_path / "c.svg"
    args = ("--sla", "100000", "--price-a", "1", "--price-b", "0.5", "--work", "1000000", "--store", store_url)
    out = cli("compare", "synth", "other", *args, "--plot", str(svg))
    assert out.returncode == 0, out.stderr
    data = json.loads(cli("compare", "synth", "other", *args, "--json").stdout)
    text = _svg_text(svg)
    for title, key in (
        ("throughput per instance", "throughput_per_instance_hour"),
        ("energy per million documents", "kwh_per_million_units"),
        ("cost per million documents", "cost_per_million_units_usd"),
    ):
        assert f"{title} B vs A: {data[key]['change_pct']:+.0f} %" in text
    assert f"instances for the SLA B vs A: {data['sla']['instances']['change_pct']:+.0f} %" in text
    assert f"cost for the work B vs A: {data['work']['cost']['change_pct']:+.0f} %" in text
    assert "CO2" not in text  # no carbon intensity given: no panel without figures
    assert "A: 3% of the energy is a MODEL ESTIMATE" in text and "B: 3% of the energy" in text  # footnotes


def test_jobs_csv_loads_and_agrees_with_report_json(store_url: str) -> None:
    out = cli("jobs", "--csv", "--store", store_url, "--price", "2", "--carbon-intensity", "400")
    assert out.returncode == 0, out.stderr
    rows = {r["job_id"]: r for r in csv.DictReader(io.StringIO(out.stdout))}
    assert sorted(rows) == ["other", "synth"]
    for job_id, hosts in JOBS.items():
        report = report_of(store_url, job_id, "--price", "2", "--carbon-intensity", "400")
        row = rows[job_id]
        assert float(row["energy_measured_j"]) == report["measured"]["energy_j"]
        assert (row["saturated_s"], row["units_saturated"], row["energy_saturated_j"]) == (
            row["measured_s"],
            row["units_measured"],
            row["energy_measured_j"],
        )  # the deprecated columns: the same values under their new names
        assert all(row[f"share_{q}"] == row[f"fraction_{q}"] for q in ("counter", "integrated", "model"))
        assert float(row["units_saturated"]) == report["units"]["saturated"]
        assert float(row["energy_total_j"]) == report["measured"]["energy_j"] + report["warmup"]["energy_j"]
        assert float(row["j_per_unit"]) == report["measured"]["j_per_unit"]
        assert float(row["kwh_per_million_units"]) == report["measured"]["kwh_per_million_units"]
        assert float(row["cost_usd_per_run"]) == report["measured"]["cost_usd_per_run"]
        assert float(row["co2_g_per_run"]) == report["measured"]["co2_g_per_run"]
        assert float(row["fraction_model"]) == report["measured"]["coverage"]["fractions"]["model"]
        assert row["hosts"] == " ".join(hosts) and row["saturated_at"] == report["saturation"]["at"]
        assert row["status"] == "closed" and row["exit_code"] == "0" and row["unit"] == "documents"
    measured = sum(truth("measured", c, 2) for c in ("cpu_package", "dram", "nic"))
    assert float(rows["synth"]["energy_measured_j"]) == pytest.approx(measured)
    assert float(rows["synth"]["energy_saturated_j"]) == pytest.approx(measured)
    assert (rows["synth"]["label_SLURM_JOB_ID"], rows["other"]["label_SLURM_JOB_ID"]) == ("4242", "4243")


def test_export_csv_rows_sum_to_the_report(store_url: str, tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    out = cli("export", "synth", "--csv", str(path), "--store", store_url)
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == [
        "time", "start", "host", "source", "component", "device", "quality", "window", "in_total",
        "energy_j", "power_w", "utilization", "healthy", "job_energy_j", "origin",
    ]  # fmt: skip
    assert {r["origin"] for r in rows} == {"stored"}  # no sample lacking, none unmeasured
    assert len(rows) == 2 * 4 * 60  # 2 hosts x 4 series x 60 one-second samples inside the window
    report = report_of(store_url, "synth")
    for window in ("warmup", "measured"):
        got = sum(float(r["energy_j"]) for r in rows if r["window"] == window and r["in_total"] == "1")
        assert got == pytest.approx(report[window]["energy_j"], rel=1e-12)
        charged = sum(float(r["job_energy_j"]) for r in rows if r["window"] == window)
        assert charged == pytest.approx(report[window]["energy_j"], rel=1e-12)  # alone on its hosts: all of it
        by_host = {h["host"]: h["energy_j"] for h in report[window]["by_host"]}
        for host in ("node-1", "node-2"):
            mine = [r for r in rows if r["window"] == window and r["in_total"] == "1" and r["host"] == host]
            assert sum(float(r["energy_j"]) for r in mine) == pytest.approx(by_host[host], rel=1e-12)
    assert {r["quality"] for r in rows if r["component"] == "nic"} == {"model"}
    assert {r["in_total"] for r in rows if r["component"] == "cpu_core"} == {"0"}
    to_stdout = cli("export", "synth", "--csv", "-", "--store", store_url)
    assert to_stdout.stdout == path.read_text()
    missing = cli("export", "nope", "--csv", "-", "--store", store_url)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def chromium(page: Path, shot: Path) -> list[str]:
    """Render ``page`` in headless chromium to ``shot``; its console messages."""
    out = subprocess.run(
        [
            "chromium", "--headless", "--disable-gpu", "--no-sandbox", f"--screenshot={shot}",
            "--window-size=1100,1600", "--enable-logging=stderr", "--v=0", f"--user-data-dir={shot.parent / 'prof'}",
            page.resolve().as_uri(),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    return [line for line in out.stderr.splitlines() if ":CONSOLE" in line]


def test_html_page_is_self_contained_and_renders_in_chromium(store_url: str, tmp_path: Path) -> None:
    page, shot = tmp_path / "r.html", tmp_path / "shot.png"
    out = cli("report", "synth", "--store", store_url, "--html", str(page), "--carbon-intensity", "300")
    assert out.returncode == 0, out.stderr
    html = page.read_text()
    # nothing fetched: no script, style sheet, image or font; references only within the page (#id)
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\((?!#)|\b(src|href)=\"(?!#)", html, re.I)
    assert "url(#" in html  # the hatch pattern, referenced inside the page
    assert html.count("<svg") == 1 and "nic — ESTIMATE (model)" in html  # the figure, inline
    for text in ("Saturated window", "Energy by component", "Coverage", "Notes", "Provenance", "wattline.report/1"):
        assert text in html
    assert "4.5 kJ ± 2.8 %  counter + partly ESTIMATE (3 % model)" in html and "300 gCO2/kWh" in html
    assert "rapl</td><td>cpu_core" in html  # every sampled series is listed
    assert chromium(page, shot) == []
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (1600, 1100)
    colours = {tuple(p) for p in pixels[::7, ::7, :3].reshape(-1, 3).round(2).tolist()}
    assert len(colours) > 20  # not blank: text, tables and the figure's colours
    # the check can fail: a page with a script error is caught
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><p>x</p><script>throw new Error('broken page')</script>")
    assert any("broken page" in line for line in chromium(bad, tmp_path / "bad.png"))


def test_the_cli_agent_and_collector_never_import_matplotlib() -> None:
    code = (
        "import sys, wattline.cli.main, wattline.agent.__main__, wattline.collector.daemon, wattline.reports.output.page;"
        "assert 'matplotlib' not in sys.modules, 'imported'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_a_shared_host_is_said_to_show_host_power(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with SqliteStore(path) as store:
        add_job(store, "synth", ("node-1",))
        add_job(store, "overlap", ("node-1",), T0 + 30 * S)  # shares node-1 for synth's last 30 s
    svg = tmp_path / "p.svg"
    out = cli("report", "synth", "--store", f"sqlite:///{path}", "--plot", str(svg))
    assert out.returncode == 0, out.stderr
    assert "hosts shared with other jobs: curves are host power" in _svg_text(svg)


def test_export_takes_a_job_ref_like_report(store_url: str, tmp_path: Path) -> None:
    """``export`` finds a job by name, prefix or ``latest`` as ``report`` does."""
    by_id = cli("export", "synth", "--csv", "-", "--store", store_url)
    assert by_id.returncode == 0, by_id.stderr
    for ref in ("name synth", "syn"):  # its name (latest run) and a unique id prefix
        out = cli("export", ref, "--csv", "-", "--store", store_url)
        assert out.returncode == 0 and out.stdout == by_id.stdout, out.stderr
    missing = cli("export", "nothing-like-it", "--csv", "-", "--store", store_url)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
