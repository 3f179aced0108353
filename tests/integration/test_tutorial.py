"""The tutorial's commands (docs/tutorial.md) run as written, in order, in a fresh HOME with
the local SQLite store, and show what the page says they show."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import _FENCE, README

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = (ROOT / "docs" / "tutorial.md").read_text()
#: The setup the reader does once; CI's own setup (`.ci/run`) has done it, so it is checked, not rerun.
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q -e ."
ACTIVATE = ". .venv/bin/activate"


def _blocks(text: str) -> list[str]:
    """Each ``sh`` block's command, continuations joined."""
    return [" ".join(body.replace("\\\n", " ").split()) for lang, body in _FENCE.findall(text) if lang == "sh"]


def test_the_install_is_the_readmes() -> None:
    blocks = _blocks(TUTORIAL)
    assert blocks[:2] == [INSTALL, ACTIVATE]
    assert INSTALL in README.split("## Quick start", 1)[1]


@pytest.fixture
def shell(tmp_path: Path) -> dict[str, str]:
    """An environment as after install and activation: this interpreter's programs first on
    PATH, a HOME of its own (so its own store) and no store or data dir inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATTLINE_") and k != "XDG_DATA_HOME"}
    env["HOME"] = str(tmp_path)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["COLUMNS"] = "200"
    return env


def test_every_command_runs_and_shows_what_the_page_says(shell: dict[str, str], tmp_path: Path) -> None:
    outputs: dict[str, str] = {}
    for command in _blocks(TUTORIAL)[2:]:
        done = subprocess.run(
            ["bash", "-c", command], cwd=ROOT, env=shell, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        outputs[command] = done.stdout
    by_start = {c.split(" --", 1)[0].split(" -- ", 1)[0]: out for c, out in outputs.items()}
    sources = by_start["wattline sources"]
    assert "package-0" in sources and "counter" in sources
    report = by_start["wattline report first"]
    assert "energy per document" in report and " J " in report
    compare = by_start["wattline compare first second"]
    assert "A = first" in compare and "B = second" in compare
    assert (tmp_path / ".local/share/wattline/wattline.db").exists()
