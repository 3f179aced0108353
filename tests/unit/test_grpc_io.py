"""import_grpc and defer_grpc: gRPC sees GRPC_EXPERIMENTS while it is imported, and nobody else ever does.

A stand-in ``grpc`` module on the path records the variable at its import, so each test
reads what gRPC itself would have read; children of the process are checked too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import os, subprocess, sys
{before}
from wattline.agent.grpc_io import import_grpc
chose = import_grpc()
import grpc
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('GRPC_EXPERIMENTS'))"],
                       capture_output=True, text=True).stdout.strip()
print(chose, grpc.SEEN, os.environ.get("GRPC_EXPERIMENTS"), child)
"""


def probe(tmp_path: Path, before: str = "", script: str = PROBE, **env: str) -> list[str]:
    (tmp_path / "grpc.py").write_text("import os\nSEEN = os.environ.get('GRPC_EXPERIMENTS')\n")
    environ = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    environ["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    environ.update(env)
    out = subprocess.run(
        [sys.executable, "-c", script.format(before=before)], env=environ, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_grpc_reads_the_setting_and_it_goes_no_further(tmp_path: Path) -> None:
    assert probe(tmp_path) == ["True", "-event_engine_client", "None", "None"]


def test_a_users_setting_is_left_alone(tmp_path: Path) -> None:
    got = probe(tmp_path, GRPC_EXPERIMENTS="-promise_based_client_call")
    assert got == ["False", "-promise_based_client_call", "-promise_based_client_call", "-promise_based_client_call"]


def test_nothing_changes_once_grpc_is_imported(tmp_path: Path) -> None:
    assert probe(tmp_path, before="import grpc") == ["False", "None", "None", "None"]


DEFERRED = """
import os, subprocess, sys
{before}
import wattline.cli.main
loaded = "grpc" in sys.modules
import grpc
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('GRPC_EXPERIMENTS'))"],
                       capture_output=True, text=True).stdout.strip()
print(loaded, grpc.SEEN, os.environ.get("GRPC_EXPERIMENTS"), child, type(grpc.__spec__.loader).__name__)
"""


def test_the_console_script_imports_grpc_only_when_used_and_then_with_the_setting(tmp_path: Path) -> None:
    got = probe(tmp_path, script=DEFERRED)
    assert got == ["False", "-event_engine_client", "None", "None", "SourceFileLoader"]


def test_the_console_script_leaves_a_users_setting_alone(tmp_path: Path) -> None:
    got = probe(tmp_path, script=DEFERRED, GRPC_EXPERIMENTS="-promise_based_client_call")
    assert got[:4] == ["False", *["-promise_based_client_call"] * 3]


ENTRY = """
import os, sys
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" and not seen:
            seen.append(os.environ.get("GRPC_EXPERIMENTS"))
        return None
sys.meta_path.insert(0, Spy())
import {module}
print(seen[0], os.environ.get("GRPC_EXPERIMENTS"))
"""


@pytest.mark.parametrize("module", ["wattline.agent.__main__"])
def test_the_agents_entry_points_import_grpc_with_the_setting(module: str) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    environ["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", ENTRY.format(module=module)], env=environ, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["-event_engine_client", "None"]


REAL = """
import os, sys
import wattline.cli.main
import wattline.agent.daemon  # the real gRPC, through the deferred import
import grpc.aio
hooked = [type(f).__name__ for f in sys.meta_path if "grpc" in type(f).__name__.lower()]
print(os.environ.get("GRPC_EXPERIMENTS"), type(grpc.__spec__.loader).__name__, grpc.aio.__name__, hooked)
"""


def test_the_real_grpc_imports_plainly_through_the_console_scripts_deferral() -> None:
    environ = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    environ["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", REAL], env=environ, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "SourceFileLoader", "grpc.aio", "[]"]
