"""``wattline jobs --mine``: the jobs whose ``user`` label is the caller's; a wrapped run and a Job
API job carry their own user's name as that label, as the Slurm hooks carry SLURM_JOB_USER."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
from pathlib import Path

from procs import CLI, clean_env


def test_mine_lists_the_callers_jobs_only(tmp_path: Path) -> None:
    env = {**clean_env(), "WATTLINE_STORE": f"sqlite:///{tmp_path / 'w.db'}"}
    me = getpass.getuser()
    for job_id, labels in (("mine-1", []), ("theirs", ["--label", "user=someone-else"]), ("mine-2", [])):
        out = subprocess.run(
            [*CLI, "run", "--job-id", job_id, "--no-report", *labels, "--", sys.executable, "-c", "pass"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
    listed = subprocess.run(
        [*CLI, "jobs", "--mine", "--json", "--no-energy"], capture_output=True, text=True, timeout=60, env=env
    )
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert sorted(r["id"] for r in rows) == ["mine-1", "mine-2"]
    every = json.loads(subprocess.run([*CLI, "jobs", "--json", "--no-energy"], capture_output=True, text=True,
                                      timeout=60, env=env, check=True).stdout)  # fmt: skip
    assert {r["id"]: r["labels"]["user"] for r in every} == {"mine-1": me, "theirs": "someone-else", "mine-2": me}
    clash = subprocess.run(
        [*CLI, "jobs", "--mine", "--label", "user=someone-else"], capture_output=True, text=True, timeout=60, env=env
    )
    assert clash.returncode == 2 and "--mine and --label user=" in clash.stderr
    assert len(clash.stderr.strip().splitlines()) == 1
