"""One reading of a hole (#43): samples the store lacks inside one agent stream.

Each sample carries ``cumulative_j``, its stream's running total, so the energy of a stretch
whose samples are missing is known: the next sample's total at its start minus the previous
sample's. ``report`` (both of its readings: the counters at the window's edges, a job alone;
every sample, a job sharing its host), ``export`` (its rows' ``energy_j`` and
``job_energy_j``) and the stored summary must count that energy, equally; a stretch no
counter can bridge (the agent restarted in it: a new stream, its total from 0) is a gap,
bounded and flagged on each of them.

The store holds samples of two RAPL channels at a known steady power, read every second by a
stand-in counter quantized to RAPL's 1 µJ; the truths are power x time, with the tolerance
that quantum allows (a window's energy is a difference of two counter reads per channel).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from cpu_events import cpu_periods
from typer.testing import CliRunner

from wattline import wire
from wattline.cli.main import app
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.jobs.jobs_view import utc_iso
from wattline.reports.summaries.summary import record_summary
from wattline.stores.sqlite.store import SqliteStore

S = 10**9
T0 = 1_767_225_600 * S  # 2026-01-01T00:00:00Z
HOST = "node-1"
QUANTUM_J = 1e-6  #: the stand-in counter's resolution (RAPL: energy_uj)
POWER_W = {"cpu_package": 100.0, "dram": 20.0}  #: steady, the truth of every figure
SAMPLES_S = (0, 100)  #: one sample a second ending at 1..100 s
JOB_S = (10.5, 80.5)  #: the job's window (edges inside samples: apportioned)
OTHER_S = (30.5, 60.5)  #: the other job's: the host shared
#: The samples ending in (a, b] s are not in the store: 12 s inside the job's window (and the
#: other job's), or 10 s across its close
HOLES = {"inside": (40, 52), "across the close": (75, 85)}
#: A window's energy is the difference of two counter reads per channel, each floored to the
#: quantum: off by less than a quantum per read; the rest is float rounding.
TOL_J = 2 * QUANTUM_J * len(POWER_W) + 1e-9


def counter(power_w: float, t_s: float) -> float:
    """The stand-in counter at ``t_s``: the true energy since 0, floored to the quantum."""
    return math.floor(power_w * t_s / QUANTUM_J + 1e-9) * QUANTUM_J


def write_store(path: Path, hole: tuple[int, int], *, restart: bool = False, shared: bool = False) -> str:
    """Samples with the ``hole`` (``restart``: the agent was down in it, its next stream
    counting from 0), the job "j" and, when ``shared``, the job "k"; both report their CPU
    time, the host's only busy processes (shared: one CPU each of two)."""
    with SqliteStore(path) as store:
        for component, power in POWER_W.items():
            batches = {name: wire.Batch(stream_id=name, seq=1, sent_ns=T0) for name in ("a", "b")}
            for t in range(SAMPLES_S[0] + 1, SAMPLES_S[1] + 1):
                stream = "b" if restart and t > hole[1] else "a"
                base = hole[1] if stream == "b" else 0
                lost = hole[0] < t <= hole[1]
                if lost and (restart or component == "cpu_package"):
                    continue  # the store lacks it; the counter went on counting (unless restarted)
                energy = counter(power, t) - counter(power, t - 1)
                batches[stream].samples.add(
                    source="rapl", component=component, device="package-0", quality=wire.QUALITY_COUNTER,
                    start_ns=T0 + (t - 1) * S, end_ns=T0 + t * S, energy_j=energy, power_w=energy,
                    cumulative_j=counter(power, t) - counter(power, base), healthy=True,
                )  # fmt: skip
            for batch in batches.values():
                batch.host.host_id = HOST
                if batch.samples:
                    assert store.write(batch).rejected == 0
        jobs = {"j": JOB_S, **({"k": OTHER_S} if shared else {})}
        events = wire.Batch(stream_id="events", seq=1, sent_ns=T0)
        events.host.host_id = HOST
        for job_id, (open_s, close_s) in jobs.items():
            b = EventBuilder(JobSpec(job_id, job_id, "inference", "items", {}))
            at = [T0 + round(x * S) for x in (open_s, close_s)]
            cuts = sorted({at[0], at[1], *(T0 + round(x * S) for x in OTHER_S if shared and open_s < x < close_s)})
            periods = []
            for lo, hi in itertools.pairwise(cuts):
                both = shared and T0 + OTHER_S[0] * S <= lo and hi <= T0 + OTHER_S[1] * S
                periods += cpu_periods(b, lo, hi, 1.0, 2.0 if both else 1.0)
            events.job_events.extend(
                [b.open(at[0]), b.phase("saturated", at[0]), b.units(1000, at[1]), *periods, b.close(0, at[1])]
            )
        assert store.write(events).rejected == 0
    return f"sqlite:///{path}"


