"""A real Slurm on loopback for the hook tests: munged, slurmctld and two slurmd (n1, n2),
the hooks of ``deploy/slurm/`` (their two settings lines pointed here), each node with its
own wattline config (host id, outbox, events directory) and agent on a powercap tree
advanced at a known power, one collector and a SQLite store. Stopped by PID.

Debian's Slurm 22.05 + munge, checked on these machines; what the hook tests cover is in
docs/operations/slurm.md.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import slurm_accounting
from procs import Proc, start_collector
from servers import free_port
from sysfs_trees import PowerAdvancer, Zone, powercap_tree

import wattline

BINARIES = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch", "/usr/bin/scontrol")
REPO = Path(__file__).resolve().parents[2]
START_UJ = 10**11
#: The agents' and readers' heartbeat period (lease: three of them): short, so a job that
#: outlives the lease is one that only the agent's heartbeats keep running; over the
#: agent's outbox pass (5 s) minus a period, so they do.
HEARTBEAT_S = "3"


def missing() -> str:
    """Why the cluster cannot start here ('' when it can)."""
    absent = [b for b in BINARIES if not os.access(b, os.X_OK)]
    if absent:
        return f"Slurm/munge binaries absent ({', '.join(absent)}): apt-get install slurmctld slurmd slurm-client munge"
    if os.geteuid() != 0:
        return "a Slurm cluster needs root (slurmd runs jobs as their users)"
    return ""


@dataclass
class Cluster:
    root: Path
    db: Path
    power_w: dict[str, float]
    env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)
    agents: dict[str, Proc] = field(default_factory=dict)  #: each node's agent (also in procs)
    pid_files: list[Path] = field(default_factory=list)
    trees: list[PowerAdvancer] = field(default_factory=list)
    #: What slurm.conf names as hooks: wattline's; "noop" scripts that only exit 0; "none"
    #: (bench/run's yardsticks: Slurm's cost of running any hook, and of none).
    hooks: str = "wattline"
    accounting: bool = False

    def config(self, node: str) -> Path:
        return self.root / f"{node}.toml"

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster."""
        return subprocess.run(  # in its root: sbatch writes slurm-N.out where it runs
            list(args), capture_output=True, text=True, timeout=timeout, env=self.env, check=True, cwd=self.root
        )

    def restart_agent(self, node: str) -> Proc:
        """Start ``node``'s agent again as it was started (after the test killed it)."""
        old = self.agents[node]
        new = self.agents[node] = Proc(old.args, old.log_path, {"WATTLINE_HEARTBEAT_S": HEARTBEAT_S})
        self.procs.append(new)
        return new

    def stop(self) -> None:
        for proc in self.procs:  # all at once: an agent takes seconds to stop
            if proc.alive():
                proc.process.send_signal(signal.SIGTERM)
        for proc in self.procs:
            proc.terminate(10)
        for path in self.pid_files:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(path.read_text().split()[0]), signal.SIGTERM)
        for tree in self.trees:
            tree.close()
        time.sleep(0.5)
        shutil.rmtree(self.root, ignore_errors=True)


