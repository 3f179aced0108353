"""Every command's options are grouped into help panels (issue #46): each option of a long
command has one, an option name sits in the same panel on every command, and ``--help`` shows
the panels in the order :data:`wattline.cli.panels.OPTION_PANELS` gives."""

from __future__ import annotations

import copy
import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from wattline.cli import panels
from wattline.cli.main import app

#: a command with more options than this groups every one of them
LONG = 8

#: one name, two options that share nothing but it (command path, flag): where each sits
HOMONYMS = {
    ("wattline agent", "--label"): panels.HOST,  # the host's labels, not a job's
    ("wattline workload load", "--workers"): panels.WORKLOAD,  # the load's clients, not the collector's writers
}


def commands(command: Any, path: str = "wattline") -> Iterator[tuple[str, Any]]:
    """(path, command) for ``command`` and every command under it."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, f"{path} {name}")


def options(command: Any) -> list[Any]:
    """The command's own options (not -h/--help)."""
    return [p for p in command.params if p.param_type_name == "option" and p.name != "help"]


def flag(option: Any) -> str:
    return max(option.opts, key=len)


def unpanelled(tree: Any) -> list[str]:
    """``path flag`` of each option of a long command that has no known panel."""
    return [
        f"{path} {flag(option)}"
        for path, command in commands(tree)
        if len(options(command)) > LONG
        for option in options(command)
        if getattr(option, "rich_help_panel", None) not in panels.OPTION_PANELS
    ]


def panels_by_flag(tree: Any) -> dict[str, set[str]]:
    """Each option name's panels across commands (homonyms apart)."""
    seen: dict[str, set[str]] = defaultdict(set)
    for path, command in commands(tree):
        for option in options(command):
            panel = getattr(option, "rich_help_panel", None)
            if panel is None:
                continue
            if (path, flag(option)) in HOMONYMS:
                assert panel == HOMONYMS[path, flag(option)], (path, flag(option), panel)
                continue
            seen[flag(option)].add(panel)
    return seen


@pytest.fixture(scope="module")
def tree() -> Any:
    return typer.main.get_command(app)


def test_every_option_of_a_long_command_has_a_panel(tree: Any) -> None:
    long = [path for path, command in commands(tree) if len(options(command)) > LONG]
    assert {"wattline run", "wattline agent", "wattline collector", "wattline report", "wattline sweep"} <= set(long)
    assert unpanelled(tree) == []


def test_an_option_added_without_a_panel_is_caught(tree: Any) -> None:
    run = tree.commands["run"]
    extra = copy.copy(options(run)[0])  # an option as typer makes it, added without a panel
    extra.name, extra.opts, extra.rich_help_panel = "new_flag", ["--new-flag"], None
    run.params.append(extra)
    try:
        assert unpanelled(tree) == ["wattline run --new-flag"]
    finally:
        run.params.remove(extra)


def test_one_option_name_one_panel(tree: Any) -> None:
    seen = panels_by_flag(tree)
    assert {name: sorted(p) for name, p in seen.items() if len(p) > 1} == {}
    # the shared ones really are shared: the check compares something
    assert seen["--store"] == {panels.STORE} and seen["--share-rule"] == {panels.REPORT}
    assert seen["--json"] == {panels.OUTPUT} and seen["--interval"] == {panels.HOST}
    # each homonym still exists (else its exemption hides nothing and must go)
    present = {(path, flag(o)) for path, c in commands(tree) for o in options(c)}
    assert set(HOMONYMS) <= present


def test_every_top_level_command_has_a_panel(tree: Any) -> None:
    missing = {name: getattr(c, "rich_help_panel", None) for name, c in tree.commands.items()}
    assert {n: p for n, p in missing.items() if p not in panels.COMMAND_PANELS} == {}


def sections(text: str) -> list[tuple[str, list[str]]]:
    """The help's sections after the usage: (title, flags listed under it)."""
    found: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if re.match(r"^[A-Z][^:]*:$", line):
            found.append((line[:-1], []))
        elif found and (m := re.match(r"^  (?:-\w, )?(--[\w-]+)", line)):
            found[-1][1].append(m.group(1))
    return found


def test_run_help_shows_its_panels_in_order(tree: Any) -> None:
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    shown = sections(result.output)
    assert [title for title, _ in shown] == [
        "Arguments",
        panels.JOB,
        panels.UNITS,
        panels.ENDPOINT,
        panels.HOST,
        panels.STORE,
        panels.REPORT,
        panels.OUTPUT,
        panels.DEFAULT,
    ]
    # each option once, under its own panel; none lost
    where = {f: title for title, flags in shown for f in flags}
    run = tree.commands["run"]
    assert sum(len(flags) for _, flags in shown) == len(options(run)) + 1
    assert {flag(o): o.rich_help_panel for o in options(run)} == {f: t for f, t in where.items() if f != "--help"}
    assert where["--help"] == panels.DEFAULT


def test_top_level_help_groups_commands() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    shown = [title for title, _ in sections(result.output)]
    assert shown == [panels.DEFAULT, *panels.COMMAND_PANELS]
    body = result.output.split(f"\n{panels.MEASURE}:\n", 1)[1]
    measure = body.split("\n\n", 1)[0]
    assert re.findall(r"^  (\S+)", measure, re.M) == ["run", "sweep"]
