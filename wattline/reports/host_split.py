"""What a report says of how a host's host-wide energy (CPU, DRAM, NIC: channels no job
claims) was split between the job and the rest: by which rule, what part the job got, and
how much of it was estimated where the job's CPU time was not read."""

from __future__ import annotations

import math
from collections.abc import Sequence

from wattline.accounting.attribution import Attribution, ChannelEnergy
from wattline.accounting.window_energy import window_energy


def host_split_notes(
    attribution: Attribution,
    keys: Sequence[str],
    channels: Sequence[ChannelEnergy],
    window: tuple[int, int],
    rule: str,
    others: int,
) -> list[str]:
    """The notes of one host: ``keys`` are the job's windows there, ``window`` its span on
    the host, ``others`` how many other jobs' windows overlapped it."""
    wide = [c for c in channels if not c.claim_keys]
    if not wide:
        return []
    host = wide[0].host
    shared = f"shared with {others} other job(s); " if others else ""
    if rule != "cpu-time":
        return [f"{host}: {shared}split by rule {rule!r}"] if others else []
    names = {(c.component, c.device) for c in wide}
    mine = [s for s in attribution.shares if s.job_id in keys and s.host == host and (s.component, s.device) in names]
    got = math.fsum(s.energy_j for s in mine)
    there = math.fsum(window_energy(c.intervals, *window) for c in wide)
    if there <= 0:
        return []
    components = ", ".join(sorted({c.component for c in wide}))
    text = (
        f"{host}: {shared}host-wide energy ({components}) split by CPU time: the job got {100 * got / there:.3g} % "
        f"of it in its window ({got:.4g} of {there:.4g} J), the rest went to other jobs and other processes"
    )
    guessed, off = math.fsum(s.estimated_j for s in mine), math.fsum(s.estimate_bound_j for s in mine)
    if guessed > 0 or off > 0:
        text += f"; {guessed:.3g} J of it estimated where the job's CPU time was not read (± {off:.3g} J)"
    return [text]
