"""The CLI as users read it (issue #15): jobs findable by id, prefix, name or ``latest``;
a status column; whole ids at 80 and 160 columns; reports that cannot be misread (ESTIMATE
on every figure derived from a model, the whole run beside the measured window, "total"
and "above idle", SI prefixes, percent changes from the figures shown, exit status).

Stores are filled with known truth: a synthetic host's samples at a known power through
the real agent pipeline (:mod:`pipeline`), job events from :class:`EventBuilder`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cpu_events import cpu_use
from pipeline import T0_NS, SyntheticHost, ZoneSpec
from typer.testing import CliRunner

from wattline import wire
from wattline.agent.clock import StampClock
from wattline.agent.sampler import Sampler
from wattline.agent.sources.cpu_model import CpuModelSource, Options
from wattline.cli.main import app, main
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.reports import economics
from wattline.reports.output import quantities as q
from wattline.stores.factory import open_store
from wattline.stores.sqlite.store import SqliteStore

S = 10**9
WHOLE_J = 100.0 * 60  # every job below: 60 s at 100 W


class Host:
    """A synthetic host at a known power whose samples and job events go into one SQLite store."""

    def __init__(self, root: Path, model_w: float | None = None, counter_too: bool = False) -> None:
        self.host = SyntheticHost(root / "h", "h1", [ZoneSpec("intel-rapl:0", "package-0", 100.0)])
        if model_w is not None:  # a host without counters: a CPU power model at model_w
            clock = StampClock(wall=lambda: self.host.t_ns, mono=lambda: self.host.t_ns - T0_NS)
            source = CpuModelSource(options=Options(tdp_w=model_w, idle_w=0.0), utilization=lambda: 1.0)
            source.discover()
            sources = [*self.host.sources, source] if counter_too else [source]
            self.host.sampler = Sampler(sources, self.host.spool.add_samples, clock)
            self.host.sampler.tick()

    def job(
        self,
        job_id: str,
        name: str,
        *,
        units: str = "items",
        rate: float = 10.0,
        seconds: int = 60,
        warmup: int = 10,
        exit_code: int | None = 0,
        idle_s: int = 0,
    ) -> None:
        """``idle_s`` without a job, then a job of ``seconds`` counting ``rate`` units a second,
        marked saturated after ``warmup``; closed with ``exit_code`` (None: never closed)."""
        if idle_s:
            self.host.advance(idle_s, idle_s)
        b = EventBuilder(JobSpec(job_id, name, "inference", units))
        self.host.spool.add_job_events([b.open(self.host.t_ns)])
        for second in range(seconds):
            self.host.advance(1.0)
            # as its wrapper reads it: its processes were the host's only busy ones
            self.host.spool.add_job_events(
                [b.units(rate, self.host.t_ns), cpu_use(b, self.host.t_ns - S, self.host.t_ns)]
            )
            if second + 1 == warmup:
                self.host.spool.add_job_events([b.phase("saturated", self.host.t_ns)])
        if exit_code is not None:
            self.host.spool.add_job_events([b.close(exit_code, self.host.t_ns)])

    def store(self, path: Path) -> str:
        self.host.spool.seal()
        with open_store(f"sqlite:///{path}") as store:
            while (batch := self.host.spool.peek()) is not None:
                store.write(batch)
                self.host.spool.ack(batch.seq)
        self.host.close()
        return f"sqlite:///{path}"


def cli(store: str, *args: str, columns: int = 200) -> Any:
    return CliRunner().invoke(app, [*args, "--store", store], env={"COLUMNS": str(columns)})


def ok(store: str, *args: str, columns: int = 200) -> str:
    out = cli(store, *args, columns=columns)
    assert out.exit_code == 0, out.output
    return str(out.output)


LONG_IDS = ["resnet50-20261203T092504-4f2a9c", "resnet50-20261203T101500-77be01", "bert-large-20261203T111111-0c0c0c"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Three closed jobs (two runs of resnet50; bert-large failed with 3), then one killed by
    SIGTERM (143) and one never closed (abandoned long ago)."""
    tmp = tmp_path_factory.mktemp("fleet")
    host = Host(tmp)
    host.job(LONG_IDS[0], "resnet50")
    host.job(LONG_IDS[1], "resnet50", idle_s=5)
    host.job(LONG_IDS[2], "bert-large", exit_code=3, idle_s=5)
    host.job("sig-1", "sleeper", exit_code=143, idle_s=5)
    host.job("gone-1", "lost", exit_code=None, idle_s=5)
    yield host.store(tmp / "w.db")


