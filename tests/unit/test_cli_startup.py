"""The console script starts light: importing it, and ``--help`` of the app and of its
commands, load no daemon, store back-end, job runner, report output nor heavy library.
Each command imports those when it runs (CI starts hundreds of ``wattline`` processes).

A subprocess each: this test process has them all imported already."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: What a ``--help`` never needs; a top-level import of any of them in wattline/cli/ fails here.
HEAVY = (
    "grpc",
    "wattline.agent.daemon",
    "wattline.agent.sampler",
    "wattline.collector.daemon",
    "wattline.collector.server",
    "wattline.stores.factory",
    "wattline.stores.influxdb",
    "wattline.stores.prometheus",
    "wattline.stores.sqlite",
    "wattline.stores.victoria",
    "wattline.jobs.wrappers.job",
    "wattline.jobs.wrappers.run",
    "wattline.reference.launch",
    "wattline.reports.output.plot",
    "wattline.reports.summaries.reading",
    "wattline.sweep.command",
    "matplotlib",
    "numpy",
    "psutil",
    "pynvml",
    "influxdb_client",
    "prometheus_client",
    "rich",
    "torch",
)

SCRIPT = """
import contextlib, io, sys
import wattline.cli.main
argv = {argv!r}
if argv:
    sys.argv = ["wattline", *argv]
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            wattline.cli.main.main()
        except SystemExit as exc:
            assert exc.code == 0, exc.code
print(sorted(name for name in {heavy!r} if name in sys.modules))
"""


@pytest.mark.parametrize(
    "argv",
    [
        [],  # the import alone
        ["--help"],
        ["jobs", "--help"],  # the root callback runs too
        ["report", "--help"],
        ["collector", "--help"],
        ["workload", "bert-pretrain", "--help"],
    ],
)
def test_help_loads_nothing_heavy(argv: list[str]) -> None:
    code = SCRIPT.format(argv=argv, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"wattline {' '.join(argv)} imported {out.stdout.strip()}"
