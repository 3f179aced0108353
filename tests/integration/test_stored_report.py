"""``wattline report SVC --from/--to`` reads a service's stored intervals (issue #44): the whole,
final intervals inside the window under the report's policy give their energy, only the window's
partial edges come from raw samples; ``--raw`` computes it all from raw samples. Both against the
truth the test constructs (tests/helpers/service_intervals_data.py: known power x time, known request
rate), on SQLite and InfluxDB 1.x (VictoriaMetrics: raw, and the report says why); a mismatched policy or a non-final interval falls back to raw,
an interval rewritten late is read in its newest form.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import clean_env
from schema_check import validator
from servers import Influxd, VictoriaMetrics, searchable
from service_intervals_data import CLOSE_S, EVERY_S, RECENT, S, rate, samples, truths, watts, write_service
from test_service_intervals import writer
from typer.testing import CliRunner

from wattline.cli.main import app
from wattline.reports.stored_intervals import STORED
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.sqlite.store import SqliteStore
from wattline.stores.victoria.store import VictoriaStore

#: Each test's job at its own time, multiples of EVERY_S apart.
BASES = (RECENT - 100_000 * S + n * 1000 * S for n in itertools.count())
#: The window asked: from 5 s to 45 s of the job (open 3 s, close 48 s): intervals [10, 20),
#: [20, 30), [30, 40) whole inside it, [5, 10) and [40, 45) partial.
FROM_S, TO_S = 5, 45


@dataclasses.dataclass
class Rig:
    store: SqliteStore | InfluxV1Store
    args: list[str]  #: the CLI's store options


@pytest.fixture(params=["sqlite", "influxdb1"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    if request.param == "sqlite":
        path = tmp_path / "w.db"
        with SqliteStore(path) as sqlite:
            yield Rig(sqlite, ["--store", f"sqlite:///{path}"])
    else:
        influxd: Influxd = request.getfixturevalue("influxd")
        db = influxd.new_database()
        with InfluxV1Store(influxd.url, db) as influx:
            influx.create_database()
            yield Rig(influx, ["--store", influxd.url, "--influx-api", "v1", "--influx-database", db])


def report(
    rig: Rig, job: str, base: int, *extra: str, rule: str = "exclusive", span: tuple[int, int] = (FROM_S, TO_S)
) -> dict[str, Any]:
    window = ["--from", str((base + span[0] * S) / S), "--to", str((base + span[1] * S) / S)]
    argv = ["report", job, "--json", "--share-rule", rule, *window, *rig.args, *extra]
    out = CliRunner().invoke(app, argv, env={**clean_env(), "COLUMNS": "200"})
    assert out.exit_code == 0, out.output[-2000:]
    r = json.loads(out.stdout)
    validator("report").validate(r)
    return r


def stored_part(r: dict[str, Any]) -> float | None:
    """The energy the report took from stored intervals (None: none)."""
    found = [c["energy_j"] for c in r["saturated"]["by_component"] if c["component"] == STORED]
    return found[0] if found else None


def check_truth(r: dict[str, Any]) -> None:
    """Energy, units and J per unit against the construction, within the report's bound (and the
    bound no wider than 1 % of the truth: counter samples that tile the window)."""
    energy = float(sum(watts(t) for t in range(FROM_S, TO_S)))
    units = float(sum(rate(t) for t in range(FROM_S, TO_S)))
    sat = r["saturated"]
    assert abs(sat["energy_j"] - energy) <= sat["energy_bound_j"] + 1e-9
    assert 0 <= sat["energy_bound_j"] <= 0.01 * energy
    assert r["units"]["total"] == pytest.approx(units, rel=1e-9)
    assert sat["j_per_unit"] == pytest.approx(energy / units, rel=0.01)
    assert sat["mean_power_w"] == pytest.approx(energy / (TO_S - FROM_S), rel=0.01)


def same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two reports' figures equal to 1e-9 relative."""
    for key in ("energy_j", "j_per_unit", "throughput_units_per_s", "mean_power_w", "seconds"):
        assert a["saturated"][key] == pytest.approx(b["saturated"][key], rel=1e-9), key
    assert a["units"]["total"] == pytest.approx(b["units"]["total"], rel=1e-9)
    assert a["latency"] == b["latency"]


def written(rig: Rig, job: str, host: str, base: int) -> None:
    """The whole job stored, and its intervals written by the collector's writer."""
    write_service(rig.store, job, host, base)
    w = writer(rig.store, [base + (CLOSE_S + 5) * S])
    assert w.write_due(job) == len(truths(base))


def test_stored_intervals_give_the_raw_figures(rig: Rig) -> None:
    base, job = next(BASES), f"st-{len(rig.args)}"
    written(rig, job, f"host-{job}", base)
    stored, raw = report(rig, job, base), report(rig, job, base, "--raw")
    # three whole intervals (30 s) stored, at the truth's power (100 W to 20 s, 50 W after)
    truth_stored = float(sum(watts(t) for t in range(10, 40)))
    assert stored_part(stored) == pytest.approx(truth_stored, rel=1e-9)
    assert any("energy from 3 stored intervals (0.5 of 0.6667 min)" in n for n in stored["notes"])
    assert stored_part(raw) is None and not any("stored interval" in n for n in raw["notes"])
    same(stored, raw)
    check_truth(stored)
    check_truth(raw)
    # the stored bound adds each interval's (its edges too): wider than the raw one, never narrower
    assert stored["saturated"]["energy_bound_j"] >= raw["saturated"]["energy_bound_j"]


