"""The Slurm hooks' guards, without a cluster: a root reader refuses a symlinked or foreign
events file, user input is bounded, and a hook exits 0 whatever it is given."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from slurm_node_files import node_config

from wattline import wire
from wattline.agent.holders.slurm import node as slurm_node
from wattline.agent.holders.slurm.records import SlurmError
from wattline.jobs.wrappers import slurm_hooks


def node_env(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_GID": str(os.getgid()),
        "SLURMD_NODENAME": "n1",
    }
    return node_config(tmp_path), env


def test_a_symlinked_events_file_is_not_followed(tmp_path: Path) -> None:
    _, env = node_env(tmp_path)
    path = slurm_hooks.make_events_file(tmp_path / "slurm", "7", env)
    secret = tmp_path / "secret"
    secret.write_text("units 99\n")
    path.unlink()
    path.symlink_to(secret)
    with pytest.raises(SlurmError, match="link is not followed"):
        slurm_node.read_events_file(path, os.getuid())


def test_another_users_file_counts_nothing_for_the_job(tmp_path: Path) -> None:
    _, env = node_env(tmp_path)
    path = slurm_hooks.make_events_file(tmp_path / "slurm", "7", env)
    path.write_text("units 5\n")
    with pytest.raises(SlurmError, match="not a regular file of the job's user"):
        slurm_node.read_events_file(path, os.getuid() + 1)
    assert slurm_node.read_events_file(path, os.getuid()) == b"units 5\n"


def test_an_oversized_name_is_bounded() -> None:
    view = slurm_node.parse_show_job(f"JobId=7 JobName={'x' * 5000}\x07 UserId=root(0) Account=(null) ExitCode=0:15")
    assert len(view["name"]) == slurm_node.MAX_LABEL_CHARS and "\x07" not in view["name"]
    assert "account" not in view and view["exit_code"] == "143"


@pytest.mark.parametrize("env", [{}, {"SLURM_JOB_ID": "1; rm -rf /", "SLURM_JOB_UID": "0"}])
def test_a_hook_exits_0_and_says_why_in_one_line(env: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "wattline.cli.slurm", "prolog", "--config", "/nonexistent/{node}.toml"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": os.environ.get("PYTHONPATH", ""), **env},
        timeout=60,
    )
    assert out.returncode == 0 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("name", ["prolog", "epilog", "task-prolog"])
@pytest.mark.parametrize("pypath", ["good", "/nonexistent"])
def test_a_deploy_script_exits_0_with_one_line_whatever_its_path(tmp_path: Path, name: str, pypath: str) -> None:
    """The script as slurm.conf names it (python -I -S), its settings pointed here; the job's
    config is missing, or wattline is not on PYPATH: one line, exit 0, no traceback."""
    good = f"{Path(slurm_hooks.__file__).resolve().parents[3]}:{sysconfig.get_paths()['purelib']}"
    text = (Path(__file__).resolve().parents[2] / "deploy/slurm" / name).read_text()
    text = text.replace("PYTHON=/usr/bin/python3", f"PYTHON={sys.executable}")
    text = text.replace("PYPATH=/usr/lib/python3/dist-packages", f"PYPATH={good if pypath == 'good' else pypath}")
    script = tmp_path / name
    script.write_text(text)
    script.chmod(0o755)
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_UID": str(os.getuid()), "SLURMD_NODENAME": "n1"}
    out = subprocess.run([str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert ("not importable from PYPATH" in out.stderr) == (pypath != "good")


def test_a_close_names_the_job_its_open_could_not(tmp_path: Path) -> None:
    """A prolog whose controller answered late opens the job under its id alone; the epilog's
    close carries the name and labels the controller gave then, and readers show them."""
    import json

    from wattline.stores.sqlite.store import SqliteStore

    host = wire.Host(host_id="n1")
    opened = wire.JobEvent(job_id="77", kind=wire.pb.JobEvent.KIND_OPEN, time_ns=10**18, event_seq=1, name="77")
    opened.labels["user"] = "alice"
    close = wire.JobEvent(job_id="77", kind=wire.pb.JobEvent.KIND_CLOSE, time_ns=10**18 + 10**9, event_seq=2,
                          exit_code=0, name="train-bert")  # fmt: skip
    close.labels.update({"account": "ml", "user": "mallory"})
    db = tmp_path / "w.db"
    with SqliteStore(db) as store:
        store.write(wire.Batch(host=host, job_events=[opened, close]))
    listed = subprocess.run(
        [sys.executable, "-m", "wattline.cli.main", "jobs", "--json", "--store", f"sqlite:///{db}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    (row,) = json.loads(listed.stdout)
    assert row["name"] == "train-bert"
    assert row["labels"]["account"] == "ml" and row["labels"]["user"] == "alice"  # the open's stands