def _hook(name: str, root: Path, noop: bool = False) -> Path:
    """``deploy/slurm/NAME`` with its settings pointed at this interpreter, tree (then its
    dependencies' site-packages) and configs; ``noop``: a script that only exits 0."""
    text = "#!/bin/sh\nexit 0\n" if noop else (REPO / "deploy" / "slurm" / name).read_text()
    package_parent = Path(wattline.__file__).resolve().parent.parent
    text = text.replace("PYTHON=/usr/bin/python3", f"PYTHON={sys.executable}")
    text = text.replace(
        "PYPATH=/usr/lib/python3/dist-packages", f"PYPATH={package_parent}:{sysconfig.get_paths()['purelib']}"
    )
    text = text.replace("CONFIG=/etc/wattline/wattline.toml", f"CONFIG={root}/{{node}}.toml")
    path = root / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def _wait(check: object, what: str, log: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(
        f"{what} not up after {timeout_s} s:\n{log.read_text(errors='replace')[-3000:] if log.exists() else ''}"
    )


def start(power_w: dict[str, float], hooks: str = "wattline", accounting: bool = False) -> Cluster:
    """Start it all; a cluster whose every node is idle and whose collector serves (``hooks``:
    see :attr:`Cluster.hooks`; ``accounting``: slurmdbd on MariaDB, tests/helpers/slurm_accounting.py,
    and the collector writes jobs' AdminComment)."""
    root = Path(tempfile.mkdtemp(prefix="wl-slurm-"))
    root.chmod(0o755)  # munged runs as munge and must reach its own directory
    for sub in ("state", "spool", "log", "munge"):
        (root / sub).mkdir()
    munge = pwd.getpwnam("munge")
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    for path in (root / "munge", key):
        os.chown(path, munge.pw_uid, munge.pw_gid)
    key.chmod(0o400)
    env = {
        "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
        "SLURM_CONF": str(root / "slurm.conf"),
        "PYTHONPATH": str(Path(wattline.__file__).resolve().parent.parent),
        "WATTLINE_HEARTBEAT_S": HEARTBEAT_S,
        "COLUMNS": "250",
        "HOME": str(root),
    }
    db = root / "w.db"
    cluster = Cluster(root, db, power_w, env, hooks=hooks, accounting=accounting)
    try:
        _start(cluster, munge)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start(cluster: Cluster, munge: pwd.struct_passwd) -> None:
    root = cluster.root
    sock = root / "munge" / "munge.sock"
    subprocess.run(
        [
            "/usr/sbin/munged",
            f"--socket={sock}",
            f"--key-file={root}/munge/munge.key",
            f"--pid-file={root}/munge/munged.pid",
            f"--log-file={root}/munge/munged.log",
            f"--seed-file={root}/munge/munge.seed",
        ],
        check=True,
        user=munge.pw_uid,
        group=munge.pw_gid,
        timeout=30,
    )
    cluster.pid_files.append(root / "munge" / "munged.pid")
    port = free_port()
    if cluster.accounting:  # sacct and sacctmgr through slurm_accounting.wrappers
        cluster.env["PATH"] = f"{root}/bin:{cluster.env['PATH']}"
    env = cluster.env
    writes = {"PATH": env["PATH"], "SLURM_CONF": env["SLURM_CONF"], "WATTLINE_COLLECTOR_SLURM_ADMIN_COMMENT": "true"}
    writes["WATTLINE_COLLECTOR_SLURM_ADMIN_COMMENT_TIMEOUT"] = "2"  # slurmdbd stopped: a short wait
    collector = start_collector(
        port,
        ["--store", f"sqlite:///{cluster.db}"],
        root / "log" / "collector.log",
        env={"WATTLINE_HEARTBEAT_S": HEARTBEAT_S, **(writes if cluster.accounting else {})},
    )
    cluster.procs.append(collector)
    host = socket.gethostname().split(".")[0]
    ctld, ports = free_port(), {node: free_port() for node in cluster.power_w}
    nodes = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs=2 RealMemory=2000 State=UNKNOWN"
        for n, p in ports.items()
    )
    hooks = {name: _hook(name, root, cluster.hooks == "noop") for name in ("prolog", "epilog", "task-prolog")}
    hook_lines = (
        f"Prolog={hooks['prolog']}\nEpilog={hooks['epilog']}\nTaskProlog={hooks['task-prolog']}\nPrologFlags=Alloc\n"
        if cluster.hooks != "none"
        else ""
    )
    dbd, ctld_bin = "", "/usr/sbin/slurmctld"
    if cluster.accounting:
        ctld_bin = str(slurm_accounting.wrappers(root, sock) / "slurmctld")
        dbd = slurm_accounting.start(root, sock, cluster.env, cluster.pid_files)
    (root / "slurm.conf").write_text(
        f"""ClusterName=wl
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld}
AuthType=auth/munge
AuthInfo=socket={sock}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=600
{dbd}{hook_lines}{nodes}
PartitionName=debug Nodes={",".join(ports)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
    )
    for node, watts in cluster.power_w.items():
        tree = powercap_tree(root / f"sys-{node}", [Zone("intel-rapl:0", "package-0", START_UJ)])
        cluster.trees.append(PowerAdvancer(tree, {"intel-rapl:0": watts}, START_UJ))
        cluster.config(node).write_text(
            f'[agent]\nhost_id = "{node}"\noutbox_dir = "{root}/{node}/outbox"\nslurm_dir = "{root}/{node}/slurm"\n'
        )
        args = ["agent", "--config", str(cluster.config(node)), "--sysfs-root", str(tree), "--source", "rapl"]
        args += ["--interval", "0.25", "--batch-interval", "0.5", f"--collector=127.0.0.1:{port}"]
        agent = cluster.agents[node] = Proc(
            args, root / "log" / f"agent-{node}.log", {"WATTLINE_HEARTBEAT_S": HEARTBEAT_S}
        )
        cluster.procs.append(agent)
    conf = str(root / "slurm.conf")
    if cluster.accounting:
        slurm_accounting.add_cluster(cluster.env, root / "log" / "slurmdbd.log")
    subprocess.run([ctld_bin, "-f", conf], check=True, env=cluster.env, timeout=30)
    cluster.pid_files.append(root / "slurmctld.pid")
    for node in cluster.power_w:
        subprocess.run(["/usr/sbin/slurmd", "-N", node, "-f", conf], check=True, env=cluster.env, timeout=30)
        cluster.pid_files.append(root / f"slurmd.{node}.pid")

    def idle() -> bool:
        out = subprocess.run(["sinfo", "-h", "-o", "%t %D"], capture_output=True, text=True, env=cluster.env)
        return out.stdout.split() == ["idle", str(len(cluster.power_w))]

    _wait(idle, "slurm nodes", root / "log" / "slurmctld.log")