@pytest.fixture
def wattline(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """``wattline ARGS --store STORE`` through the console entry point: (status, stdout, stderr)."""

    def call(store: str, *argv: str, columns: int = 200) -> tuple[int, str, str]:
        monkeypatch.setenv("COLUMNS", str(columns))
        monkeypatch.setattr(sys, "argv", ["wattline", *argv, "--store", store])
        with pytest.raises(SystemExit) as exit_info:
            main()
        code = exit_info.value.code
        out, err = capsys.readouterr()
        return (code if isinstance(code, int) else 1), out, err

    return call


# -- figures as people read them ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (q.si(0.0008, "J"), "800 µJ"),
        (q.si(1_738_946, "J"), "1.739 MJ"),
        (q.si(152.34567, "J"), "152.3 J"),
        (q.si(999.96, "J"), "1 kJ"),  # rounding to 4 digits moves it to the next prefix
        (q.si(0.0, "J"), "0 J"),
        (q.si(12.5, "W"), "12.5 W"),
        (q.kwh(2.263e-07), "226.3 µWh"),
        (q.kwh(2.778), "2.778 kWh"),
        (q.kwh(2300.0), "2.3 MWh"),
        (q.co2(0.5), "500 mgCO2"),
        (q.co2(1234.0), "1.234 kgCO2"),
        (q.co2(3.4e6), "3.4 tCO2"),
        (q.usd(0.004), "0.004 USD"),
        (q.usd(0.0412345), "0.04123 USD"),
        (q.usd(1234.567), "1,234.57 USD"),
        (q.usd(0.99996), "1.00 USD"),
        (q.count(0.4), "0.4"),
        (q.count(1_738_946), "1,738,946"),
        (q.count(12.3456, "items/s"), "12.35 items/s"),
        (q.rate(17_935_665, "documents/h"), "17.94 million documents/h"),
        (q.rate(36_000, "items/h"), "36,000 items/h"),
        (q.duration(0.0123), "12.3 ms"),
        (q.duration(125), "2 min 05 s"),
        (q.duration(3 * 3600 + 12 * 60), "3 h 12 min"),
        (q.si(None, "J"), "n/a"),
        (q.fraction(0.001), "<1 %"),
        (q.fraction(0.9996), ">99 %"),
        (q.fraction(1 / 3), "33 %"),
    ],
)
def test_si_formatting(text: str, expected: str) -> None:
    assert text == expected


@pytest.mark.parametrize("exponent", range(-14, 16))
@pytest.mark.parametrize("mantissa", [1.0, 2.263, 9.9996])
def test_a_nonzero_figure_never_prints_as_zero(exponent: int, mantissa: float) -> None:
    x = mantissa * 10.0**exponent
    for text in (q.si(x, "J"), q.kwh(x), q.co2(x), q.usd(x), q.count(x)):
        assert re.match(r"^[0,.]+ ", text + " ") is None, text
        assert "e-" not in text and "e+" not in text, text


# -- finding a job --------------------------------------------------------------------------


@pytest.mark.parametrize("columns", [80, 160])
def test_jobs_shows_whole_ids_at_any_width(fleet: str, wattline: Any, columns: int) -> None:
    code, out, err = wattline(fleet, "jobs", columns=columns)
    assert code == 0, err
    lines = out.splitlines()
    for job_id in [*LONG_IDS, "sig-1", "gone-1"]:
        assert any(re.search(rf"(^|\s){re.escape(job_id)}(\s|$)", line) for line in lines), (job_id, out)
    assert max(len(line) for line in lines) <= columns, out
    assert "…" not in out


def test_status_column(fleet: str, wattline: Any) -> None:
    code, out, _ = wattline(fleet, "jobs", columns=250)
    assert code == 0
    row = {job_id: next(line for line in out.splitlines() if job_id in line) for job_id in [*LONG_IDS, "sig-1"]}
    assert "ok (exit 0)" in row[LONG_IDS[0]] and "ok (exit 0)" in row[LONG_IDS[1]]
    assert "failed (exit 3)" in row[LONG_IDS[2]]
    assert "failed (exit 143, SIGTERM)" in row["sig-1"]
    gone = next(line for line in out.splitlines() if "gone-1" in line)
    assert "abandoned (no close; last heard at 2026-01-01T00:05:20.000+00:00)" in gone  # its last units event


