"""Jobs sharing an accelerator: their recorded use, and what each report says per device.

A job's wrapper records its use of each device as USE job events
(:mod:`wattline.jobs.wrappers.usage`). Here they become :class:`~.attribution.UseTimeline` per device for
:func:`~.attribution.split_shared`, and a job's charge per device becomes one
:class:`DeviceShare`: "62 % of GPU-… (measured share)" or "whole device (claimed)".
A share by use (basis "measured share", a name the report JSON keeps) is derived from
utilization (the job's processes' part of the device's use), not a measurement of the job's
own energy, and is labelled so.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from wattline.accounting.attribution import Attribution, ChannelEnergy
from wattline.accounting.use_split import UseInterval, UseTimeline
from wattline.accounting.window_energy import window_energy
from wattline.stores.reader import StoredJobEvent

#: How a job's part of a device was decided.
BY_USE, CLAIMED, MIG = "measured share", "claimed", "MIG instance share"


def use_timelines(events: Iterable[StoredJobEvent], host: str) -> dict[str, UseTimeline]:
    """Device claim key -> the use intervals of the USE events of ``host`` (bad ones skipped)."""
    per_device: dict[str, list[UseInterval]] = defaultdict(list)
    for e in events:
        if e.event != "use" or e.host != host:
            continue
        f = e.fields
        try:
            period, job, dev = int(f["period_ns"]), float(f["job_use"]), float(f["device_use"])
        except (KeyError, TypeError, ValueError):
            continue
        if period > 0 and all(math.isfinite(v) and v >= 0 for v in (job, dev)) and f.get("device"):
            metric, steady = str(f.get("metric", "")), _is_one(f.get("steady"))
            per_device[str(f["device"])].append(UseInterval(e.time_ns - period, e.time_ns, job, dev, metric, steady))
    return {key: UseTimeline(_disjoint(iv)) for key, iv in per_device.items()}


def _is_one(value: object) -> bool:
    """A stored flag (1, 1.0 or "1" as the stores give it back); absent or anything else: False."""
    try:
        return float(value) == 1.0  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def use_scope(events: Iterable[StoredJobEvent], host: str) -> frozenset[str]:
    """The devices whose per-process use the job's wrapper on ``host`` could read (its close)."""
    return frozenset(
        d
        for e in events
        if e.event == "close" and e.host == host
        for d in str(e.fields.get("use_scope", "")).split(",")
        if d
    )


def _disjoint(intervals: list[UseInterval]) -> list[UseInterval]:
    """Sorted by end, each starting no earlier than the previous end (several processes of
    one job may each send use; the later overlapping part is dropped, never counted twice)."""
    out: list[UseInterval] = []
    for u in sorted(intervals, key=lambda u: u.end_ns):
        start = max(u.start_ns, out[-1].end_ns) if out else u.start_ns
        if start < u.end_ns:
            out.append(replace(u, start_ns=start))
    return out


@dataclass(frozen=True, slots=True)
class DeviceShare:
    """A job's charge for one accelerator on one host (JSON: ``device_shares[]``)."""

    host: str
    component: str
    device: str
    basis: str  #: "measured share" | "MIG instance share" (a rule by instance size) | "claimed"
    energy_j: float  #: charged to the job (warm-up and saturated windows)
    split_by_use_j: float  #: of which handed out by use (derived from utilization, not measured)
    device_energy_j: float  #: the device's energy over the job's window on this host
    fraction: float  #: energy_j / device_energy_j (0 when the device drew nothing)
    #: The device's energy from the first start to the last end of the jobs the report split
    #: with this one (all that overlapped it on the host, whatever devices they used; this
    #: job's window when none did), and the part of it no job was charged (other processes'
    #: use, or no job on the device): span = the sum of every job's charge + unattributed.
    span_energy_j: float = 0.0
    unattributed_j: float = 0.0
    #: How far the split by use may be off, J (the bound's ``split`` term for this device).
    split_bound_j: float = 0.0

    def note(self) -> str:
        """One line for the report's notes."""
        name = f"{self.host}: {self.component} {self.device}"
        if self.basis == CLAIMED:
            return f"{name}: whole device (claimed), {self.energy_j:.1f} J"
        if self.basis == MIG:
            return (
                f"{name}: {100 * self.fraction:.0f} % of its {self.device_energy_j:.1f} J while the job ran (its MIG "
                "instance's share of the GPU by memory size: a rule, not a measurement; the GPU counted once)"
            )
        rest = self.energy_j - self.split_by_use_j
        extra = f", {rest:.1f} J of it by the share rule while the device was idle" if rest > 1e-9 else ""
        if self.split_bound_j > 0:
            extra += f"; ± {self.split_bound_j:.1f} J where processes started or ended between two reads of their use"
        return (
            f"{name}: {100 * self.fraction:.0f} % of its {self.device_energy_j:.1f} J while the job ran "
            f"(measured share{extra}; derived from utilization, not a measurement of the job's energy)"
        )


def device_shares(
    attribution: Attribution,
    job_keys: Sequence[str],
    channels: Sequence[ChannelEnergy],
    window: tuple[int, int],
    uses: Mapping[str, UseTimeline],
    span: tuple[int, int],
) -> list[DeviceShare]:
    """The job's charge (its windows ``job_keys``, its ``uses``) for each accelerator channel it
    got energy of. ``span``: from the first start to the last end of the jobs ``attribution``
    split (``window`` when none shared the host); the samples reach past it, and what lies
    outside is no job's."""
    lo, hi = span
    out = []
    for ch in channels:
        if not ch.claim_keys:
            continue
        of_device = [
            s for s in attribution.shares if (s.host, s.component, s.device) == (ch.host, ch.component, ch.device)
        ]
        mine = [s for s in of_device if s.job_id in job_keys]
        energy = math.fsum(s.energy_j for s in mine)
        if energy <= 0:
            continue
        by_use = math.fsum(s.split_by_use_j for s in mine)
        split_bound = math.fsum(s.split_bound_j for s in mine)
        device = window_energy(ch.intervals, *window)
        metrics = {u.metric for k in ch.claim_keys & uses.keys() for u in uses[k].intervals}
        basis = (MIG if metrics == {"mig-memory"} else BY_USE) if by_use > 0 else CLAIMED
        fraction = energy / device if device > 0 else 0.0
        # The samples straddling the span's ends reach past it; that part, where none of the
        # jobs ran, is all unattributed and is no part of the span.
        outside = math.fsum(iv.energy_j for iv in ch.intervals) - window_energy(ch.intervals, lo, hi)
        total = math.fsum(s.energy_j for s in of_device) - outside
        rest = math.fsum(s.energy_j for s in of_device if s.job_id is None) - outside
        where = (ch.host, ch.component, ch.device)
        out.append(DeviceShare(*where, basis, energy, by_use, device, fraction, total, rest, split_bound))
    return out