def iso(t_s: float) -> str:
    return utc_iso(T0 + round(t_s * S))


def overlap_s(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(min(a[1], b[1]) - max(a[0], b[0]), 0.0)


def truth_j(shared: bool) -> float:
    """Job "j"'s energy: the host's power over its window, halved where "k" ran beside it."""
    both = overlap_s(JOB_S, OTHER_S) if shared else 0.0
    return sum(POWER_W.values()) * (JOB_S[1] - JOB_S[0] - both / 2)


def hole_j(hole: tuple[int, int], shared: bool) -> float:
    """Job "j"'s part of the ``hole`` (every channel): what the report charges it when the
    counter bridges it, what it is not charged when an agent restart left it unmeasured."""
    both = overlap_s(hole, overlap_window(JOB_S, OTHER_S)) if shared else 0.0
    return sum(POWER_W.values()) * (overlap_s(hole, JOB_S) - both / 2)


def overlap_window(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return max(a[0], b[0]), min(a[1], b[1])


def in_job(hole: tuple[int, int]) -> tuple[str, str]:
    """The hole's stretch inside the job's window, as export's rows stamp it (start, time)."""
    a, b = overlap_window(hole, JOB_S)
    return iso(a), iso(b)


def wattline(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return result.stdout


def report_json(store: str, job_id: str = "j") -> dict[str, Any]:
    data: dict[str, Any] = json.loads(wattline("report", job_id, "--store", store, "--json"))
    return data


def export_rows(store: str, job_id: str = "j") -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(wattline("export", job_id, "--csv", "-", "--store", store))))


def whole_run(data: dict[str, Any]) -> float:
    return float(data["warmup"]["energy_j"] + data["saturated"]["energy_j"])


@pytest.mark.parametrize("hole", HOLES.values(), ids=HOLES.keys())
@pytest.mark.parametrize("shared", [False, True], ids=["alone (edges read)", "shared (every sample read)"])
def test_a_hole_in_one_stream_is_bridged_by_its_counter_on_every_surface(
    tmp_path: Path, shared: bool, hole: tuple[int, int]
) -> None:
    store = write_store(tmp_path / "w.db", hole, shared=shared)
    truth = truth_j(shared)
    data = report_json(store)
    assert data["whole_run"]["energy_j"] == pytest.approx(truth, abs=TOL_J)
    assert data["saturated"]["energy_j"] == pytest.approx(truth, abs=TOL_J)
    assert data["saturated"]["energy_bound_terms_j"]["gaps"] == 0  # nothing unknown: the counter bridged it
    by_component = {c["component"]: c["energy_j"] for c in data["saturated"]["by_component"]}
    share = {
        k: w * (JOB_S[1] - JOB_S[0] - (overlap_s(JOB_S, OTHER_S) / 2 if shared else 0)) for k, w in POWER_W.items()
    }
    assert by_component == pytest.approx(share, abs=TOL_J)
    if shared:
        other = report_json(store, "k")
        assert other["whole_run"]["energy_j"] == pytest.approx(sum(POWER_W.values()) * 30 / 2, abs=TOL_J)
    (listed,) = [row for row in json.loads(wattline("jobs", "--store", store, "--json")) if row["id"] == "j"]
    assert listed["total_energy_j"] == pytest.approx(truth, abs=TOL_J)

    rows = export_rows(store)
    for window, key in (("measured", "saturated"), ("warmup", "warmup")):
        mine = [r for r in rows if r["window"] == window]
        assert sum(float(r["job_energy_j"]) for r in mine) == pytest.approx(data[key]["energy_j"], abs=TOL_J)
    host_j = sum(float(r["energy_j"]) for r in rows)  # the host's energy in the job's window
    assert host_j == pytest.approx(sum(POWER_W.values()) * (JOB_S[1] - JOB_S[0]), abs=TOL_J)
    bridged = [r for r in rows if r["origin"] == "bridged"]
    assert {(r["component"], r["start"], r["time"]) for r in bridged} == {("cpu_package", *in_job(hole))}
    row = bridged[0]
    assert sum(float(r["energy_j"]) for r in bridged) == pytest.approx(100.0 * overlap_s(hole, JOB_S), abs=TOL_J)
    assert float(row["power_w"]) == pytest.approx(POWER_W["cpu_package"], abs=TOL_J)
    assert row["healthy"] == "1" and row["quality"] == "counter"
    charged = hole_j(hole, shared) * POWER_W["cpu_package"] / sum(POWER_W.values())
    assert sum(float(r["job_energy_j"]) for r in bridged) == pytest.approx(charged, abs=TOL_J)  # split like a sample
    assert {r["origin"] for r in rows} == {"stored", "bridged"}

    with SqliteStore(tmp_path / "w.db") as sqlite:
        record_summary(sqlite, sqlite.write_summary, "j")
        summary = sqlite.job_summary("j")
    assert summary is not None
    assert summary.fields["energy_total_j"] == pytest.approx(truth, abs=TOL_J)
    assert summary.fields["energy_j"] == data["saturated"]["energy_j"]


@pytest.mark.parametrize("hole", HOLES.values(), ids=HOLES.keys())
@pytest.mark.parametrize("shared", [False, True], ids=["alone (edges read)", "shared (every sample read)"])
def test_a_hole_no_counter_bridges_is_a_bounded_flagged_gap_on_every_surface(
    tmp_path: Path, shared: bool, hole: tuple[int, int]
) -> None:
    """The agent was down for the hole and came back as a new stream, its totals from 0: what
    it did not measure is counted as no energy, held by the gap term and said."""
    store = write_store(tmp_path / "w.db", hole, restart=True, shared=shared)
    measured = truth_j(shared) - hole_j(hole, shared)  # what the samples hold
    data = report_json(store)
    sat = data["saturated"]
    assert sat["energy_j"] == pytest.approx(measured, abs=TOL_J)
    assert truth_j(shared) - sat["energy_j"] <= sat["energy_bound_j"]
    # each channel's gap: up to its highest power seen (the truth's) over the hole's time in the
    # job's window; the job's part of it where it shared the host
    gaps, unmeasured = sat["energy_bound_terms_j"]["gaps"], overlap_s(hole, JOB_S)
    assert hole_j(hole, shared) - TOL_J <= gaps <= sum(POWER_W.values()) * unmeasured + TOL_J
    if not shared:
        assert gaps == pytest.approx(sum(POWER_W.values()) * unmeasured, abs=TOL_J)
    said = f"agent restarted during the job; {hole[1] - hole[0]} s between its streams not measured"
    assert any(said in n for n in data["notes"]), data["notes"]

    rows = export_rows(store)
    for window, key in (("measured", "saturated"), ("warmup", "warmup")):
        mine = [r for r in rows if r["window"] == window]
        assert sum(float(r["job_energy_j"]) for r in mine) == pytest.approx(data[key]["energy_j"], abs=TOL_J)
    host_measured = sum(POWER_W.values()) * (JOB_S[1] - JOB_S[0] - unmeasured)
    assert sum(float(r["energy_j"]) for r in rows) == pytest.approx(host_measured, abs=TOL_J)
    gap_rows = [r for r in rows if r["origin"] == "gap"]
    assert {(r["component"], r["start"], r["time"]) for r in gap_rows} == {(c, *in_job(hole)) for c in POWER_W}
    assert {(r["energy_j"], r["job_energy_j"], r["power_w"], r["healthy"]) for r in gap_rows} == {
        ("0.0", "0.0", "", "0")
    }
    assert {r["origin"] for r in rows} == {"stored", "gap"}

    with SqliteStore(tmp_path / "w.db") as sqlite:
        record_summary(sqlite, sqlite.write_summary, "j")
        summary = sqlite.job_summary("j")
    assert summary is not None
    assert summary.fields["energy_total_j"] == pytest.approx(measured, abs=TOL_J)
    assert summary.fields["energy_bound_j"] == sat["energy_bound_j"]
    assert summary.fields["notes"] == len(data["notes"]) >= 1


@pytest.mark.parametrize("hole", HOLES.values(), ids=HOLES.keys())
def test_carbon_over_time_weighs_a_bridged_hole_where_it_lies(tmp_path: Path, hole: tuple[int, int]) -> None:
    """The grid's intensity steps from 100 to 500 gCO2/kWh inside the hole: the job's CO2 weighs
    each second's energy (the hole's from the counter, as the report counts it) by its own."""
    store = write_store(tmp_path / "w.db", hole)
    a, b = overlap_window(hole, JOB_S)
    step_s = int((a + b) / 2)  # a whole second: the file's Unix seconds are exact
    grid = tmp_path / "grid.csv"
    grid.write_text(f"time,gco2_per_kwh\n{T0 // S},100\n{T0 // S + step_s},500\n")
    data: dict[str, Any] = json.loads(
        wattline("report", "j", "--store", store, "--json", "--carbon-intensity", str(grid))
    )
    power = sum(POWER_W.values())
    truth_g = power * ((step_s - JOB_S[0]) * 100 + (JOB_S[1] - step_s) * 500) / 3.6e6
    assert data["saturated"]["co2_g_per_run"] == pytest.approx(truth_g, rel=1e-9)
