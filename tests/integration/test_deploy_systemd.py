"""deploy/systemd: the units verify cleanly, stay hardened, and do what README promises.

Needs ``systemd-analyze`` and ``systemd-sysusers`` (Debian package ``systemd``, which
.ci/run installs); no running systemd. Exposure scores achieved with systemd 252
(Debian 12): agent 1.5, collector 1.1 ("OK"); the thresholds below leave room for a
newer systemd's extra checks, not for loosening the units.
"""

from __future__ import annotations

import grp
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEMD_DIR = REPO / "deploy" / "systemd"
AGENT = "wattline-agent.service"
COLLECTOR = "wattline-collector.service"
UNITS = (AGENT, COLLECTOR)
INSTALLED = "/opt/wattline/venv/bin/wattline"
#: The agent runs the lean entry point with the venv's python.
INSTALLED_PYTHON = "/opt/wattline/venv/bin/python"
CONFIG = "/etc/wattline/wattline.toml"

#: Highest accepted `systemd-analyze security` exposure (0 = locked down, 10 = unsafe).
THRESHOLD = {AGENT: 2.0, COLLECTOR: 1.5}

#: Checks of `systemd-analyze security --json` that must pass for both units.
REQUIRED_BOTH = {
    "UserOrDynamicUser",
    "NoNewPrivileges",
    "AmbientCapabilities",
    "CapabilityBoundingSet_CAP_SYS_ADMIN",
    "CapabilityBoundingSet_CAP_SYS_PTRACE",
    "CapabilityBoundingSet_CAP_NET_ADMIN",
    "CapabilityBoundingSet_CAP_DAC_FOWNER_IPC_OWNER",
    "CapabilityBoundingSet_CAP_SYS_RAWIO",
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateMounts",
    "ProtectProc",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectClock",
    "ProtectHostname",
    "RestrictNamespaces_user",
    "RestrictNamespaces_net",
    "RestrictNamespaces_mnt",
    "RestrictRealtime",
    "RestrictSUIDSGID",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "SystemCallArchitectures",
    "SystemCallFilter_privileged",
    "SystemCallFilter_resources",
    "SystemCallFilter_mount",
    "SystemCallFilter_module",
    "SystemCallFilter_raw_io",
    "RestrictAddressFamilies_AF_PACKET",
    "RestrictAddressFamilies_OTHER",
    "RemoveIPC",
    "KeyringMode",
    "NotifyAccess",
    "UMask",
}
REQUIRED = {
    AGENT: REQUIRED_BOTH,
    COLLECTOR: REQUIRED_BOTH | {"PrivateDevices", "PrivateUsers", "RestrictAddressFamilies_AF_NETLINK"},
}


def tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/bin:/bin")
    assert path, f"{name} not found: install the Debian package systemd (.ci/run does)"
    return path


def run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SYSTEMD_LOG_LEVEL": "info",
        "SYSTEMD_LOG_COLOR": "0",
        "SYSTEMD_COLORS": "0",
        "SYSTEMD_PAGER": "cat",
    }
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=120, check=False)


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """section -> key -> every value in order (systemd keys repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def service(name: str) -> dict[str, list[str]]:
    return parse_unit((SYSTEMD_DIR / name).read_text())["Service"]


def one(values: dict[str, list[str]], key: str) -> str:
    assert len(values.get(key, [])) == 1, f"{key}: expected exactly one value, got {values.get(key)}"
    return values[key][0]


def stand_in_binary() -> str:
    """An executable for ExecStart= here: the venv's own console script when installed."""
    script = Path(sys.executable).with_name("wattline")
    if script.is_file() and os.access(script, os.X_OK):
        return str(script)
    return tool("true")


