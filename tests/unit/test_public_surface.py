"""The public surface: ``from wattline import Job, job_window`` is the Job API; the old
``wattline.workloads`` path still gives it, with a DeprecationWarning; importing the wire
(as the agent and collector do) loads no part of floor 4."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_job_api_from_the_top_and_the_old_path_with_a_warning() -> None:
    import wattline
    from wattline.jobs.wrappers import job

    assert wattline.Job is job.Job and wattline.job_window is job.job_window
    with pytest.warns(DeprecationWarning, match="from wattline import Job"):
        from wattline.workloads import Job
    assert Job is job.Job
    with pytest.raises(AttributeError):
        wattline.nothing_here  # noqa: B018


def test_the_agent_s_imports_load_no_floor_4_module() -> None:
    code = (
        "import sys, wattline.wire, wattline.agent.daemon, wattline.collector.daemon\n"
        "print([m for m in sys.modules if m.split('.')[1:2] in (['jobs'], ['reports'], ['accounting'], ['sweep'])])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