def test_jobs_without_energy_prints_no_pretend_figures(fleet: str, wattline: Any) -> None:
    code, out, _ = wattline(fleet, "jobs", "--no-energy", columns=250)
    assert code == 0
    assert "0.0 s" not in out and "?" not in out and " J" not in out and "energy" not in out
    assert out.count("1 min 00 s") == 5 and out.count("600 items") == 5  # what is known without energy


@pytest.mark.parametrize(
    ("ref", "job_id"),
    [
        (LONG_IDS[0], LONG_IDS[0]),  # the id
        ("bert", LONG_IDS[2]),  # a unique prefix
        ("resnet50-20261203T09", LONG_IDS[0]),
        ("resnet50", LONG_IDS[1]),  # a name: its latest run (though also a prefix of both)
        ("latest", "gone-1"),  # the job opened last
    ],
)
def test_a_job_is_found_by_id_prefix_name_or_latest(fleet: str, wattline: Any, ref: str, job_id: str) -> None:
    code, out, err = wattline(fleet, "report", ref, "--json")
    assert code == 0, err
    assert json.loads(out)["job"]["id"] == job_id


def test_an_ambiguous_or_unknown_job_is_one_line_and_exit_2(fleet: str, wattline: Any) -> None:
    code, out, err = wattline(fleet, "report", "resnet50-2026")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "ambiguous" in err, err
    assert LONG_IDS[0] in err and LONG_IDS[1] in err and LONG_IDS[2] not in err
    code, _, err = wattline(fleet, "compare", "nope", "bert")
    assert code == 2 and err.count("\n") == 1 and "no job 'nope'" in err, err


# -- reports that cannot be misread ---------------------------------------------------------


