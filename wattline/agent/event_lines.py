"""A workload's events-file line (``units N [UNIX_TIME]``, ``phase NAME [UNIX_TIME]``) as the
agent reads it: one parser for every events file the agent follows (a pod's, a Slurm job's)."""

from __future__ import annotations

import math
from typing import Any

from wattline import wire

#: Longest line read; a longer one is no event.
MAX_LINE = 4096
Kind = wire.pb.JobEvent


def line_event(line: str) -> tuple[wire.pb.JobEvent.Kind, dict[str, Any], int | None] | None:
    """``units N [UNIX_TIME]`` / ``phase NAME [UNIX_TIME]`` as (kind, fields, time); None otherwise."""
    parts = line.split()
    if len(parts) not in (2, 3) or parts[0] not in ("units", "phase") or len(line) > MAX_LINE:
        return None
    stamp = None
    try:
        if len(parts) == 3:
            stamp = int(float(parts[2]) * 1e9)
            if not 0 < stamp < 1 << 62:
                return None
        if parts[0] == "units":
            units = float(parts[1])
            return (Kind.KIND_UNITS, {"units": units}, stamp) if 0 <= units < math.inf else None
    except (ValueError, OverflowError):
        return None
    return Kind.KIND_PHASE, {"phase": parts[1][:64]}, stamp
