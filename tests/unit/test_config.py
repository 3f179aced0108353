"""Configuration precedence (file < env < flags) and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from wattline.agent.settings import AgentSettings
from wattline.collector.settings import CollectorSettings
from wattline.config import ConfigError, build, parse_pairs, read_secret, read_toml


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "wattline.toml"
    path.write_text(text)
    return path


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    doc = read_toml(write(tmp_path, '[agent]\ninterval = 2.0\nhost_id = "from-file"\nlabels = {cluster = "a"}\n'))
    env = {"WATTLINE_AGENT_INTERVAL": "0.5"}
    s = build(AgentSettings, "agent", doc, env=env, flags={"host_id": "from-flag", "interval": None})
    assert (s.interval, s.host_id, s.labels) == (0.5, "from-flag", {"cluster": "a"})


def test_env_lists_and_tables() -> None:
    env = {"WATTLINE_AGENT_COLLECTORS": "a:1, b:2", "WATTLINE_AGENT_LABELS": "region=eu,cluster=x"}
    s = build(AgentSettings, "agent", {}, env=env)
    assert s.collectors == ["a:1", "b:2"]
    assert s.labels == {"region": "eu", "cluster": "x"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[agent]\ninterval = 'fast'\n", "option agent.interval: invalid value 'fast' (expected a number)"),
        ("[agent]\nintervall = 1\n", "config [agent]: unknown option 'intervall'"),
        ("[agent\n", "invalid TOML"),
    ],
)
def test_bad_config_names_the_option(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        build(AgentSettings, "agent", read_toml(write(tmp_path, text)), env={})


def test_range_checks() -> None:
    with pytest.raises(ConfigError, match=r"agent\.interval"):
        AgentSettings(interval=0).validate()
    with pytest.raises(ConfigError, match="not HOST:PORT"):
        AgentSettings(collectors=["nohost"]).validate()
    with pytest.raises(ConfigError, match=r"collector\.influx_api"):
        CollectorSettings(influx_api="v3").validate()


def test_pairs_and_missing_file(tmp_path: Path) -> None:
    assert parse_pairs(["a=1", "b = x=y"], "--label") == {"a": "1", "b": "x=y"}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_pairs(["novalue"], "--label")
    with pytest.raises(ConfigError, match="not found"):
        read_toml(tmp_path / "absent.toml")


def test_secrets_refuse_loose_permissions(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    with pytest.raises(ConfigError, match="too open; chmod 600"):
        read_secret(token, "X", "InfluxDB token")
    token.chmod(0o600)
    assert read_secret(token, "X", "InfluxDB token") == "s3cret"
