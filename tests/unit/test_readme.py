"""The README and the docs pages (``docs/``) stay true to the code: every option is in the
generated configuration reference and that page is current, every command they show exists
with the flags shown, every repository path they name exists, and every numeric promise is
named by the test that checks it."""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import re
import shlex
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import docs_scripts
import pytest

from wattline.agent.holders.kube.settings import KubeSettings
from wattline.agent.registry import SOURCES, source_class
from wattline.agent.settings import AgentSettings
from wattline.collector.settings import CollectorSettings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
#: Every page of the docs site, by its path under the repository.
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))}
#: What a reader can read: the README, the pages and the changelog they include.
TEXTS = {"README.md": README, "CHANGELOG.md": (ROOT / "CHANGELOG.md").read_text(), **PAGES}
DOCS = "\n".join(TEXTS.values())
OPTIONS = PAGES["docs/options.md"]


def _gen_config() -> ModuleType:
    return docs_scripts.load("gen_config")


def test_the_configuration_reference_is_current() -> None:
    """docs/options.md is what docs/gen_config.py writes from the settings dataclasses."""
    assert _gen_config().generate() == OPTIONS, "docs/options.md is stale: run python docs/gen_config.py"


def _section(table: str) -> str:
    return OPTIONS.split(f"## `[{table}]`\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize(
    ("cls", "table"), [(AgentSettings, "agent"), (CollectorSettings, "collector"), (KubeSettings, "kubernetes")]
)
def test_every_daemon_option_is_in_the_reference(cls: type, table: str) -> None:
    """Each field of the settings has a row with a meaning in its table's section."""
    rows = {
        line.split("|")[1].strip(): line.split("|")[-2].strip()
        for line in _section(table).splitlines()
        if line.startswith("| `")
    }
    assert [f.name for f in dataclasses.fields(cls) if not rows.get(f"`{f.name}`")] == []


@pytest.mark.parametrize("name", list(SOURCES))
def test_every_source_option_is_in_the_reference(name: str) -> None:
    _, options = source_class(name)
    section = _section(f"sources.{name}")
    assert [f.name for f in dataclasses.fields(options) if f"| `{f.name}` |" not in section] == []


def test_the_reference_check_finds_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = _gen_config()
    monkeypatch.setattr(gen, "PAGE", tmp_path / "options.md")
    assert gen.stale()
    assert gen.main(["gen_config.py"]) == 0 and not gen.stale()
    (tmp_path / "options.md").write_text(OPTIONS.replace("`host_id`", "`host`", 1))
    assert gen.stale() and gen.main(["gen_config.py", "--check"]) == 1


def test_two_command_quick_start() -> None:
    quick = README.split("## Quick start", 1)[1].split("## ", 1)[0]
    commands = [b.split("```", 1)[0].strip() for b in quick.split("```sh\n")[1:3]]
    assert commands[0].startswith("python3 -m venv .venv") and "wattline run" in commands[0]
    assert commands[1] == "bash .ci/run"


def test_the_readme_is_short_and_holds_no_history() -> None:
    """About 300 lines; no bench run letters or before/after figures (those are in
    docs/performance.md and CHANGELOG.md)."""
    assert len(README.splitlines()) <= 320
    assert not re.search(r"\bruns? [A-Z]\b|\bruns [A-Z]\u2013[A-Z]\b| \u2192 ", README)


# -- commands: every `wattline ...` and `python -m ...` shown exists, with the flags shown ------

#: Fenced shell blocks and inline code spans of the docs.
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def _commands(text: str) -> list[str]:
    """Each shell command shown: the lines of ``sh`` blocks (continuations joined), and inline
    spans that start with ``wattline`` or ``python``."""
    found: list[str] = []
    for lang, body in _FENCE.findall(text):
        if lang == "sh":
            found += [c for c in body.replace("\\\n", " ").splitlines() if c.strip()]
    without_fences = _FENCE.sub("", text)
    spans = [" ".join(s.split()) for s in re.findall(r"(?<!`)`([^`]+)`(?!`)", without_fences)]
    found += [s for s in spans if re.match(r"(\.venv/bin/)?(wattline|python3?) ", s)]
    return found


@cache
def _cli() -> Any:
    import typer.main

    from wattline.cli.app import app

    return typer.main.get_command(app)


def _flags(command: Any) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}


def _check_wattline(words: list[str]) -> list[str]:
    """What in ``wattline WORDS`` the CLI does not have: the command or a flag (up to ``--``,
    after which the command it runs is checked in turn)."""
    if "--" in words:
        cut = words.index("--")
        return _check_wattline(words[:cut]) + _check_words(words[cut + 1 :])
    group, path = _cli(), ["wattline"]
    rest = [w for w in words if not w.startswith("-")]
    while hasattr(group, "commands") and rest and all(n in group.commands for n in rest[0].split("|")):
        path.append(rest[0].split("|")[0])  # `prolog|epilog|task-prolog`: each exists, alike
        group = group.commands[path[-1]]
        rest.pop(0)
    if hasattr(group, "commands"):
        placeholder = rest[:1] in (["..."], ["\u2026"])  # `wattline workload ...`
        return [] if placeholder else [f"{' '.join(path)}: no command {rest[:1]}"]
    flags = _flags(group)
    problems = []
    for word in words:
        flag = word.strip("[]()").split("=", 1)[0].rstrip(".,;")
        if flag.startswith("--") and re.fullmatch(r"--[a-z0-9-]+", flag) and flag not in flags:
            problems.append(f"{' '.join(path)}: no flag {flag}")
    return problems


