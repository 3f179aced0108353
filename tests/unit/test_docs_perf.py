"""The performance page's tables are what ``docs/gen_perf.py`` writes from the run kept in git
(``bench/results/latest.json``), the check can fail, and a run the page must not show (quick,
with errors, a part missing or without a region) is refused with one line."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import docs_scripts
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "gen_perf.py"
PAGE = ROOT / "docs" / "performance.md"
RUN: dict[str, Any] = json.loads((ROOT / "bench" / "results" / "latest.json").read_text())


def _gen(*args: str | Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def _full(doc: dict[str, Any]) -> dict[str, Any]:
    """The kept run as a full one without errors, whatever the checkout holds."""
    return {**copy.deepcopy(doc), "quick": False, "errors": {}}


@pytest.fixture
def copies(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the page and a full run, the page written from it."""
    page, results = tmp_path / "performance.md", tmp_path / "latest.json"
    page.write_text(PAGE.read_text())
    results.write_text(json.dumps(_full(RUN)))
    assert _gen("--page", page, "--results", results).returncode == 0
    return page, results


def test_the_page_is_current() -> None:
    """CI's check on the repository: the tables are the kept run's, and that run is a full one."""
    proc = _gen("--check")
    assert proc.returncode == 0, proc.stderr


def test_a_changed_figure_makes_the_page_stale_and_the_rewrite_shows_it(copies: tuple[Path, Path]) -> None:
    page, results = copies
    assert _gen("--check", "--page", page, "--results", results).returncode == 0
    doc = json.loads(results.read_text())
    row = next(r for r in doc["targets"] if r["part"] == "accuracy")
    row.update(value="123456 ms", ratio=0.123456, target="<= 7 ms", met=False)
    results.write_text(json.dumps(doc))
    before = page.read_text()
    proc = _gen("--check", "--page", page, "--results", results)
    assert proc.returncode == 1 and proc.stderr.strip() == "performance.md is stale: run python docs/gen_perf.py"
    assert page.read_text() == before  # --check writes nothing
    assert _gen("--page", page, "--results", results).returncode == 0
    head, region, tail = _split(page.read_text(), "accuracy")
    # the bench's own format: ratio to 3 significant digits, a missed target "NO"
    assert f"| {row['figure']} | 123456 ms |" in region and "| 0.123x | <= 7 ms | NO |" in region
    assert (head, tail) == _split(before, "accuracy")[::2]  # nothing else changed
    assert _gen("--check", "--page", page, "--results", results).returncode == 0


def _split(text: str, part: str) -> tuple[str, str, str]:
    """The page before a part's region, the region, and after it."""
    head, rest = text.split(f"<!-- bench:{part} -->", 1)
    region, tail = rest.split(f"<!-- /bench:{part} -->", 1)
    return head, region, tail


def _refused(page: Path, results: Path, doc: dict[str, Any]) -> str:
    results.write_text(json.dumps(doc))
    before = page.read_text()
    for args in (["--check"], []):
        proc = _gen(*args, "--page", page, "--results", results)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert page.read_text() == before
    return proc.stderr


def test_a_quick_run_is_refused(copies: tuple[Path, Path]) -> None:
    page, results = copies
    assert "is a --quick run" in _refused(page, results, {**_full(RUN), "quick": True})


def test_a_run_with_errors_is_refused(copies: tuple[Path, Path]) -> None:
    page, results = copies
    doc = {**_full(RUN), "errors": {"fleet": "RuntimeError: victoria-metrics did not start"}}
    assert "has errors in part(s) fleet" in _refused(page, results, doc)


def test_a_run_without_a_part_the_page_shows_is_refused(copies: tuple[Path, Path]) -> None:
    page, results = copies
    doc = _full(RUN)
    del doc["parts"]["pods"]
    doc["targets"] = [r for r in doc["targets"] if r["part"] != "pods"]
    assert "lacks part(s) pods" in _refused(page, results, doc)


def test_a_part_the_page_has_no_region_for_is_refused(copies: tuple[Path, Path]) -> None:
    page, results = copies
    doc = _full(RUN)
    doc["parts"]["gpu"] = {"duration_s": 1.0}
    assert "no <!-- bench:PART --> region for part(s) gpu" in _refused(page, results, doc)


@pytest.mark.parametrize("text", ["not json", "[]", '{"quick": false}'])
def test_a_file_that_is_no_run_is_refused(copies: tuple[Path, Path], text: str) -> None:
    page, results = copies
    results.write_text(text)
    proc = _gen("--check", "--page", page, "--results", results)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_the_hook_stops_the_build_on_a_stale_page(copies: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from mkdocs.exceptions import PluginError

    page, results = copies
    gen = docs_scripts.load("gen_perf")
    monkeypatch.setattr(gen, "PAGE", page)
    monkeypatch.setattr(gen, "RESULTS", results)
    gen.on_pre_build({})  # current: the build goes on
    page.write_text(page.read_text().replace("| window energy error", "| hand-typed error", 1))
    with pytest.raises(PluginError, match=r"^performance\.md is stale: run python docs/gen_perf\.py$"):
        gen.on_pre_build({})
    results.write_text(json.dumps({**_full(RUN), "quick": True}))
    with pytest.raises(PluginError, match="is a --quick run"):
        gen.on_pre_build({})
