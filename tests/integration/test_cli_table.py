"""Every store-reading or -writing command against every class of bad input: the exit
status (2 usage / config / input, 1 runtime failure, 127 / 126 a command that cannot
start), one line on stderr (docs/configuration.md: "Always one line on stderr"), never a traceback, and no
file created. A stray ``WATTLINE_*`` variable adds its one warning line before it, and
changes nothing else.

Stores are real: SQLite files written by ``wattline run``, an ``influxd`` 1.x (tests/helpers/servers.py)
for "no such database", a read-only bind mount for "read-only store" (tests run as root;
skipped where ``mount`` is refused). Each case is a real ``wattline`` process, a few at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from servers import Influxd, free_port

WATTLINE = [sys.executable, "-m", "wattline.cli.main"]
JOB = "table-job"
#: A command that exits at once, with a store option (and the job it needs) per command.
READERS = {"jobs": ["jobs"], "report": ["report", JOB], "compare": ["compare", JOB, JOB]}
RUN = ["run", "--job-id", "t", "--no-report"]
WORKLOAD = ["workload", "layoutlm-inference", "--size", "tiny", "--duration", "1"]


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]  # "{T}": the case's own directory, "{good}": a store holding JOB, "{influx}": influxd
    status: int
    text: str  # on stderr's last line
    env: tuple[tuple[str, str], ...] = ()  # STRAY or nothing


#: A variable no wattline setting has, in a command's environment, and the line it gets.
STRAY = ("WATTLINE_AGENT_INTERVALL", "1")
WARNING = (
    "wattline: warning: environment variable WATTLINE_AGENT_INTERVALL is not a wattline setting; "
    "ignored (did you mean WATTLINE_AGENT_INTERVAL?)"
)


def _cases() -> list[Case]:
    cases: list[Case] = []
    for cmd, argv in READERS.items():
        cases += [
            Case(f"{cmd}-missing-path", [*argv, "--store", "sqlite:///{T}/typo/w.db"], 2, "no store at"),
            Case(f"{cmd}-missing-file", [*argv, "--store", "{T}/typo.db"], 2, "no store at"),
            Case(f"{cmd}-directory", [*argv, "--store", "{T}"], 2, "is a directory"),
            Case(f"{cmd}-not-sqlite", [*argv, "--store", "{junk}"], 2, "is not a SQLite file"),
            Case(f"{cmd}-empty-sqlite", [*argv, "--store", "{empty}"], 2, "not a wattline store"),
            Case(f"{cmd}-other-sqlite", [*argv, "--store", "{other}"], 2, "not a wattline store"),
            Case(f"{cmd}-unreachable-influx", [*argv, "--store", "{unreachable}"], 1, "Connection refused"),
            Case(
                f"{cmd}-no-such-database",
                [*argv, "--store", "{influx}", "--influx-database", "no_such_db", "--influx-api", "v1"],
                2,
                "has no database 'no_such_db' (--influx-database)",
            ),
            Case(
                f"{cmd}-token-file-missing",
                [*argv, "--store", "{good}", "--influx-token-file", "{T}/absent-token"],
                2,
                "InfluxDB token file",
            ),
            Case(f"{cmd}-bad-influx-api", [*argv, "--store", "{good}", "--influx-api", "v9"], 2, "--influx-api"),
            Case(f"{cmd}-bad-flag", [*argv, "--bogus"], 2, "No such option: --bogus"),
            Case(f"{cmd}-unknown-table", [*argv, "--store", "{good}", "-c", "{agnet}"], 2, "[agnet] (did you mean"),
        ]
    cases += [
        Case("run-directory", [*RUN, "--store", "{T}", "--", "true"], 2, "is a directory"),
        Case("run-not-sqlite", [*RUN, "--store", "{junk}", "--", "true"], 2, "is not a SQLite file"),
        Case("run-unreachable-influx", [*RUN, "--store", "{unreachable}", "--", "true"], 1, "Connection refused"),
        Case("run-bad-flag", [*RUN, "--bogus", "--", "true"], 2, "No such option: --bogus"),
        Case("run-bad-regex", [*RUN, "--units-from-stdout", "(", "--", "true"], 2, "not a regular expression"),
        Case("run-url-collector", [*RUN, "--collector", "http://h:50051", "--", "true"], 2, "is a URL"),
        Case("run-name-collector", [*RUN, "--collector", "foo", "--", "true"], 2, "is not HOST:PORT"),
        Case("run-missing-command", [*RUN, "--store", "{T}/w.db", "--", "no-such-cmd-wl"], 127, "command not found"),
        Case("run-missing-path", [*RUN, "--store", "{T}/w.db", "--", "{T}/absent"], 127, "No such file"),
        Case("run-not-executable", [*RUN, "--store", "{T}/w.db", "--", "{junk}"], 126, "Permission denied"),
        Case("run-unknown-table", [*RUN, "-c", "{agnet}", "--", "true"], 2, "[agnet] (did you mean [agent]?)"),
        Case("workload-directory", [*WORKLOAD, "--store", "{T}"], 2, "is a directory"),
        Case("workload-unreachable", [*WORKLOAD, "--store", "{unreachable}"], 1, "Connection refused"),
        Case("workload-unknown-table", [*WORKLOAD, "-c", "{agnet}"], 2, "[agnet]"),
        Case("workload-bad-flag", [*WORKLOAD, "--bogus"], 2, "No such option: --bogus"),
        Case("agent-unknown-table", ["agent", "-c", "{agnet}"], 2, "[agnet] (did you mean [agent]?)"),
        Case("collector-unknown-table", ["collector", "-c", "{sources_typo}"], 2, "[sources.rapel]"),
        Case("sources-unknown-table", ["sources", "--sample", "0", "-c", "{agnet}"], 2, "[agnet]"),
        # a warning, not an error: the command goes on
        Case("unknown-variable", ["jobs", "--store", "{good}", "--no-energy", "--json"], 0, WARNING, (STRAY,)),
    ]
    # Two lines: the stray variable's warning, then the error the same case gives without it.
    named = {c.name: c for c in cases}
    cases += [
        dataclasses.replace(named[name], name=f"{name}+stray", env=(STRAY,))
        for name in ("report-missing-path", "run-missing-command", "agent-unknown-table")
    ]
    return cases


CASES = _cases()


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@dataclass
class Fixtures:
    root: Path
    good: Path
    results: dict[str, tuple[subprocess.CompletedProcess[str], set[str], set[str]]]


def _env(root: Path, extra: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATTLINE_")}
    env.update(COLUMNS="200", HOME=str(root / "home"), XDG_DATA_HOME=str(root / "home" / "data"))
    env.update(dict(extra))
    return env


def good_store(root: Path) -> Path:
    """A SQLite store holding one closed job, written by ``wattline run``."""
    path = root / "good" / "w.db"
    out = subprocess.run(
        [*WATTLINE, "run", "--job-id", JOB, "--store", str(path), "--no-report", "--", "true"],
        capture_output=True, text=True, timeout=120, env=_env(root), cwd=root,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return path


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory, influxd: Influxd) -> Fixtures:
    root = tmp_path_factory.mktemp("table")
    (root / "home").mkdir()
    good = good_store(root)
    files = {
        "good": str(good),
        "influx": influxd.url,
        "unreachable": f"http://127.0.0.1:{free_port()}",
        "junk": str(root / "junk.db"),
        "empty": str(root / "empty.db"),
        "other": str(root / "other.db"),
        "agnet": str(root / "agnet.toml"),
        "sources_typo": str(root / "sources.toml"),
    }
    (root / "junk.db").write_bytes(b"not a database, not even close\n" * 100)
    (root / "empty.db").write_bytes(b"")
    with contextlib.closing(sqlite3.connect(root / "other.db")) as other:  # another program's database
        other.execute("PRAGMA journal_mode=WAL")
        other.execute("CREATE TABLE t (x)")
    (root / "agnet.toml").write_text("[agnet]\ninterval = 1\n")
    (root / "sources.toml").write_text("[sources.rapel]\nenabled = true\n")

    def one(case: Case) -> tuple[subprocess.CompletedProcess[str], set[str], set[str]]:
        mine = root / "cases" / case.name
        mine.mkdir(parents=True)
        args = [a.format(T=mine, **files) for a in case.argv]
        before = _tree(root / "good") | {f"case/{p}" for p in _tree(mine)}
        out = subprocess.run(
            [*WATTLINE, *args], capture_output=True, text=True, timeout=120, env=_env(root, case.env), cwd=mine,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        after = _tree(root / "good") | {f"case/{p}" for p in _tree(mine)}
        return out, before, after

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip([c.name for c in CASES], pool.map(one, CASES), strict=True))
    return Fixtures(root, good, results)


def said(table: Fixtures, name: str) -> list[str]:
    """Case ``name``'s stderr lines, its own directory written ``{T}``."""
    return table.results[name][0].stderr.replace(str(table.root / "cases" / name), "{T}").splitlines()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_and_a_status(table: Fixtures, case: Case) -> None:
    out, before, after = table.results[case.name]
    assert "Traceback" not in out.stderr + out.stdout
    assert out.returncode == case.status, out.stderr
    lines = said(table, case.name)
    warned = [WARNING] * len(case.env)  # a stray variable's line comes first
    assert lines[: len(warned)] == warned, out.stderr
    assert len(lines[len(warned) :]) == (case.status != 0), out.stderr  # the error: one line
    assert case.text in lines[-1], lines[-1]
    if case.status != 0:
        assert lines[-1].startswith("wattline: error: "), out.stderr
        assert out.stdout == ""
    if case.name.endswith("+stray"):  # word for word the error without the variable
        assert lines[-1:] == said(table, case.name.removesuffix("+stray"))
    assert after == before, f"created: {sorted(after - before)}"


