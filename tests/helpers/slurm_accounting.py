"""Slurm's accounting for the test cluster: Debian's MariaDB on a data dir, socket and port
of its own, and slurmdbd (StorageType=accounting_storage/mysql) on a free port, started
before the controller (what it covers: docs/operations/slurm.md, "Energy in sacct"). Stopped by PID.

Slurm 22.05's connections to slurmdbd ignore ``AuthInfo=socket=`` and use munge's default
socket (/run/munge/munge.socket.2; found here: "Protocol authentication error"). So every
program that talks to slurmdbd (slurmdbd, slurmctld, sacct, sacctmgr) runs through
``bin/in-munge-ns``: a mount namespace of its own where /run/munge is this cluster's munge
directory, so no test touches another's munged. ``bin/`` also holds ``sacct`` and
``sacctmgr`` so wrapped, first in the cluster's PATH (and the collector's).
"""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
import time
from pathlib import Path

from servers import free_port

BINARIES = ("/usr/sbin/slurmdbd", "/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db", "/usr/bin/sacctmgr")
#: The programs that talk to slurmdbd, run through ``bin/in-munge-ns``.
COMMANDS = {
    "sacct": "/usr/bin/sacct",
    "sacctmgr": "/usr/bin/sacctmgr",
    "slurmdbd": "/usr/sbin/slurmdbd",
    "slurmctld": "/usr/sbin/slurmctld",
}


def missing() -> str:
    """Why accounting cannot start here ('' when it can)."""
    absent = [b for b in BINARIES if not os.access(b, os.X_OK)]
    return f"absent: {', '.join(absent)} (apt-get install slurmdbd mariadb-server)" if absent else ""


def wrappers(root: Path, sock: Path) -> Path:
    """``root/bin``: ``in-munge-ns`` (runs its arguments where /run/munge holds a
    munge.socket.2 that is ``sock``) and ``sacct``, ``sacctmgr``, ``slurmdbd`` through it."""
    run, bin_dir = root / "munge-run", root / "bin"
    run.mkdir()
    bin_dir.mkdir()
    (run / "munge.socket.2").symlink_to(sock)
    Path("/run/munge").mkdir(parents=True, exist_ok=True)  # the mount point (empty; nothing else uses it)
    scripts = {
        "in-munge-ns": f'exec unshare -m --propagation private sh -c \'mount --bind {run} /run/munge && exec "$@"\' sh "$@"',
        **{name: f'exec {bin_dir}/in-munge-ns {path} "$@"' for name, path in COMMANDS.items()},
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def start(root: Path, sock: Path, env: dict[str, str], pid_files: list[Path]) -> str:
    """Start MariaDB and slurmdbd under ``root`` (munged at ``sock``; :func:`wrappers` made);
    the slurm.conf lines that point the controller at them."""
    mysql = pwd.getpwnam("mysql")
    run, data = root / "dbrun", root / "dbrun" / "data"  # mariadbd (as mysql) writes there only
    for path in (run, data):
        path.mkdir()
        os.chown(path, mysql.pw_uid, mysql.pw_gid)
    subprocess.run(
        ["mariadb-install-db", "--user=mysql", f"--datadir={data}", "--auth-root-authentication-method=normal"],
        check=True,
        capture_output=True,
        timeout=120,
        env=env,
    )
    db_sock, db_port, dbd_port = run / "db.sock", free_port(), free_port()
    pid = run / "mariadb.pid"
    pid_files.append(pid)
    mariadbd = ["/usr/sbin/mariadbd", "--no-defaults", "--user=mysql", f"--datadir={data}", f"--socket={db_sock}"]
    mariadbd += [f"--pid-file={pid}", "--bind-address=127.0.0.1", f"--port={db_port}", "--skip-log-bin"]
    mariadbd += [f"--log-error={run}/mariadb.log", "--innodb-buffer-pool-size=32M"]
    quiet = subprocess.DEVNULL
    subprocess.Popen(mariadbd, stdin=quiet, stdout=quiet, stderr=quiet, start_new_session=True)
    password = secrets.token_hex(8)
    sql = (
        f"create database slurm_acct_db; create user 'slurm'@'127.0.0.1' identified by '{password}'; "
        "grant all on slurm_acct_db.* to 'slurm'@'127.0.0.1';"
    )
    _until_ok(["mariadb", f"--socket={db_sock}", "-u", "root", "-e", sql], env, run / "mariadb.log")
    conf = root / "slurmdbd.conf"  # slurmdbd reads it beside $SLURM_CONF
    conf.write_text(
        f"AuthType=auth/munge\nAuthInfo=socket={sock}\nDbdHost=localhost\nDbdAddr=127.0.0.1\nDbdPort={dbd_port}\n"
        f"SlurmUser=root\nPidFile={root}/slurmdbd.pid\nLogFile={root}/log/slurmdbd.log\n"
        f"StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={db_port}\n"
        f"StorageUser=slurm\nStoragePass={password}\nStorageLoc=slurm_acct_db\n"
    )
    conf.chmod(0o600)
    subprocess.run([str(root / "bin" / "slurmdbd")], check=True, env=env, timeout=60)
    pid_files.append(root / "slurmdbd.pid")
    return (
        "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
        f"AccountingStoragePort={dbd_port}\nJobCompType=jobcomp/none\n"
    )


def add_cluster(env: dict[str, str], log: Path) -> None:
    """``sacctmgr -i add cluster wl`` once slurmdbd answers (before the controller starts)."""
    _until_ok(["sacctmgr", "-i", "add", "cluster", "wl"], env, log)


def _until_ok(argv: list[str], env: dict[str, str], log: Path, tries: int = 60) -> None:
    out = None
    for _ in range(tries):
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
        if out.returncode == 0:
            return
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise AssertionError(f"{argv[0]} failed: {out.stderr if out else ''}\n{tail}")
