"""deploy/etc/wattline/wattline.toml: the example builds, documents every option, and its
values are the code's defaults, so that it never drifts from the settings dataclasses."""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest

from wattline.agent import registry
from wattline.agent.holders.systemd.settings import SystemdSettings
from wattline.agent.settings import AgentSettings
from wattline.collector.settings import CollectorSettings
from wattline.config import ConfigError, build, coerce, read_toml

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "etc" / "wattline" / "wattline.toml"


_TABLE = re.compile(r"^\[([\w.]+)\]\s*$")
_COMMENTED = re.compile(r"^#\s*([a-z][a-z0-9_]*)\s*=\s*(.+)$")


def settings_classes() -> dict[str, type[Any]]:
    """Table name -> the dataclass built from it."""
    classes: dict[str, type[Any]] = {"agent": AgentSettings, "collector": CollectorSettings, "systemd": SystemdSettings}
    for name in registry.SOURCES:
        classes[f"sources.{name}"] = registry.source_class(name)[1]
    return classes


def commented_examples() -> list[tuple[str, str, Any]]:
    """(table, key, value) of every ``# key = value`` line inside a table."""
    found: list[tuple[str, str, Any]] = []
    table = ""
    for line in EXAMPLE.read_text().splitlines():
        if m := _TABLE.match(line):
            table = m.group(1)
        elif table and (m := _COMMENTED.match(line)):
            key, value = m.groups()
            found.append((table, key, tomllib.loads(f"{key} = {value}")[key]))
    return found


def table_of(doc: dict[str, Any], dotted: str) -> dict[str, Any]:
    node: Any = doc
    for part in dotted.split("."):
        node = node[part]
    return typing.cast(dict[str, Any], node)


def build_table(dotted: str, doc: dict[str, Any]) -> Any:
    built = build(settings_classes()[dotted], dotted, doc, env={})
    return built.validate() if hasattr(built, "validate") else built


def settable(cls: type[Any], field: dataclasses.Field[Any]) -> bool:
    """Whether TOML can set ``field`` at all (config.coerce knows its type)."""
    hint = typing.get_type_hints(cls)[field.name]
    factory: Any = field.default_factory
    default = field.default if field.default is not dataclasses.MISSING else factory()
    try:
        coerce(default, hint, field.name)
    except ConfigError as exc:
        if "unsupported type" in str(exc):
            return False
        raise
    return True


def test_example_builds_every_table() -> None:
    doc = read_toml(EXAMPLE)
    assert set(doc) == {"agent", "collector", "systemd", "sources"}
    assert set(doc["sources"]) == set(registry.SOURCES)
    for dotted in settings_classes():
        build_table(dotted, doc)


def test_active_values_are_the_defaults() -> None:
    doc = read_toml(EXAMPLE)
    for dotted, cls in settings_classes().items():
        default = cls()
        built = build_table(dotted, doc)
        for key in table_of(doc, dotted):
            assert getattr(built, key) == getattr(default, key), f"[{dotted}] {key} differs from the code's default"


@pytest.mark.parametrize(("table", "key", "value"), commented_examples())
def test_each_commented_example_is_valid(table: str, key: str, value: Any) -> None:
    doc = read_toml(EXAMPLE)
    table_of(doc, table)[key] = value
    built = build_table(table, doc)
    assert getattr(built, key) is not None


def test_every_option_is_documented() -> None:
    doc = read_toml(EXAMPLE)
    commented = {(table, key) for table, key, _ in commented_examples()}
    missing = []
    for dotted, cls in settings_classes().items():
        active = set(table_of(doc, dotted))
        for field in dataclasses.fields(cls):
            if not settable(cls, field):
                continue
            if field.name not in active and (dotted, field.name) not in commented:
                missing.append(f"[{dotted}] {field.name}")
    assert missing == []
    assert commented_examples(), "the example shows optional settings as '# key = value'"