def test_another_policy_or_a_non_final_interval_is_computed_raw(rig: Rig) -> None:
    base, job = next(BASES), f"pol-{len(rig.args)}"
    written(rig, job, f"host-{job}", base)
    other = report(rig, job, base, rule="equal")  # the intervals were computed under "exclusive"
    assert stored_part(other) is None
    assert any("no stored interval used (another policy)" in n for n in other["notes"])
    check_truth(other)

    middle = base + 20 * S  # [20, 30) marked not final, as a writer that will compute it again
    (point,) = [p for p in rig.store.service_intervals(job, middle, middle + 1)]
    assert rig.store.write_intervals([dataclasses.replace(point, fields={**point.fields, "final": 0.0})]).written == 1
    r = report(rig, job, base)
    assert stored_part(r) == pytest.approx(float(sum(watts(t) for t in (*range(10, 20), *range(30, 40)))), rel=1e-9)
    assert any("energy from 2 stored intervals" in n for n in r["notes"])
    same(r, report(rig, job, base, "--raw"))
    check_truth(r)


def test_an_interval_stored_under_a_policy_field_s_old_name_is_still_used(rig: Rig) -> None:
    """Intervals written before policy_deviceless_share was named policy_deviceless_fraction:
    the same policy, so still read (SQLite replaces the point: the old name alone; InfluxDB
    merges a rewrite's fields: both names)."""
    base, job = next(BASES), f"old-{len(rig.args)}"
    written(rig, job, f"host-{job}", base)
    points = rig.store.service_intervals(job, base, base + (CLOSE_S + 5) * S)
    renamed = [
        dataclasses.replace(p, fields={("policy_deviceless_share" if k == "policy_deviceless_fraction" else k): v
                                       for k, v in p.fields.items()})
        for p in points
    ]  # fmt: skip
    assert all("policy_deviceless_share" in p.fields for p in renamed)
    assert rig.store.write_intervals(renamed).written == len(points)
    r = report(rig, job, base)
    assert stored_part(r) == pytest.approx(float(sum(watts(t) for t in range(10, 40))), rel=1e-9)
    assert any("energy from 3 stored intervals" in n for n in r["notes"]), r["notes"]
    check_truth(r)


def test_an_interval_rewritten_late_is_read_in_its_newest_form(rig: Rig) -> None:
    base, job = next(BASES), f"late-{len(rig.args)}"
    host = f"host-{job}"
    write_service(rig.store, job, host, base, samples_to_s=25)  # the rest waits in the agent's spool
    wall = [base + int((CLOSE_S + 2 + 2.0) * S)]
    w = writer(rig.store, wall)
    assert w.write_due(job) == 5  # the wait is over: [20, 30) on written incomplete, not final
    early = report(rig, job, base)
    assert any("energy from 1 stored intervals" in n for n in early["notes"])  # [10, 20) only
    assert rig.store.write(samples(host, base, 25, CLOSE_S + 2, 2)).rejected == 0
    wall[0] += 5 * S
    assert w.write_due(job) == 3  # rewritten complete and final
    r = report(rig, job, base)
    assert stored_part(r) == pytest.approx(float(sum(watts(t) for t in range(10, 40))), rel=1e-9)
    same(r, report(rig, job, base, "--raw"))
    check_truth(r)


def test_a_store_whose_intervals_are_not_read_back_says_so(victoria_metrics: VictoriaMetrics) -> None:
    """VictoriaMetrics: the collector writes the intervals there, a report computes raw and says why."""
    base, job = next(BASES), "vm-svc"
    with VictoriaStore(victoria_metrics.url) as vm:
        rig = Rig(vm, ["--store", victoria_metrics.url])  # type: ignore[arg-type]
        write_service(vm, job, f"host-{job}", base)
        searchable(victoria_metrics.url)
        assert writer(vm, [base + (CLOSE_S + 5) * S]).write_due(job) == len(truths(base))
        r = report(rig, job, base)
    assert stored_part(r) is None
    assert any("no stored interval used (this store's intervals are not read back)" in n for n in r["notes"])
    check_truth(r)


def test_every_rows_from_the_stored_intervals(rig: Rig) -> None:
    base, job = next(BASES), f"ev-{len(rig.args)}"
    written(rig, job, f"host-{job}", base)
    # a window on the stored intervals' edges, rows of one interval each: [10, 20), [20, 30), [30, 40)
    every = ("--every", f"{EVERY_S}s")
    rows = report(rig, job, base, *every, span=(10, 40))["intervals"]["rows"]
    assert [(r["seconds"], r["energy_j"], r["units"]) for r in rows] == [
        pytest.approx((10, sum(watts(t) for t in range(a, a + 10)), sum(rate(t) for t in range(a, a + 10))), rel=1e-9)
        for a in (10, 20, 30)
    ]
    raw = report(rig, job, base, *every, "--raw", span=(10, 40))["intervals"]["rows"]
    for mine, theirs in zip(rows, raw, strict=True):
        for key in ("energy_j", "units", "j_per_unit", "throughput_per_s", "load"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-9), key
    # the rows read the stored points: one holding 500 J more shows in its row, and in its row only
    (point,) = rig.store.service_intervals(job, base + 20 * S, base + 20 * S + 1)
    more = {**point.fields, "energy_total_j": float(point.fields["energy_total_j"]) + 500.0}
    assert rig.store.write_intervals([dataclasses.replace(point, fields=more)]).written == 1
    again = report(rig, job, base, *every, span=(10, 40))["intervals"]["rows"]
    assert [r["energy_j"] - a["energy_j"] for r, a in zip(again, rows, strict=True)] == pytest.approx([0, 500, 0])
