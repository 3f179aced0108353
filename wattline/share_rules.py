"""The rules that split a host's energy between the jobs that ran on it together: their names,
the default and their check, in one place for every surface (``report``, ``jobs``,
``compare``, ``export``, ``sweep``, ``run`` and the stored summaries).

The arithmetic is in :mod:`wattline.accounting.attribution`; docs/jobs.md says what
each rule does.
"""

from __future__ import annotations

from typing import Literal

from wattline.config import ConfigError

ShareKind = Literal["cpu-time", "equal", "device-share", "exclusive"]
SHARE_RULES: tuple[ShareKind, ...] = ("cpu-time", "equal", "device-share", "exclusive")
#: Host-wide energy by each job's measured CPU time, the rest (other processes') unattributed.
DEFAULT_SHARE_RULE: ShareKind = "cpu-time"
#: One line for --help: the rules and what the default does.
SHARE_RULE_HELP = (
    "Split of host-wide energy (CPU, DRAM, NIC) between jobs: cpu-time (by each job's measured CPU "
    "time; where a job's was not read, estimated within the bound), equal, device-share, exclusive."
)


def check_share_rule(value: str, option: str) -> ShareKind:
    """``value`` as a rule; ConfigError naming ``option`` when it is none of :data:`SHARE_RULES`."""
    for rule in SHARE_RULES:
        if value == rule:
            return rule
    raise ConfigError(f"option {option}: {value[:100]!r} is not {', '.join(SHARE_RULES[:-1])} or exclusive")
