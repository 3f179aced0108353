"""A Slurm node's files for tests without a cluster: the agent config the hooks read, and a
/proc in which the hook's parent is a slurmd (the test's parent process, renamed: it lives)."""

from __future__ import annotations

import os
from pathlib import Path


def node_config(tmp_path: Path, host: str = "n1") -> Path:
    """``<tmp>/{node}.toml`` as slurm.conf's hooks name it; ``<tmp>/<host>.toml`` holds the settings."""
    (tmp_path / f"{host}.toml").write_text(
        f'[agent]\nhost_id = "{host}"\noutbox_dir = "{tmp_path}/outbox"\nslurm_dir = "{tmp_path}/slurm"\n'
    )
    return tmp_path / "{node}.toml"


def slurmd_proc(root: Path) -> Path:
    """A /proc whose entries for this process and its parent are the real ones, the parent named
    ``slurmd``; its pid namespace and the boot id are the host's."""
    me, parent = os.getpid(), os.getppid()
    for pid in (me, parent):
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
        text = Path(f"/proc/{pid}/stat").read_text()
        if pid == parent:
            text = f"{pid} (slurmd) {text[text.rindex(')') + 2 :]}"
        (root / str(pid) / "stat").write_text(text)
        if not (root / str(pid) / "ns").exists():
            (root / str(pid) / "ns").symlink_to(f"/proc/{pid}/ns")
    if not (root / "sys").exists():
        (root / "sys").symlink_to("/proc/sys")
    return root