def _check_words(words: list[str]) -> list[str]:
    while words and "=" in words[0] and not words[0].startswith("-"):
        words = words[1:]  # VAR=value before the command
    if not words:
        return []
    program = words[0].rsplit("/", 1)[-1]
    if program == "wattline":
        return _check_wattline(words[1:])
    if program.startswith("python") and words[1:3] and words[1] == "-m" and not importlib.util.find_spec(words[2]):
        return [f"python -m {words[2]}: no such module"]
    return []


def _check(command: str) -> list[str]:
    problems = []
    for part in re.split(r"&&|;|\s\|\s", command.split(" #", 1)[0]):
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        problems += _check_words(words)
    return problems


@pytest.mark.parametrize("name", list(TEXTS))
def test_every_command_shown_exists(name: str) -> None:
    """Each ``wattline`` command (and group) a page shows exists and takes every flag shown;
    each ``python -m`` module exists."""
    commands = _commands(TEXTS[name])
    assert [p for c in commands for p in _check(c)] == []


def test_the_command_check_finds_a_wrong_flag_and_command() -> None:
    text = "```sh\nwattline report latest --plott f.png\n```\n`wattline reprot JOB` `python -m wattline.nothing`"
    assert [p for c in _commands(text) for p in _check(c)] == [
        "wattline report: no flag --plott",
        "wattline: no command ['reprot']",
        "python -m wattline.nothing: no such module",
    ]


# -- paths: every repository path the docs name exists ------------------------------------------

_PATH = re.compile(r"(?<![\w/.~$@-])((?:wattline|tests|deploy|bench|grafana|proto|docs|\.ci)/[\w./*{},-]*)")
#: Paths the tools make, named in the docs but not in a checkout.
MADE = {
    "bench/.venv": "bench/run makes it",
}


def _expand(path: str) -> list[str]:
    brace = re.search(r"\{([^{}]*)\}", path)
    if not brace:
        return [path]
    return [x for alt in brace.group(1).split(",") for x in _expand(path[: brace.start()] + alt + path[brace.end() :])]


def _missing(text: str) -> list[str]:
    missing = []
    for match in _PATH.finditer(text):
        path = match.group(1).rstrip(".,")
        if path.rstrip("/") in MADE:
            continue
        for one in _expand(path):
            if not glob.glob(str(ROOT / one)):
                missing.append(one)
    return missing


@pytest.mark.parametrize("name", list(TEXTS))
def test_every_path_named_exists(name: str) -> None:
    assert _missing(TEXTS[name]) == []


def test_the_path_check_finds_a_missing_path() -> None:
    text = "`wattline/agent/counter.py`, deploy/slurm/{prolog,nolog} and /etc/wattline/x, `wattline/nothing.py`."
    assert _missing(text) == ["deploy/slurm/nolog", "wattline/nothing.py"]


#: Each numeric promise of the docs' Jobs, Reports and Delivery guarantee pages (times, sizes,
#: counts) and the others issue #29 named, word for word, and the test (``file::function``)
#: that checks it. A promise here without a test is listed in UNTESTED with its issue, so
#: neither list can quietly go stale.
PROMISES: list[tuple[str, str]] = [
    ("older than three heartbeat periods\n(90 s; one late or lost heartbeat never ends a live job)",
     "test_job_lease.py::test_one_late_heartbeat_never_ends_a_live_job"),
    ("sends a `heartbeat` event every 30 s", "test_job_lease.py::test_the_job_api_renews_its_lease_until_it_closes"),
    ("waits, at most two\nbatch intervals plus 3 s after the close",
     "test_report_complete.py::test_report_at_job_end_waits_for_the_last_samples"),
    ("budget of ticks (10 at once, then 5 a second)", "test_edge_socket.py::test_a_peer_gets_10_ticks_at_once_then_5_a_second"),
    ("exits with CMD's status at most about 3 s after CMD ends",
     "test_outbox.py::test_run_exits_about_3_s_after_its_command_when_no_collector_answers"),
    ("What no collector took within\n  about 3 s of the command's end",
     "test_outbox.py::test_run_exits_about_3_s_after_its_command_when_no_collector_answers"),
    ("up to an hour after the\nclose",
     "test_job_summary.py::test_an_incomplete_summary_is_computed_again_up_to_an_hour_after_the_close"),
    ("(2 s, doubling to 60 s)", "test_job_summary.py::test_a_failed_write_is_retried_at_2_s_doubling_to_60_s"),
    ("(10,000 due jobs)", "test_job_summary.py::test_the_due_table_takes_10000_jobs_and_names_the_one_it_cannot_take"),
    ("Bounds: 256 MiB", "test_outbox.py::test_past_its_size_bound_exactly_the_oldest_events_are_dropped_and_said"),
    ("30 days per process; beyond, the oldest are dropped and logged",
     "test_outbox.py::test_past_30_days_exactly_the_older_events_are_dropped_and_said"),
    ("Always one line on stderr, never a traceback", "test_cli_table.py::test_bad_input_is_one_line_and_a_status"),
]  # fmt: skip

#: Promises no test checks yet (issue #29, item 5): said here, not hidden.
UNTESTED: list[str] = []


def _normal(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("promise", "test_id"), PROMISES)
def test_each_numeric_promise_is_named_by_a_test(promise: str, test_id: str) -> None:
    """The promise is in the docs as written, and the test that checks it exists."""
    assert _normal(promise) in _normal(DOCS), promise
    file, function = test_id.split("::")
    source = next(Path(__file__).parents[1].glob(f"*/{file}")).read_text()
    assert f"def {function}(" in source, test_id


def test_untested_promises_are_still_promised() -> None:
    """An entry of UNTESTED that left the docs (or got a test: move it up) must leave the list."""
    assert [p for p in UNTESTED if _normal(p) not in _normal(DOCS)] == []
