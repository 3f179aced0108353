"""``wattline agent``, the command users type, starts as lean as ``python -m wattline.agent``.

The console script reads ``[--log-level L] agent OPTIONS`` itself (no typer, click or rich
loaded) and leaves everything else (help, a bad option or value, other commands) to the typer
app. Checked here: the lean reader knows exactly the typer command's options, gives the same
settings as typer for the same argv, hands the rest over, and a real ``wattline agent``
process delivers a known power to a real collector without importing a CLI library.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import typer
from servers import free_port
from sysfs_trees import PowerAdvancer, Zone, powercap_tree
from typer.testing import CliRunner

from wattline.agent.settings import AgentSettings
from wattline.cli import daemons
from wattline.cli.agent_entry import AGENT_OPTIONS, agent_settings, parse_agent
from wattline.cli.main import app
from wattline.collector.server import CollectorServer
from wattline.stores.factory import open_store

KINDS = {Path: "path", str: "str", float: "float", int: "int"}


def typer_kind(param: Any) -> str:
    """The lean reader's kind of a typer option (typer 0.2x's own parameter class: duck-typed)."""
    if param.is_flag:
        return "flag"
    return "list" if param.multiple else KINDS[param.type_descriptor.annotation]


def test_the_lean_reader_knows_exactly_the_typer_commands_options() -> None:
    command = typer.main.get_command(app).commands["agent"]  # type: ignore[attr-defined]
    declared = {
        flag: (param.name, typer_kind(param))
        for param in command.params
        if param.param_type_name == "option" and param.name != "help"
        for flag in param.opts
    }
    assert declared == AGENT_OPTIONS


ARGVS = [
    ["agent"],
    ["agent", "--source", "rapl", "--source", "nic", "--collector", "a:1", "--collector=b:2", "-l", "rack=3",
     "--label", "cluster=c1", "-i", "0.25", "--interval", "0.5", "--tls", "--sysfs-root", "/proc/1"],
    ["--log-level", "debug", "agent", "--host-id", "n1", "--prometheus-port", "9101", "--spool-dir", "memory",
     "--spool-max-mb", "8", "--spool-max-age=60", "--batch-interval", "2", "--push-timeout", "3", "--failback", "9",
     "--outbox-dir", "/tmp/ob", "--tls-server-name", "collector.example", "--prometheus-addr", "0.0.0.0"],
    ["--log-level=warning", "agent", "-c", "{config}", "--interval", "1e-1"],
]  # fmt: skip


@pytest.mark.parametrize("argv", ARGVS, ids=range(len(ARGVS)))
def test_same_settings_as_the_typer_command(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[agent]\nhost_id = 'from-file'\nbatch_interval = 4.0\n")
    argv = [a.format(config=config) for a in argv]
    parsed = parse_agent(argv)
    assert parsed is not None
    params = dict(parsed[1])
    lean = agent_settings(params.pop("config", None), **params)[0]

    seen: list[AgentSettings] = []
    monkeypatch.setattr(
        daemons, "run_agent_command", lambda config, **flags: seen.append(agent_settings(config, **flags)[0])
    )
    result = CliRunner().invoke(app, argv, env={"WATTLINE_LOG_LEVEL": None})
    assert result.exit_code == 0, result.output
    assert seen == [lean]
    assert lean != AgentSettings() or argv == ["agent"]


@pytest.mark.parametrize(
    "argv",
    [
        ["agent", "--help"],
        ["agent", "-h"],
        ["agent", "--bogus"],
        ["agent", "--interval", "abc"],
        ["agent", "--prometheus-port", "1.5"],
        ["agent", "--interval"],
        ["agent", "-i=1"],
        ["agent", "--tls=yes"],
        ["agent", "extra"],
        ["agent", "--host-id", ""],
        ["--version", "agent"],
        ["collector"],
        ["sources", "agent"],
        [],
    ],
)
def test_anything_else_goes_to_the_typer_app(argv: list[str]) -> None:
    assert parse_agent(argv) is None


def test_wattline_agent_process_loads_no_cli_library_and_delivers_the_known_power(tmp_path: Path) -> None:
    tree = powercap_tree(tmp_path / "host", [Zone("intel-rapl:0", "package-0", 10**11)])
    counters = PowerAdvancer(tree, {"intel-rapl:0": 40.0}, 10**11, period_s=0.02)
    with open_store(f"sqlite:///{tmp_path / 'w.db'}") as store:
        server = CollectorServer(store, f"127.0.0.1:{free_port()}")
        server.start()
        agent = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "wattline.cli.main", "agent", "--sysfs-root", str(tree),
             "--source", "rapl", "--interval", "0.2", "--batch-interval", "0.5", "--host-id", "lean",
             "--collector", f"127.0.0.1:{server.port}", "--spool-dir", "memory", "--outbox-dir", str(tmp_path / "ob")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            rows: list[Any] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(rows) < 15:
                time.sleep(0.5)
                rows = store.samples("lean", 0, 2**62)  # type: ignore[attr-defined]
            agent.send_signal(signal.SIGTERM)
            _, err = agent.communicate(timeout=30)
        finally:
            if agent.poll() is None:
                agent.kill()
            counters.close()
            server.stop()
        rows = store.samples("lean", 0, 2**62)  # type: ignore[attr-defined]
    assert agent.returncode == 0, err[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in err.splitlines() if "import time:" in line}
    assert "wattline" in imported and not imported & {"typer", "click", "rich"}, sorted(imported & {"typer", "click"})
    energy = sum(r.energy_j for r in rows)
    seconds = sum(r.end_ns - r.start_ns for r in rows) / 1e9
    assert len(rows) >= 15 and seconds > 2
    assert energy / seconds == pytest.approx(40.0, rel=0.05)