def staged(tmp_path: Path, name: str, extra: str = "") -> Path:
    """A copy of unit ``name`` whose ExecStart= points at an executable that exists here."""
    text = (SYSTEMD_DIR / name).read_text()
    assert INSTALLED in text or INSTALLED_PYTHON in text
    text = text.replace(INSTALLED, stand_in_binary()).replace(INSTALLED_PYTHON, sys.executable)
    if extra:
        text = text.replace("[Service]\n", "[Service]\n" + extra, 1)
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", UNITS)
def test_verify_is_silent(tmp_path: Path, name: str) -> None:
    for key in ("ExecStartPre", "ExecStart"):
        for command in service(name).get(key, []):
            binary = shlex.split(command.lstrip("@-:+!"))[0]
            if binary not in (INSTALLED, INSTALLED_PYTHON):
                assert os.access(binary, os.X_OK), f"{name}: {key} runs {binary}, not executable here"
    result = run(tool("systemd-analyze"), "verify", "--man=no", str(staged(tmp_path, name)), cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_verify_reports_typos(tmp_path: Path) -> None:
    """The check above would see a typo: systemd only warns about one and carries on."""
    unit = staged(tmp_path, AGENT, extra="NoNewPrivilege=yes\nProtectSystem=stricter\n")
    result = run(tool("systemd-analyze"), "verify", "--man=no", str(unit), cwd=tmp_path)
    assert "Unknown key 'NoNewPrivilege'" in result.stderr
    assert "stricter" in result.stderr


@pytest.mark.parametrize("name", UNITS)
def test_exposure_score(tmp_path: Path, name: str) -> None:
    result = run(tool("systemd-analyze"), "security", "--offline=true", "--no-pager", str(staged(tmp_path, name)))
    assert result.returncode == 0, result.stderr
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert found, result.stdout[-2000:]
    assert float(found.group(1)) <= THRESHOLD[name], result.stdout


@pytest.mark.parametrize("name", UNITS)
def test_hardening_checks_pass(tmp_path: Path, name: str) -> None:
    result = run(
        tool("systemd-analyze"), "security", "--offline=true", "--json=short", "--no-pager", str(staged(tmp_path, name))
    )
    assert result.returncode == 0, result.stderr
    checks = {item["json_field"]: item["set"] for item in json.loads(result.stdout)}
    failing = sorted(field for field in REQUIRED[name] if checks.get(field) is not True)
    assert failing == []


@pytest.mark.parametrize(
    ("name", "command"), [(AGENT, f"{INSTALLED_PYTHON} -m wattline.agent"), (COLLECTOR, f"{INSTALLED} collector")]
)
def test_notify_restart_and_paths(name: str, command: str) -> None:
    s = service(name)
    assert one(s, "ExecStart") == f"{command} --config {CONFIG}"
    assert one(s, "Type") == "notify"
    assert one(s, "NotifyAccess") == "main"
    assert one(s, "WatchdogSec").endswith("s")
    assert one(s, "Restart") == "on-failure"
    assert one(s, "RestartSec") == "5s"
    assert one(s, "RestartPreventExitStatus") == "2"  # wattline's exit status for a config error
    assert (one(s, "User"), one(s, "Group")) == ("wattline", "wattline")
    assert "DynamicUser" not in s
    assert one(s, "StateDirectory") == "wattline"
    assert one(s, "ConfigurationDirectory") == "wattline"
    assert "ReadWritePaths" not in s
    assert one(s, "UMask") == "0077"
    assert one(s, "ProtectSystem") == "strict"
    assert s["CapabilityBoundingSet"] == [""]
    assert s["AmbientCapabilities"] == [""]
    assert one(s, "StandardError") == "journal"
    assert one(s, "MemoryMax")
    assert parse_unit((SYSTEMD_DIR / name).read_text())["Install"]["WantedBy"] == ["multi-user.target"]


def test_agent_devices_and_groups() -> None:
    s = service(AGENT)
    assert one(s, "SupplementaryGroups") == "powercap"
    assert one(s, "PrivateDevices") == "no"
    assert one(s, "DevicePolicy") == "closed"
    allowed = set(s["DeviceAllow"])
    assert {"char-nvidia-frontend rw", "char-nvidiactl rw", "char-nvidia-caps r", "char-neuron rw"} <= allowed
    assert not any("uvm" in entry for entry in allowed)  # NVML does not need CUDA's UVM
    assert one(s, "RestrictAddressFamilies") == "AF_UNIX AF_INET AF_INET6 AF_NETLINK"
    assert one(s, "ProtectProc") == "invisible"


def test_collector_has_no_devices() -> None:
    s = service(COLLECTOR)
    assert one(s, "PrivateDevices") == "yes"
    assert "DeviceAllow" not in s
    assert "SupplementaryGroups" not in s
    assert "ExecStartPre" not in s
    assert one(s, "RestrictAddressFamilies") == "AF_UNIX AF_INET AF_INET6"


def powercap_grant_script(root: Path, group: str) -> list[str]:
    """The agent's privileged ExecStartPre= as argv, aimed at ``root`` and ``group``."""
    (command,) = service(AGENT)["ExecStartPre"]
    assert command.startswith("+/bin/sh -c '"), command
    # systemd turns "$$" into "$"; the rest of this line has no specifiers or variables.
    assert "%" not in command and re.search(r"(?<!\$)\$(?!\$)", command) is None, command
    argv = shlex.split(command[1:].replace("$$", "$"))
    argv[2] = argv[2].replace("/sys/class/powercap", str(root)).replace("chgrp powercap", f"chgrp {group}")
    return argv


def test_powercap_grant(tmp_path: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    zones = ["intel-rapl:0", "intel-rapl:0:0", "intel-rapl:1:2", "intel-rapl-mmio:0"]
    for zone in [*zones, "dtpm:0"]:
        (tmp_path / zone).mkdir()
        counter = tmp_path / zone / "energy_uj"
        counter.write_text("123\n")
        counter.chmod(0o400)
    result = subprocess.run(powercap_grant_script(tmp_path, group), capture_output=True, text=True, check=False)
    assert (result.returncode, result.stderr) == (0, "")
    for zone in zones:
        st = (tmp_path / zone / "energy_uj").stat()
        assert stat.S_IMODE(st.st_mode) == 0o440, zone
        assert st.st_gid == os.getgid()
    assert stat.S_IMODE((tmp_path / "dtpm:0" / "energy_uj").stat().st_mode) == 0o400


@pytest.mark.parametrize("present", [True, False])
def test_powercap_grant_without_rapl(tmp_path: Path, present: bool) -> None:
    root = tmp_path / "powercap"
    if present:
        root.mkdir()  # a VM: the class directory exists, without zones
    result = subprocess.run(powercap_grant_script(root, "nogroup"), capture_output=True, text=True, check=False)
    assert (result.returncode, result.stderr) == (0, "")


def test_sysusers_creates_user_and_group(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    conf = SYSTEMD_DIR / "wattline.sysusers.conf"
    result = run(tool("systemd-sysusers"), f"--root={tmp_path}", str(conf))
    assert result.returncode == 0, result.stderr
    passwd = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines()}
    groups = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc/group").read_text().splitlines()}
    user = passwd["wattline"]
    assert int(user[2]) < 1000, "a system user"
    assert user[5:] == ["/var/lib/wattline", "/usr/sbin/nologin"]
    assert groups["wattline"][2] == user[3]
    assert groups["powercap"][3].split(",") == ["wattline"]
