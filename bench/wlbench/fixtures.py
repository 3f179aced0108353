"""The fixture host: a sysfs tree (2-socket RAPL, 4 NICs), 8 stand-in GPUs, a replayed Neuron stream."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sysfs_trees import Constraint, Iface, Zone, net_tree, powercap_tree

from wlbench.common import TESTS

#: RAPL zones per socket (the package zone and its three subzones) and the NICs.
SOCKETS = 2
SUBZONES = ("core", "uncore", "dram")
NICS = 4
GPUS = 8
#: Counter files the RAPL + NIC agent reads per tick: 2 x 4 energy_uj + 4 x 4 statistics.
RAPL_NIC_FILES = SOCKETS * (1 + len(SUBZONES)) + NICS * 4


def rapl_zones(start_uj: int = 1_000_000) -> list[Zone]:
    zones = []
    for s in range(SOCKETS):
        package = Constraint(name="long_term", power_limit_uw=150_000_000, max_power_uw=200_000_000)
        zones.append(Zone(f"intel-rapl:{s}", f"package-{s}", start_uj + s, constraints=[package]))
        for i, name in enumerate(SUBZONES):
            zones.append(Zone(f"intel-rapl:{s}:{i}", name, start_uj + 10 * (i + 1) + s))
    return zones


def host_tree(root: Path) -> Path:
    """The RAPL + NIC tree under ``root`` (``root/sys/...``)."""
    powercap_tree(root, rapl_zones())
    stats = {"rx_bytes": 10**9, "tx_bytes": 2 * 10**9, "rx_packets": 10**6, "tx_packets": 2 * 10**6}
    net_tree(root, [Iface(f"eth{i}", pci=f"0000:00:{5 + i:02x}.0", stats=stats) for i in range(NICS)])
    return root


def nvml_scenario(path: Path, gpus: int = GPUS) -> Path:
    """A scenario file for the NVML stand-in: ``gpus`` GPUs with energy counters."""
    lines = ["driver 550.54.15", ""]
    for g in range(gpus):
        lines += [
            f"gpu GPU-{g:08x}-0000-4000-8000-000000000000 NVIDIA H100 80GB HBM3",
            "energy " + " ".join(str(10_000_000 * g + 25_000 * k) for k in range(250)),
            "util 50:20 60:25 70:30",
            "memory 85899345920:1073741824",
            "limit 700000",
            "",
        ]
    path.write_text("\n".join(lines))
    return path


@dataclass
class FixtureHost:
    """Everything an agent of the benchmark needs: tree, config file, environment."""

    tree: Path
    config: Path
    env_all: dict[str, str]  #: environment for agents with every source (NVML stand-in)


def make_host(work: Path) -> FixtureHost:
    import nvml_stub.build as stub  # tests/nvml_stub/build.py (compiles once per change)

    tree = host_tree(work / "tree")
    scenario = nvml_scenario(work / "gpus.txt")
    config = work / "agent.toml"
    replay = TESTS / "helpers" / "neuron_replay.py"
    config.write_text(f'[sources.neuron]\nmonitor_path = "{replay}"\n')
    env = {
        "LD_LIBRARY_PATH": str(stub.build_stub()),
        "WATTLINE_NVML_SCENARIO": str(scenario),
    }
    return FixtureHost(tree, config, env)