@pytest.fixture
def read_only_store(tmp_path: Path) -> Iterator[Path]:
    """The good store, seen through a read-only bind mount."""
    src = good_store(tmp_path).parent
    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(mount)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here (needs root): a read-only store is checked where tests run as root")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mount)], check=True, capture_output=True)
        assert not os.access(mount, os.W_OK)  # even for root: EROFS
        yield mount / "w.db"
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_store_on_a_read_only_mount_is_readable(tmp_path: Path, read_only_store: Path) -> None:
    """jobs, report and compare read a store nobody can write (the WAL's side files cannot
    be created there: it is read immutable); run, which must write, fails in one line."""
    for cmd, argv in READERS.items():
        out = subprocess.run(
            [*WATTLINE, *argv, "--store", str(read_only_store), "--json"],
            capture_output=True, text=True, timeout=120, env=_env(tmp_path), cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 0, f"{cmd}: {out.stderr}"
        assert out.stderr == "" and JOB in out.stdout, cmd
    out = subprocess.run(
        [*WATTLINE, *RUN, "--store", str(read_only_store), "--", "true"],
        capture_output=True, text=True, timeout=120, env=_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("wattline: error: store: SQLite ") and "is read-only" in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert sorted(p.name for p in read_only_store.parent.iterdir()) == ["w.db"]


def test_a_read_leaves_no_side_files(tmp_path: Path) -> None:
    """A read of a writable store leaves the directory as it found it (a ``mode=ro``
    connection would leave the WAL's -wal and -shm files behind, owned by the reader)."""
    store = good_store(tmp_path)
    before = sorted(p.name for p in store.parent.iterdir())
    out = subprocess.run(
        [*WATTLINE, "report", JOB, "--store", str(store), "--json"],
        capture_output=True, text=True, timeout=120, env=_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in store.parent.iterdir()) == before == ["w.db"]


def test_every_variable_wattline_reads_is_known() -> None:
    """No warning for a WATTLINE_* name the code, the deployment files, the README or the docs use
    (``wattline run`` sets WATTLINE_JOB_ID / WATTLINE_EVENTS for its command, and so on)."""
    import re

    from wattline.cli.agent_entry import environment_warnings

    root = Path(__file__).resolve().parents[2]
    files = [
        p
        for d in ("agent", "collector", "workloads", "wattline", "deploy", "grafana", "docs")
        for p in (root / d).rglob("*")
    ]
    names: set[str] = set()
    for path in [*files, root / "README.md"]:
        if path.is_file() and path.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".service", ".c", ""}:
            names |= set(re.findall(r"WATTLINE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    names -= {"WATTLINE_AGENT_INTERVALL"}  # the misspelling the tests use
    assert len(names) > 15
    assert environment_warnings({name: "1" for name in names}) == []
    assert environment_warnings({"WATTLINE_AGENT_INTERVALL": "1"}) == [
        "environment variable WATTLINE_AGENT_INTERVALL is not a wattline setting; ignored "
        "(did you mean WATTLINE_AGENT_INTERVAL?)"
    ]


def test_a_store_whose_first_writer_died_before_its_schema_lists_no_jobs(tmp_path: Path) -> None:
    """A wattline run killed right after it created its store (journal set, no tables yet): the
    store holds nothing, and says so, rather than "not a wattline store"."""
    db = tmp_path / "w.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")  # SqliteStore's first statement
    listed = subprocess.run(
        [*WATTLINE, "jobs", "--json", "--store", f"sqlite:///{db}"], capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    report = subprocess.run([*WATTLINE, "report", "x", "--store", f"sqlite:///{db}"], capture_output=True, text=True)
    assert report.returncode == 2 and "no job 'x' in the store" in report.stderr
