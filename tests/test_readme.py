"""The README documents every option the daemons take (the brief: --help and the README)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from wattline.agent.registry import SOURCES, source_class
from wattline.agent.settings import AgentSettings
from wattline.collector.settings import CollectorSettings

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


@pytest.mark.parametrize("cls", [AgentSettings, CollectorSettings])
def test_every_daemon_option_is_in_the_readme(cls: type) -> None:
    missing = [f.name for f in dataclasses.fields(cls) if f"| `{f.name}` |" not in README]
    assert missing == []


@pytest.mark.parametrize("name", list(SOURCES))
def test_every_source_option_is_in_the_readme(name: str) -> None:
    _, options = source_class(name)
    row = next(line for line in README.splitlines() if line.startswith(f"| `[sources.{name}]` |"))
    assert [f.name for f in dataclasses.fields(options) if f"`{f.name}`" not in row] == []


def test_two_command_quick_start() -> None:
    quick = README.split("## Quick start", 1)[1].split("## ", 1)[0]
    commands = [b.split("```", 1)[0].strip() for b in quick.split("```sh\n")[1:3]]
    assert commands[0].startswith("python3 -m venv .venv") and "wattline run" in commands[0]
    assert commands[1] == "bash .ci/run"