def table_rows(out: str) -> dict[str, list[str]]:
    """A rich table's rows: first cell -> the other cells (one line per row)."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in re.split("[│┃]", line)[1:-1]]
        if len(cells) > 1:
            rows[cells[0]] = cells[1:]
    return rows


def test_report_shows_the_whole_run_beside_the_measured_window_and_the_exit_status(fleet: str, wattline: Any) -> None:
    code, out, _ = wattline(fleet, "report", LONG_IDS[2], "--price", "3")
    assert code == 0
    assert "Status: failed (exit 3)" in out
    rows = table_rows(out)
    assert rows["figure"] == ["saturated window", "whole run"]
    assert rows["duration"] == ["50 s", "1 min 00 s"]
    assert rows["items"] == ["500", "600"]
    # 100 W x 50 s, x 60 s; RAPL lags up to 1 ms at each edge: 0.2 J in 5 kJ, the whole run 2 windows
    assert rows["energy"] == ["5 kJ ± 0.004 %  counter", "6 kJ ± 0.0067 %  counter"]
    assert rows["energy per item"] == ["10 J ± 0.004 %", "10 J ± 0.0067 %"]
    assert rows["cost per run (instance time x price)"] == ["0.04167 USD", "0.05 USD"]  # 3 USD/h x 50 s, 60 s
    code, out, _ = wattline(fleet, "report", LONG_IDS[2], "--json")
    data = json.loads(out)
    assert data["job"]["exit_code"] == 3 and data["job"]["status_text"] == "failed (exit 3)"
    whole = data["whole_run"]
    assert whole["energy_j"] == pytest.approx(WHOLE_J, rel=1e-9)
    assert (whole["seconds"], whole["units"]) == (60.0, 600.0)
    assert whole["j_per_unit"] == pytest.approx(10.0, rel=1e-9) and whole["estimate"] is False
    assert data["measured"]["energy_j"] == pytest.approx(5000.0, rel=1e-9)


def test_every_figure_derived_from_a_model_says_estimate(tmp_path: Path, wattline: Any) -> None:
    host = Host(tmp_path, model_w=50.0)
    host.job("model-1", "model", units="tokens")
    store = host.store(tmp_path / "w.db")
    code, out, _ = wattline(store, "report", "model-1", "--price", "3", "--carbon-intensity", "400")
    assert code == 0
    rows = table_rows(out)
    derived = [
        "energy",
        "mean power",
        "energy per token",
        "per million tokens",
        "CO2 per run",
        "CO2 per million tokens",
    ]
    for name in derived:
        assert all("ESTIMATE" in cell for cell in rows[name]), (name, rows[name])
    assert rows["energy per token"] == ["5 J ± 65 % ESTIMATE", "5 J ± 65 % ESTIMATE"]  # 50 W x 50 s / 500, x 60 s / 600
    for name in ("cost per run (instance time x price)", "cost per million tokens", "duration", "tokens"):
        assert not any("ESTIMATE" in cell for cell in rows[name]), (name, rows[name])  # time x price: no model
    code, out, _ = wattline(store, "report", "model-1", "--json")
    data = json.loads(out)
    assert data["measured"]["estimate"] is True and data["measured"]["estimate_fraction"] == 1.0
    assert data["whole_run"]["estimate"] is True and data["whole_run"]["energy_j"] == pytest.approx(50.0 * 60)
    code, out, _ = wattline(store, "jobs", columns=200)
    row = next(line for line in out.splitlines() if "model-1" in line)
    assert row.count("ESTIMATE") == 2, row  # the whole run's energy and J per unit


def test_idle_subtract_names_total_and_above_idle(tmp_path: Path, wattline: Any) -> None:
    """40 W idle for a minute, then the job at 100 W: above idle is 60 W."""
    host = Host(tmp_path)
    host.host.zones[0].power_w = 40.0
    host.host.advance(60.0, 60)
    host.host.zones[0].power_w = 100.0
    host.job("j-1", "j")
    store = host.store(tmp_path / "w.db")
    code, out, _ = wattline(store, "report", "j-1", "--idle", "subtract")
    assert code == 0
    rows = table_rows(out)
    assert [c.split(" ± ")[0] for c in rows["energy (total)"]] == ["5 kJ", "6 kJ"]
    assert [c.split(" ± ")[0] for c in rows["energy above idle"]] == ["3 kJ", "3.6 kJ"]  # 60 W x 50 s, x 60 s
    assert [c.split(" ± ")[0] for c in rows["energy per item above idle"]] == ["6 J", "6 J"]
    assert "warning" not in out
    data = json.loads(wattline(store, "report", "j-1", "--idle", "subtract", "--json")[1])
    assert data["figures_from"] == "dynamic_energy_j" and data["policy"]["idle_baseline_busy"] == {}


def test_idle_subtract_warns_when_the_baseline_minute_was_not_idle(fleet: str, wattline: Any) -> None:
    """The second resnet50 run opened 5 s after the first closed: its baseline minute was busy."""
    code, out, _ = wattline(fleet, "report", LONG_IDS[1], "--idle", "subtract", columns=300)
    assert code == 0
    assert f"warning: h1: the idle baseline (60 s before the job) was not idle: job '{LONG_IDS[0]}' ran in it" in out
    data = json.loads(wattline(fleet, "report", LONG_IDS[1], "--idle", "subtract", "--json")[1])
    assert data["policy"]["idle_baseline_busy"] == {"h1": [LONG_IDS[0]]}
    assert (
        json.loads(wattline(fleet, "report", LONG_IDS[0], "--idle", "subtract", "--json")[1])["policy"][
            "idle_baseline_busy"
        ]
        == {}
    )


PREFIX = {"p": 1e-12, "n": 1e-9, "µ": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def shown_value(cell: str) -> float:
    """The number a cell says, in its base unit: "2.778 kWh" -> 2778 (Wh), "3.4 tCO2" -> 3.4e6 (g)."""
    number, unit = re.match(r"^([-\d,.]+)\s*(\S*)", cell).groups()  # type: ignore[union-attr]
    value = float(number.replace(",", ""))
    if unit == "tCO2":
        return value * 1e6
    for base in ("Wh", "J", "W", "gCO2"):
        if unit.endswith(base) and unit[: -len(base)] in PREFIX:
            return value * PREFIX[unit[: -len(base)]]
    return value


def test_compare_changes_are_computed_from_the_figures_shown(fleet: str, wattline: Any) -> None:
    """Costs per million of 0.0412 and 0.0131 USD (prices set for it): shown so, and -68 %,
    never "0.04 vs 0.01 USD, -68 %"."""
    per_million_h = 36000 / 1e6  # 10 items/s
    code, out, err = wattline(
        fleet,
        "compare", LONG_IDS[0], LONG_IDS[2], "--sla", "100000", "--work", "1000000",
        "--price-a", str(0.0412 * per_million_h), "--price-b", str(0.0131 * per_million_h),
    )  # fmt: skip
    assert code == 0, err
    rows = table_rows(out)
    assert rows["cost per million items"] == ["0.0412 USD", "0.0131 USD", "-68 %"]
    checked = 0
    for name, (a, b, change) in rows.items():
        if name in ("figure", "throughput ratio (per instance)") or "n/a" in (a, b):
            continue
        expected = economics.format_percent((shown_value(b) / shown_value(a) - 1) * 100)
        assert change.split(" ± ")[0] == expected, (name, a, b, change)
        checked += 1
    assert checked >= 10


def test_compare_refuses_different_units_unless_asked(tmp_path: Path, wattline: Any) -> None:
    host = Host(tmp_path)
    host.job("docs-1", "docs", units="documents")
    host.job("tok-1", "tok", units="tokens", idle_s=5)
    store = host.store(tmp_path / "w.db")
    code, out, err = wattline(store, "compare", "docs-1", "tok-1")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "A counts 'documents' and B counts 'tokens'" in err and "--allow-different-units" in err
    code, out, err = wattline(store, "compare", "docs-1", "tok-1", "--allow-different-units")
    assert code == 0, err
    assert "A counts documents, B counts tokens" in out


@pytest.mark.parametrize(
    ("flags", "text"),
    [
        (["--sla", "0"], "option --sla: 0.0 is not a positive"),
        (["--sla", "-5"], "option --sla: -5.0"),
        (["--work", "-1"], "option --work: -1.0 is negative"),
        (["--instances", "0"], "option --instances: 0 is below 1"),
        (["--price-b", "-2"], "option --price-b: -2.0 is negative"),
    ],
)
def test_compare_bad_values_exit_2(fleet: str, wattline: Any, flags: list[str], text: str) -> None:
    code, out, err = wattline(fleet, "compare", LONG_IDS[0], LONG_IDS[2], *flags)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and text in err, err


def test_a_partly_modelled_job_says_how_much(tmp_path: Path, wattline: Any) -> None:
    """RAPL at 100 W plus a CPU model at 50 W: a third of the energy is an estimate."""
    host = Host(tmp_path, model_w=50.0, counter_too=True)
    host.job("mixed-1", "mixed")
    store = host.store(tmp_path / "w.db")
    code, out, _ = wattline(store, "report", "mixed-1", "--carbon-intensity", "400")
    assert code == 0
    rows = table_rows(out)
    assert rows["energy"] == [
        "7.5 kJ ± 22 %  counter + partly ESTIMATE (33 % model)",  # a third at the CPU model's 65 %
        "9 kJ ± 22 %  counter + partly ESTIMATE (33 % model)",
    ]
    for name in ("mean power", "energy per item", "per million items", "CO2 per run", "CO2 per million items"):
        assert all(cell.endswith("partly ESTIMATE (33 % model)") for cell in rows[name]), (name, rows[name])
    data = json.loads(wattline(store, "report", "mixed-1", "--json")[1])
    assert data["measured"]["estimate_fraction"] == pytest.approx(1 / 3, rel=1e-9)


def test_a_job_without_any_sample_shows_no_energy_figure(tmp_path: Path) -> None:
    """Job events reached the store but no agent sampled the host (e.g. events delivered from
    the outbox, no agent running): no energy figure is 0 J; each says "no samples"."""
    b = EventBuilder(JobSpec("bare-1", "bare", "inference", "items"))
    events = [b.open(T0_NS), b.units(7, T0_NS + 5 * S), b.close(3, T0_NS + 10 * S)]
    batch = wire.Batch(stream_id="s", seq=1, host=wire.Host(host_id="h9"), job_events=events)
    with SqliteStore(tmp_path / "w.db") as store:
        assert store.write(batch).rejected == 0
    url = f"sqlite:///{tmp_path / 'w.db'}"
    report = ok(url, "report", "bare-1")
    assert re.search(r"energy\s.*no samples", report) and re.search(r"energy per item\s.*no samples", report)
    assert not re.search(r"energy\s+│?\s*0 J", report), report
    data = json.loads(ok(url, "report", "bare-1", "--json"))
    assert data["energy_data"] is False
    (row,) = json.loads(ok(url, "jobs", "--json"))
    assert row["energy_data"] is False
    table = ok(url, "jobs")
    assert "no samples" in table and "0 J" not in table
