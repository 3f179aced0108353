"""A report over a window asked (``--since``, ``--from``/``--to``; issue #44: a service never
ends, its figures are those of a stretch of it), against truths the workload sets.

A workload in three phases of known power and known units (``tests/helpers/window_workload.py``: a
RAPL zone stepped to 10, 40 and 20 W, units lines stamped every 0.1 s) runs under ``wattline
run`` sampling at 4 Hz. Each phase, asked as a window from its step to the next, has exactly its
lines' units (the lines sit on its edges: no bound on them) and the power set times its length
for energy; a window cutting through the lines has units within the bound it states, each way.
The energy's bound must hold the truth and be no wider than what the edges can cost: a window
edge inside a sample apportions it linearly, off by at most the power step times one interval.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from procs import CLI, clean_env
from schema_check import validator
from sysfs_trees import PowerAdvancer, Zone, powercap_tree
from typer.testing import CliRunner
from window_workload import LINE_S

from wattline.cli.main import app
from wattline.reports import economics
from wattline.reports.spans import Span

ZONE = "intel-rapl:0"
START_UJ = 10**11
INTERVAL_S = 0.25
#: How often PowerAdvancer moves the fake counter (its default period).
ADVANCE_S = 0.01
#: (watts, seconds, units per line) of each phase.
PHASES = ((10.0, 2.0, 2.0), (40.0, 2.0, 6.0), (20.0, 2.0, 3.0))
WORKLOAD = Path(__file__).parents[1] / "helpers" / "window_workload.py"


def _serve(
    tmp: Path, env: dict[str, str], job_id: str, phases: tuple[tuple[float, float, float], ...]
) -> dict[str, Any]:
    """Runs ``job_id`` through ``wattline run`` on a powercap tree of its own, its phases set by
    the workload; returns what the workload wrote (its steps and lines)."""
    root = powercap_tree(tmp / job_id, [Zone(ZONE, "package-0", START_UJ)])
    powered = PowerAdvancer(root, {ZONE: 0.0}, START_UJ, schedule=tmp / f"{job_id}.schedule")
    truth = tmp / f"{job_id}.json"
    try:
        out = subprocess.run(
            [*CLI, "run", "--job-id", job_id, "--units", "requests", "--no-report", "--share-rule", "exclusive",
             "--sysfs-root", str(root), "--source", "rapl", "--interval", str(INTERVAL_S), "--",
             sys.executable, str(WORKLOAD), str(tmp / f"{job_id}.schedule"), ZONE, str(truth),
             *(f"{w}:{s}:{u}" for w, s, u in phases)],
            capture_output=True, text=True, timeout=90, env=env,
        )  # fmt: skip
    finally:
        powered.close()
    assert out.returncode == 0, out.stderr[-3000:]
    # the longest the advancer went between two writes: what a read may lag the power set
    return {**json.loads(truth.read_text()), "lag_s": powered.lag_s}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], dict[str, Any]]]:
    """The job run once: (its environment for reports, what the workload wrote)."""
    tmp = tmp_path_factory.mktemp("window")
    env = {**clean_env(), "WATTLINE_STORE": f"sqlite:///{tmp / 'w.db'}", "COLUMNS": "200"}
    yield env, _serve(tmp, env, "svc", PHASES)


def report(env: dict[str, str], *window: str) -> dict[str, Any]:
    """``wattline report svc --json`` in this process (the store's path in ``env``)."""
    out = CliRunner().invoke(app, ["report", "svc", "--json", "--share-rule", "exclusive", *window], env=env)
    assert out.exit_code == 0, out.output[-2000:]
    r = json.loads(out.stdout)
    validator("report").validate(r)
    return r


@pytest.mark.parametrize("phase", range(len(PHASES)))
def test_a_window_from_step_to_step_has_its_phase_units_and_energy(
    served: tuple[dict[str, str], dict[str, Any]], phase: int
) -> None:
    env, truth = served
    (start, watts), (end, next_watts) = truth["steps"][phase], truth["steps"][phase + 1]
    units = sum(u for at, u in truth["lines"] if float(start) < float(at) <= float(end))
    seconds = float(end) - float(start)
    energy_truth = watts * seconds
    r = report(env, "--from", start, "--to", end)
    whole = r["whole_run"]
    print(f"phase {phase}: {whole['energy_j']:.3f} J (truth {energy_truth:.3f}), bound {whole['energy_bound_j']:.3f}")
    assert r["window"]["units_bound"] == 0.0
    assert whole["units"] == pytest.approx(units, rel=1e-9) and r["units"]["total"] == pytest.approx(units, rel=1e-9)
    assert whole["seconds"] == pytest.approx(seconds, abs=1e-6)
    # the edges: at most the power step at each times one sample interval, plus rounding
    edge_cost = (abs(watts - truth["steps"][phase - 1][1]) if phase else watts) + abs(next_watts - watts)
    # the fake counter moves every ADVANCE_S (longer where the machine stalled it): a read at
    # either edge lags it by up to that
    lag_j = 2 * max(w for w, _, _ in PHASES) * truth["lag_s"]
    assert abs(whole["energy_j"] - energy_truth) <= whole["energy_bound_j"] + lag_j
    assert whole["energy_bound_j"] <= edge_cost * INTERVAL_S + 1e-3
    j_per_unit = energy_truth / units
    assert abs(whole["j_per_unit"] - j_per_unit) <= whole["j_per_unit_bound"] + lag_j / units
    assert r["saturation"]["method"] == "window" and r["job"]["status"] == "closed"


def test_a_window_cutting_through_lines_bounds_its_units_both_ways(
    served: tuple[dict[str, str], dict[str, Any]],
) -> None:
    env, truth = served
    start, end = float(truth["steps"][1][0]) + 0.05, float(truth["steps"][2][0]) - 0.03
    lines = [(float(at), u) for at, u in truth["lines"]]
    inside = sum(u for at, u in lines if start < at <= end and at - 0.1 >= start - 1e-3)  # surely inside
    touching = sum(u for i, (at, u) in enumerate(lines) if at > start and (i == 0 or lines[i - 1][0] < end))
    r = report(env, "--from", repr(start), "--to", repr(end))
    units, bound = r["whole_run"]["units"], r["window"]["units_bound"]
    print(f"units {units:.3f} ± {bound:.3f}; between {inside} and {touching}")
    assert 0 < bound <= 2 * max(u for _, _, u in PHASES)  # at most one line at each edge
    assert units - bound <= inside + 1e-9 and touching - 1e-9 <= units + bound


def test_since_and_bad_windows(served: tuple[dict[str, str], dict[str, Any]]) -> None:
    env, truth = served
    r = report(env, "--since", "1000h")  # the whole job
    assert r["whole_run"]["units"] == pytest.approx(sum(u for _, u in truth["lines"]), rel=1e-9)
    for args, said in (
        (["--from", "2020-01-01T00:00:00Z", "--to", "2020-01-02T00:00:00Z"], "holds none of it"),
        (["--from", truth["steps"][2][0], "--to", truth["steps"][1][0]], "ends"),
        (["--since", "soon"], "--since"),
        (["--from", "yesterday"], "--from"),
        (["--since", "5m", "--from", truth["steps"][0][0]], "--since and --from"),
    ):
        out = subprocess.run([*CLI, "report", "svc", *args], capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 2 and said in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_intervals_give_energy_per_unit_against_load_and_at_saturation(
    served: tuple[dict[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    """Intervals of one phase's length from the first step: each holds its phase (off by the few
    ms between a phase's planned end and the next step), so its energy per unit is the phase's
    power over its units rate within its bound, its load the phase's rate of the highest."""
    env, truth = served
    steps = truth["steps"]
    curve = tmp_path / "curve.png"
    end = repr(float(steps[0][0]) + sum(seconds for _, seconds, _ in PHASES))
    r = report(env, "--from", steps[0][0], "--to", end, "--every", f"{PHASES[0][1]}s", "--curve", str(curve))
    rows = r["intervals"]["rows"]
    assert len(rows) == len(PHASES)
    top = max(per_line / LINE_S for _, _, per_line in PHASES)
    for row, (watts, _, per_line) in zip(rows, PHASES, strict=True):
        rate = per_line / LINE_S
        assert abs(row["j_per_unit"] - watts / rate) <= row["j_per_unit_bound"]
        assert row["estimate_fraction"] == 0.0  # RAPL: a counter, no model in it
        units_rel = row["units_bound"] / row["units"]
        assert row["load"] == pytest.approx(rate / top, rel=2 * units_rel + 0.01)
    sat = r["intervals"]["at_saturation"]
    assert sat["intervals"] == 1 and abs(sat["j_per_unit"] - 40.0 / 60.0) <= sat["j_per_unit_bound"]
    assert curve.stat().st_size > 10_000 and curve.read_bytes()[:4] == b"\x89PNG"
    # Over the whole job the last interval is the few ms after the last step: its units may all
    # lie outside it, so its J per unit has no upper bound (None), never a huge finite one.
    short = repr(float(steps[0][0]) + PHASES[0][1] + LINE_S / 2)
    rows = report(env, "--from", steps[0][0], "--to", short, "--every", f"{PHASES[0][1]}s")["intervals"]["rows"]
    for row in rows:
        if row["units"] - row["units_bound"] <= 1e-9 * row["units"]:
            assert row["j_per_unit_bound"] is None, row
        else:
            assert row["j_per_unit_bound"] < row["j_per_unit"], row  # a line's units at most each edge
    text = subprocess.run(
        [*CLI, "report", "svc", "--share-rule", "exclusive", "--every", "2s"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert text.returncode == 0 and "At saturation" in text.stdout and "Intervals of 2 s" in text.stdout
    for args, said in ((["--every", "0s"], "--every"), (["--curve", "x.png"], "needs --every")):
        out = subprocess.run([*CLI, "report", "svc", *args], capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 2 and said in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_compare_last_takes_each_jobs_last_stretch_as_report_does(
    served: tuple[dict[str, str], dict[str, Any]],
) -> None:
    """``compare A B --last D``: each side's figures are its report over its last D (one figure
    on every surface), and the output says so."""
    env, _ = served
    whole = report(env)
    end = whole["job"]["end"]
    out = subprocess.run(
        [*CLI, "compare", "svc", "svc", "--last", "2s", "--json", "--share-rule", "exclusive"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    cmp = json.loads(out.stdout)
    validator("compare").validate(cmp)
    assert cmp["a"]["window"]["to"] == end
    end_s = datetime.fromisoformat(end).timestamp()
    windowed = report(env, "--from", repr(end_s - 2.0), "--to", repr(end_s))
    # the end as printed is to the millisecond: a window up to 1 ms off, at most 40 W and 60
    # units/s over 2 s: energy and units each off by under 0.1 %
    assert cmp["j_per_unit"]["a"] == pytest.approx(windowed["whole_run"]["j_per_unit"], rel=2e-3)
    text = subprocess.run(
        [*CLI, "compare", "svc", "svc", "--last", "2s", "--share-rule", "exclusive"],
        capture_output=True, text=True, timeout=60, env={**env, "COLUMNS": "250"},
    )  # fmt: skip
    assert "A's figures are over" in text.stdout and "(the window asked)" in text.stdout


#: The second service (other hardware, say): its last phase draws more and serves more.
PHASES_B = ((15.0, 1.0, 1.0), (60.0, 2.5, 5.0))


def _window_truth(truth: dict[str, Any], start: float, end: float) -> tuple[float, float, float]:
    """(energy J, fewest units, most units) in (start, end] from what the workload set: a line
    tells the units done since the line before, so a line straddling an edge may count in part."""
    steps = [(float(at), watts) for at, watts in truth["steps"]]
    energy = sum(
        watts * max(0.0, min(end, nxt) - max(start, at))
        for (at, watts), (nxt, _) in zip(steps, [*steps[1:], (math.inf, 0.0)], strict=True)
    )
    lines = [(float(at), u) for at, u in truth["lines"]]
    inside = sum(u for (at, u), (before, _) in zip(lines[1:], lines, strict=False) if start <= before and at <= end)
    touching = sum(u for (at, u), (before, _) in zip(lines[1:], lines, strict=False) if at > start and before < end)
    return energy, inside, touching


def test_compare_of_two_services_at_an_sla_gives_the_studys_table(
    served: tuple[dict[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    """Two services compared over their last stretch at an SLA (issue #44): each side's J per unit
    and throughput are the power and units its workload set in the window the comparison took,
    and the fleets are the instances that SLA needs at those throughputs, their power that many
    times each side's mean power."""
    env, truth_a = served
    truth_b = _serve(tmp_path, env, "svc-b", PHASES_B)
    sla = 1_000_000.0
    out = subprocess.run(
        [*CLI, "compare", "svc", "svc-b", "--last", "2s", "--sla", f"{sla:g}", "--json", "--share-rule", "exclusive"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    cmp = json.loads(out.stdout)
    validator("compare").validate(cmp)
    for side, truth, label in ((cmp["a"], truth_a, "a"), (cmp["b"], truth_b, "b")):
        start = datetime.fromisoformat(side["window"]["from"]).timestamp()
        end = datetime.fromisoformat(side["window"]["to"]).timestamp()
        energy, fewest, most = _window_truth(truth, start, end)
        seconds = end - start
        # The job's end falls a few ms after its last step (to 0 W) inside a sample: the energy is
        # within the bound the side states, and that bound is no wider than its power times one
        # sample interval at each edge; the units lie between the lines wholly in the window and
        # those touching it (the printed window's 1 ms is far inside both).
        # The fake counter moves every ADVANCE_S (RAPL's every millisecond or so): a read lags it
        # by up to that at each edge, beyond what the product can know.
        j_per_unit, rel = cmp["j_per_unit"][label], side["energy_bound_rel"]
        lag_j = 2 * max(w for _, w in truth["steps"]) * truth["lag_s"]
        low, high = energy * (1 - rel) - lag_j, energy * (1 + rel) + lag_j
        assert low / most - 1e-9 <= j_per_unit <= high / fewest + 1e-9
        assert rel * energy <= 2 * max(w for _, w in truth["steps"]) * INTERVAL_S
        per_hour = cmp["throughput_per_instance_hour"][label]
        assert fewest / seconds * 3600 * (1 - 1e-3) <= per_hour <= most / seconds * 3600 * (1 + 1e-3)
        possible = {math.ceil(sla / (u / seconds * 3600)) for u in (fewest, most)}
        assert cmp["sla"]["instances"][label] in possible, (label, possible)
        instances = cmp["sla"]["instances"][label]
        assert (
            instances * low / seconds - 1e-6 <= cmp["sla"]["fleet_power_w"][label] <= instances * high / seconds + 1e-6
        )
    assert cmp["sla"]["instances"]["a"] > cmp["sla"]["instances"]["b"]  # b serves 50/s to a's 30/s
    text = subprocess.run(
        [*CLI, "compare", "svc", "svc-b", "--last", "2s", "--sla", f"{sla:g}", "--share-rule", "exclusive"],
        capture_output=True, text=True, timeout=60, env={**env, "COLUMNS": "250"},
    )  # fmt: skip
    assert text.returncode == 0 and "instances" in text.stdout.lower()


@pytest.mark.parametrize("units", [5.095, 0.1 + 0.2, 1e6 / 3])
def test_units_that_may_all_lie_outside_leave_j_per_unit_unbounded(units: float) -> None:
    """A span whose units' bound is all of them (a short last interval: its one line may belong
    to the next), give or take the float rounding of the two sums, has no upper bound per unit:
    None, never 1e17 % (which an interval of 0.08 s drew across the whole curve)."""
    figures = economics.figures(economics.Window(units=units, seconds=0.08, energy_j=0.015))
    for bound in (units, units * (1 - 1e-15), units + 1e-12):
        assert Span("t", 0.08, units, (), figures, units_bound=bound).per_unit_rel is None
    assert Span("t", 0.08, units, (), figures, units_bound=units / 2).per_unit_rel == pytest.approx(1.0)
