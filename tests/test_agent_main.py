"""``python -m wattline.agent`` (the entry the systemd unit and the DaemonSet run) takes ``wattline agent``'s flags."""

from __future__ import annotations

import dataclasses

from wattline.agent.__main__ import parse_args
from wattline.agent.settings import AgentSettings
from wattline.config import build


def settings(*argv: str) -> AgentSettings:
    args = parse_args(list(argv))
    flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(AgentSettings)}
    return build(AgentSettings, "agent", {}, env={}, flags=flags).validate()


def test_cli_spellings() -> None:
    s = settings(
        "--source", "rapl", "--source", "nic", "--collector", "a:1", "--collector", "b:2",
        "-l", "cluster=c1", "--label", "rack=3", "-i", "0.1", "--tls", "--sysfs-root", "/host",
    )  # fmt: skip
    assert s.sources == ["rapl", "nic"] and s.collectors == ["a:1", "b:2"]
    assert s.labels == {"cluster": "c1", "rack": "3"} and s.interval == 0.1 and s.tls is True
    assert str(s.sysfs_root) == "/host"


def test_lean_spellings() -> None:
    s = settings("--sources", "rapl,nic", "--collectors", "a:1,b:2", "--labels", "cluster=c1", "--tls", "false")
    assert s.sources == ["rapl", "nic"] and s.collectors == ["a:1", "b:2"]
    assert s.labels == {"cluster": "c1"} and s.tls is False


def test_defaults_come_from_the_settings() -> None:
    assert settings() == AgentSettings()
    assert settings().batch_interval == 1.5
