"""``python -m wattline.agent`` (the entry the systemd unit and the DaemonSet run) takes ``wattline agent``'s flags."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from sysfs_trees import Zone, powercap_tree

from wattline.agent.__main__ import _argparse_args, _plain_args, parse_args
from wattline.agent.settings import AgentSettings
from wattline.config import build


def settings(*argv: str) -> AgentSettings:
    args = parse_args(list(argv))
    flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(AgentSettings)}
    return build(AgentSettings, "agent", {}, env={}, flags=flags).validate()


def test_cli_spellings() -> None:
    s = settings(
        "--source", "rapl", "--source", "nic", "--collector", "a:1", "--collector", "b:2",
        "-l", "cluster=c1", "--label", "rack=3", "-i", "0.1", "--tls", "--sysfs-root", "/proc/1",
    )  # fmt: skip
    assert s.sources == ["rapl", "nic"] and s.collectors == ["a:1", "b:2"]
    assert s.labels == {"cluster": "c1", "rack": "3"} and s.interval == 0.1 and s.tls is True
    assert str(s.sysfs_root) == "/proc/1"


def test_lean_spellings() -> None:
    s = settings("--sources", "rapl,nic", "--collectors", "a:1,b:2", "--labels", "cluster=c1", "--tls", "false")
    assert s.sources == ["rapl", "nic"] and s.collectors == ["a:1", "b:2"]
    assert s.labels == {"cluster": "c1"} and s.tls is False


def test_defaults_come_from_the_settings() -> None:
    assert settings() == AgentSettings()
    assert settings().batch_interval == 1.5


PLAIN = [
    [],
    ["--sysfs-root", "/proc/1", "--interval", "0.5", "--collectors", "a:1", "--host-id", "h", "--sources", "rapl,nic"],
    ["--source", "rapl", "--source=nic", "--collector", "a:1", "-l", "x=1", "--label=y=2", "--labels", "z=3"],
    ["-c", "/etc/w.toml", "--log-level", "debug", "-i", "2", "--interval=3", "--tls"],
    ["--tls", "--spool-dir", "memory", "--host-id="],
    ["--tls", "false", "--prometheus-port", "9101", "--token-file", "/t"],
    ["--tls=true", "--config=/c.toml", "--outbox-dir", "/o"],
]


@pytest.mark.parametrize("argv", PLAIN)
def test_the_plain_reader_reads_as_argparse_does(argv: list[str]) -> None:
    plain = _plain_args(argv)
    assert plain is not None
    assert vars(plain) == {k: v for k, v in vars(_argparse_args(argv)).items() if not k.startswith("repeated_")}


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["-h"], ["--bogus", "1"], ["--interval"], ["--interval", "-1"], ["--int", "1"], ["-c"], ["--"]],
)
def test_anything_else_goes_to_argparse(argv: list[str]) -> None:
    assert _plain_args(argv) is None


def test_help_and_usage_errors_still_come_from_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        parse_args(["--help"])
    assert done.value.code == 0 and "--batch-interval VALUE" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        parse_args(["--bogus", "1"])
    assert done.value.code == 2 and "unrecognized arguments: --bogus 1" in capsys.readouterr().err


def test_the_agent_loads_no_argparse_disk_spool_nor_pod_watcher_it_does_not_use(tmp_path: Path) -> None:
    """The module entry's usual argv, memory spool, pods off: none of them is in the process (peak memory)."""
    tree = powercap_tree(tmp_path / "host", [Zone("intel-rapl:0", "package-0", 10**6)])
    script = (
        "import sys\n"
        "from wattline.agent.__main__ import parse_args\n"
        "from wattline.agent.daemon import Agent\n"
        "from wattline.agent.settings import AgentSettings\n"
        "from wattline.config import build\n"
        f"args = parse_args(['--sysfs-root', {str(tree)!r}, '--sources', 'rapl', '--spool-dir', 'memory',"
        f" '--outbox-dir', {str(tmp_path / 'ob')!r}, '--collector', '127.0.0.1:1'])\n"
        "flags = {k: v for k, v in vars(args).items() if k not in ('config', 'log_level')}\n"
        "agent = Agent(build(AgentSettings, 'agent', {}, env={}, flags=flags).validate())\n"
        "print(sorted(m for m in ('argparse', 'wattline.agent.spool.disk', 'wattline.agent.holders.kube.watcher',"
        " 'wattline.agent.holders.systemd.watch', 'wattline.served_specs') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
