"""Host settings wattline applies for a sweep and always restores: a GPU's power limit
(NVML, :mod:`.gpu_power`), the CPU frequency ceiling and governor (cpufreq sysfs,
:mod:`.cpufreq`). Before changing anything, the original values go to a restore record on
disk (:mod:`.records`), so the next wattline process on the host restores them when the
process that changed them died without doing so.

Floor 2, beside the sources: the agent restores what a dead sweep left, without importing
the workloads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from wattline.config import ConfigError


class NotPermitted(ConfigError):
    """The host does not let this process change a setting (one line, exit 2; nothing changed)."""


class Knob(Protocol):
    """One setting a sweep parameter drives."""

    #: the ``--param`` name, and the restore record's kind
    param: str
    kind: str

    def check(self, values: Sequence[str]) -> None:
        """ConfigError for a value the host cannot take; :class:`NotPermitted` where it may not
        be changed at all. Changes nothing."""

    def saved(self) -> dict[str, Any]:
        """What :func:`restore` of this kind needs to put the setting back as it is now (JSON)."""

    def apply(self, value: str) -> None:
        """Set the value (checked by :meth:`check`)."""
