"""The CPU frequency ceiling (``scaling_max_freq``) and governor (``scaling_governor``) of
every cpufreq policy, under ``<root>/sys/devices/system/cpu/cpufreq/policy*/`` (the Linux
cpufreq sysfs ABI; values in kHz).

``--param cpu_max_freq=2.0GHz,3.0GHz`` (also MHz, or kHz as a bare number) and
``--param cpu_governor=powersave,performance``. Whether the host permits a change is
found by writing each file's own value back, which changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wattline.agent.tuning import NotPermitted
from wattline.config import ConfigError

MAX_FREQ = "cpu_max_freq"
GOVERNOR = "cpu_governor"
KIND = "cpufreq"
_FREQ = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(GHz|MHz|kHz)?\s*", re.IGNORECASE)
_KHZ = {"ghz": 1e6, "mhz": 1e3, "khz": 1.0, "": 1.0}


def policies(root: Path) -> list[Path]:
    """The cpufreq policy directories, in numeric order."""
    base = root / "sys/devices/system/cpu/cpufreq"
    found = [p for p in base.glob("policy*") if p.name[6:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[6:]))


def khz(text: str) -> int:
    """``2.4GHz`` / ``2400MHz`` / ``2400000`` (kHz) in kHz; ValueError otherwise."""
    m = _FREQ.fullmatch(text)
    if m is None:
        raise ValueError(f"{text[:40]!r} is not a frequency (2.4GHz, 2400MHz, or kHz)")
    return round(float(m.group(1)) * _KHZ[(m.group(2) or "").lower()])


def _write(path: Path, value: str) -> None:
    with path.open("w") as f:
        f.write(value)


class CpuFreq:
    """One of the two cpufreq settings (``file``) over every policy."""

    kind = KIND

    def __init__(self, param: str, root: Path) -> None:
        self.param = param
        self.file = "scaling_max_freq" if param == MAX_FREQ else "scaling_governor"
        self.root = root

    def _files(self) -> list[Path]:
        found = policies(self.root)
        if not found:
            raise NotPermitted(
                f"--param {self.param}: no cpufreq policies under {self.root / 'sys/devices/system/cpu/cpufreq'} "
                "(no cpufreq driver: a virtual machine or container?); nothing changed"
            )
        return [p / self.file for p in found]

    def _value(self, text: str) -> str:
        return str(khz(text)) if self.file == "scaling_max_freq" else text

    def check(self, values: Sequence[str]) -> None:
        files = self._files()
        for policy in (f.parent for f in files):
            for v in values:
                try:
                    self._check_one(policy, v)
                except ValueError as exc:
                    raise ConfigError(f"--param {self.param}: {exc}") from None
        for f in files:
            try:
                _write(f, f.read_text().strip())
            except OSError as exc:
                raise NotPermitted(
                    f"--param {self.param}: cannot write {f} ({exc.strerror or exc}; root needed); nothing changed"
                ) from None

    def _check_one(self, policy: Path, value: str) -> None:
        if self.file == "scaling_max_freq":
            lo, hi = (int((policy / n).read_text()) for n in ("cpuinfo_min_freq", "cpuinfo_max_freq"))
            if not lo <= khz(value) <= hi:
                raise ValueError(f"{value} is outside {policy.name}'s {lo}-{hi} kHz")
            return
        available = (policy / "scaling_available_governors").read_text().split()
        if value not in available:
            raise ValueError(f"{value!r} is not one of {policy.name}'s governors ({', '.join(available)})")

    def saved(self) -> dict[str, Any]:
        return {str(f): f.read_text().strip() for f in self._files()}

    def apply(self, value: str) -> None:
        for f in self._files():
            _write(f, self._value(value))


def restore(state: dict[str, Any]) -> None:
    """Write back each file's saved value (the ceiling after the governor is no matter: each
    file is its own setting)."""
    for path, value in state.items():
        _write(Path(path), str(value))
