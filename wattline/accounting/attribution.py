"""Which joules belong to which job: host sharing and idle (a window's energy from samples is
in :mod:`.window_energy`, coverage by quality in :mod:`.coverage`; their names stay
importable from here).

Pure arithmetic on samples already read from a store. Conventions:

* A sample is an interval ``(start_ns, end_ns]`` with ``energy_j`` drawn at uniform
  power inside it (:mod:`.window_energy`).
* Job windows are ``[start_ns, end_ns)`` on one host (a multi-host job has one
  :class:`JobWindow` per host).

Sharing a host between concurrent jobs (:func:`split_shared`): each sample is cut
at every job start and end inside it, so the set of active jobs is constant on each
piece; each piece then goes

* for an **accelerator channel** (one with claim keys, :attr:`ChannelEnergy.keys`):
  in full to the active jobs that claim it (a device claimed by several active jobs,
  e.g. NeuronCores of one Neuron device, is split by the number of its keys each
  claims); unclaimed: unattributed;
* for a **host-wide channel** (cpu, dram, nic, psys...), by :class:`ShareRule`:
  ``"equal"`` among the active jobs; ``"device-share"`` in proportion to the number
  of devices each active job claims on the host, with the jobs that claim none
  sharing ``deviceless_fraction`` of it equally (all of it when no active job claims a
  device, none when every active job does); ``"exclusive"`` all to the one active
  job, unattributed when several are active; ``"cpu-time"`` by each job's measured CPU
  time (its USE intervals of :data:`CPU_TIME_KEYS`: the job's and every process's CPU time
  over the piece, as for a device's recorded use below; the rest, other processes',
  unattributed: each period's CPU time is a count, so a job gets its period's ratio,
  :meth:`.use_split.UseSplit.by_ratio`); where an active job's CPU time was not read, its part
  is estimated (at its nearest period's ratio, else an equal part of what the others left,
  all of it where none was read) and :attr:`Share.estimated_j` and
  :attr:`Share.estimate_bound_j` say how much and how far it may be off; where its processes
  appeared or went inside a period (its edges), :attr:`Share.split_bound_j` says how far its
  ratio there may be off (:func:`.use_split.mark_edges`); no active job: unattributed.

* for an accelerator channel with **recorded use** (:class:`UseInterval`, a job's
  processes' share of the device read by its holder: NVML per-process utilization,
  neuron-monitor per-runtime NeuronCore use), cut also at every use interval's edges:
  where an active job's use interval covers the piece, the jobs' use rates and the other
  processes' estimated one split it (:mod:`.use_split`: a job alone on a device gets its
  period's ``job_use / device_use``; overlapping jobs' periods are combined by rate, not
  by ratio), and the other processes' part is unattributed (all of it when only they
  used the device); where the device was idle (no use) while jobs were on it, the piece
  goes by the :class:`ShareRule` among those jobs (``device-share`` as ``equal``: each
  holds this one device); where no use interval covers it, by the claims as above. A
  share by use is derived from utilization, not a measurement of the job's own energy:
  :attr:`Share.split_by_use_j` keeps that part apart so reports can label it, and
  :attr:`Share.split_bound_j` says how far it may be off (:meth:`.use_split.UseSplit.bounds`).

Every piece is handed out in full (the last share is the remainder), so for each
host ``node energy == sum over jobs + unattributed`` to float rounding, and no
joule goes to two jobs. Which channels make up "node energy" is the caller's
choice: do not pass both a RAPL package and its core/uncore sub-domains.

Idle (:class:`IdlePolicy`): a channel's idle baseline in watts makes each sample's
idle part ``min(energy_j, baseline_w x length)`` and its dynamic part the rest
(never below 0); both are split with the same fractions, so the dynamic and the idle
parts are each conserved, and reports can show both totals.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from wattline import wire
from wattline.accounting.use_split import Piece, UseInterval, UseSplit, UseTimeline
from wattline.accounting.window_energy import (
    Interval,
)
from wattline.quality import Quality
from wattline.share_rules import SHARE_RULES, ShareKind
from wattline.units import NS_PER_S

__all__ = [
    "ACCELERATOR_COMPONENTS",
    "Attribution",
    "ChannelEnergy",
    "IdleMode",
    "IdlePolicy",
    "JobWindow",
    "Share",
    "ShareKind",
    "ShareRule",
    "UseInterval",
    "UseTimeline",
    "split_shared",
]

IdleMode = Literal["none", "subtract"]
#: An interval of a channel: (host, component, device, quality, start_ns, end_ns).
IntervalKey = tuple[str, str, str, Quality, int, int]

#: Components that are devices a job claims ("gpu:<device>", "accelerator:<device>").
ACCELERATOR_COMPONENTS = frozenset({"gpu", "accelerator"})
#: The use key of a job's CPU time against the host's (the pod watcher's USE events).
CPU_TIME_KEYS = frozenset({"cpu:host"})


# --------------------------------------------------------------------------- sharing


@dataclass(frozen=True, slots=True)
class JobWindow:
    """A job on one host: its window, the devices it claims ("gpu:0", "neuroncore:3") and
    its recorded use of devices (device claim key -> use intervals, sorted, disjoint)."""

    job_id: str
    host: str
    start_ns: int
    end_ns: int
    devices: frozenset[str] = frozenset()
    uses: Mapping[str, UseTimeline] = field(default_factory=dict)

    def use_at(self, keys: frozenset[str], a: int, b: int) -> UseInterval | None:
        """The use interval of one of ``keys`` covering the piece ``(a, b]``, if any."""
        for key in keys & self.uses.keys():
            if (u := self.uses[key].at(a, b)) is not None:
                return u
        return None

    def __post_init__(self) -> None:
        if self.end_ns < self.start_ns:
            raise ValueError(f"job {self.job_id} ends before it starts")


@dataclass(frozen=True, slots=True)
class ChannelEnergy:
    """The samples of one channel (component + device) of one host.

    ``keys`` are the device claims that map to this channel; empty means the
    default: ``{"<component>:<device>"}`` for accelerator components, none (a
    host-wide channel) otherwise. A Neuron device lists its cores
    (``{"neuroncore:0", "neuroncore:1"}``), a GPU its index and UUID claims.
    """

    host: str
    component: str
    device: str
    quality: Quality
    intervals: Sequence[Interval]
    keys: frozenset[str] = frozenset()
    #: What ``keys`` had to assume (said in a report when a claim matched them); "" when nothing.
    assumed: str = ""

    @property
    def claim_keys(self) -> frozenset[str]:
        """Claims that charge this channel to a job; empty for host-wide channels."""
        if self.keys:
            return self.keys
        if self.component in ACCELERATOR_COMPONENTS:
            return frozenset({wire.claim_key(self.component, self.device)})
        return frozenset()


@dataclass(frozen=True, slots=True)
class ShareRule:
    """How host-wide energy is split among concurrent jobs (see the module doc)."""

    kind: ShareKind = "equal"
    deviceless_fraction: float = 0.1  #: device-share: part of the energy for jobs without devices

    def __post_init__(self) -> None:
        if self.kind not in SHARE_RULES:
            raise ValueError(f"unknown share rule {self.kind!r}")
        if not 0 <= self.deviceless_fraction <= 1:
            raise ValueError("deviceless_fraction must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """``"none"``: jobs are charged total energy; ``"subtract"``: only energy above idle.

    ``baseline_w`` maps ``(host, component, device)`` to the channel's idle power;
    channels not listed idle at 0 W. The split always computes both parts.
    """

    mode: IdleMode = "none"
    baseline_w: Mapping[tuple[str, str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in ("none", "subtract"):
            raise ValueError(f"unknown idle policy {self.mode!r}")
        if any(w < 0 for w in self.baseline_w.values()):
            raise ValueError("idle baselines must be >= 0 W")

    def idle_w(self, host: str, component: str, device: str) -> float:
        """Idle baseline of one channel, watts."""
        return self.baseline_w.get((host, component, device), 0.0)


@dataclass(frozen=True, slots=True)
class Share:
    """Energy of one channel given to one job (``job_id`` None: unattributed)."""

    job_id: str | None
    host: str
    component: str
    device: str
    quality: Quality
    energy_j: float  #: total
    dynamic_j: float  #: above the idle baseline; energy_j - dynamic_j is the idle part
    #: The part of energy_j handed out by use (derived from utilization, not measured).
    split_by_use_j: float = 0.0
    #: How far that split may be off, J (:meth:`.use_split.UseSplit.bounds`).
    split_bound_j: float = 0.0
    #: Of energy_j, the part estimated where the job's use was not read (a host-wide channel
    #: split by CPU time: :meth:`.use_split.UseSplit.by_ratio`), and how far it may be off, J.
    estimated_j: float = 0.0
    estimate_bound_j: float = 0.0
    #: How far it may be off where the split took one fraction for several of the job's periods
    #: (a long job's, :func:`.use_split.coarsen`), J.
    coarse_bound_j: float = 0.0
    #: Its part of what the channel's stretches without a good sample could have held, J.
    gaps_bound_j: float = 0.0

    @property
    def idle_j(self) -> float:
        """The idle part of energy_j."""
        return self.energy_j - self.dynamic_j


@dataclass(frozen=True, slots=True)
class Attribution:
    """Result of :func:`split_shared`: one :class:`Share` per (job or None, channel)."""

    shares: tuple[Share, ...]
    idle: IdlePolicy

    def charged_j(self, share: Share) -> float:
        """What the idle policy charges for a share: total, or dynamic only."""
        return share.dynamic_j if self.idle.mode == "subtract" else share.energy_j

    def job_total_j(self, job_id: str, *, host: str | None = None) -> float:
        """Energy charged to a job (total or dynamic per the idle policy), all hosts or one."""
        return math.fsum(
            self.charged_j(s) for s in self.shares if s.job_id == job_id and (host is None or s.host == host)
        )

    def by_job(self, host: str | None = None) -> dict[str, float]:
        """Charged energy per job id, all hosts or one."""
        out: dict[str, list[float]] = defaultdict(list)
        for s in self.shares:
            if s.job_id is not None and (host is None or s.host == host):
                out[s.job_id].append(self.charged_j(s))
        return {k: math.fsum(v) for k, v in out.items()}

    def unattributed_j(self, host: str | None = None) -> float:
        """Energy of no job (total or dynamic per the idle policy), one host or all."""
        return math.fsum(
            self.charged_j(s) for s in self.shares if s.job_id is None and (host is None or s.host == host)
        )

    def excluded_idle_j(self, host: str | None = None) -> float:
        """Idle energy left out of every charge: the idle part under "subtract", else 0.

        ``node_total_j == sum(by_job) + unattributed_j + excluded_idle_j`` per host.
        """
        return self.node_idle_j(host) if self.idle.mode == "subtract" else 0.0

    def node_total_j(self, host: str | None = None) -> float:
        """All energy of the channels passed in, one host or all."""
        return math.fsum(s.energy_j for s in self.shares if host is None or s.host == host)

    def node_idle_j(self, host: str | None = None) -> float:
        """The idle part of all energy, one host or all."""
        return math.fsum(s.idle_j for s in self.shares if host is None or s.host == host)

    def job_by_quality(self, job_id: str) -> dict[Quality, float]:
        """Charged energy of a job per quality (input of :func:`coverage`)."""
        out: dict[Quality, list[float]] = defaultdict(list)
        for s in self.shares:
            if s.job_id == job_id:
                out[s.quality].append(self.charged_j(s))
        return {q: math.fsum(v) for q, v in out.items()}


def _active(jobs: Sequence[JobWindow], a: int, b: int) -> list[JobWindow]:
    """Jobs covering the piece (a, b]; for a point (a == b) jobs with start < b <= end."""
    if a == b:
        return [j for j in jobs if j.start_ns < b <= j.end_ns]
    return [j for j in jobs if j.start_ns <= a and b <= j.end_ns]


def _weights(channel_keys: frozenset[str], active: Sequence[JobWindow], rule: ShareRule) -> list[tuple[str, float]]:
    """(job_id, weight) of the jobs that get part of a piece; empty: unattributed."""
    if channel_keys:
        return [(j.job_id, float(n)) for j in active if (n := len(channel_keys & j.devices))]
    if not active:
        return []
    if rule.kind == "exclusive":
        return [(active[0].job_id, 1.0)] if len(active) == 1 else []
    if rule.kind in ("equal", "cpu-time"):
        return [(j.job_id, 1.0) for j in active]
    with_dev = [j for j in active if j.devices]
    without = [j for j in active if not j.devices]
    if not with_dev or not without:
        return [(j.job_id, float(len(j.devices)) if with_dev else 1.0) for j in active]
    total_dev = sum(len(j.devices) for j in with_dev)
    rest = 1.0 - rule.deviceless_fraction
    return [(j.job_id, rest * len(j.devices) / total_dev) for j in with_dev] + [
        (j.job_id, rule.deviceless_fraction / len(without)) for j in without
    ]


def _hand_out(amount: float, weights: Sequence[tuple[str | None, float]]) -> list[tuple[str | None, float]]:
    """Split ``amount`` by weights; the last share is the remainder, so the parts sum exactly."""
    weights = [(k, w) for k, w in weights if w > 0]
    if not weights:
        return [(None, amount)]
    total = math.fsum(w for _, w in weights)
    out: list[tuple[str | None, float]] = []
    given = 0.0
    for k, w in weights[:-1]:
        part = amount * w / total
        out.append((k, part))
        given += part
    out.append((weights[-1][0], amount - given))
    return out


def _parts(weights: Sequence[tuple[str | None, float]]) -> dict[str, float]:
    """Each job window's part of a piece, 0..1, from its weights."""
    total = math.fsum(w for _, w in weights if w > 0)
    return {k: w / total for k, w in weights if k is not None and w > 0} if total > 0 else {}


def split_shared(
    channels: Sequence[ChannelEnergy],
    jobs: Sequence[JobWindow],
    rule: ShareRule | ShareKind = "equal",
    *,
    idle: IdlePolicy | None = None,
    detail: dict[IntervalKey, dict[str | None, float]] | None = None,
) -> Attribution:
    """Charge each channel's energy to the jobs active on its host (see the module doc).

    ``rule`` is a :class:`ShareRule` or its kind. Conservation per host:
    ``node_total_j == sum of all shares`` (jobs and unattributed), for the total and,
    with the idle part added, for the dynamic energy. ``detail``, when given, receives each
    interval's parts: its :data:`IntervalKey` -> job (None: unattributed) -> J.
    """
    share_rule = ShareRule(rule) if isinstance(rule, str) else rule
    policy = idle or IdlePolicy()
    by_host: dict[str, list[JobWindow]] = defaultdict(list)
    for j in jobs:
        by_host[j.host].append(j)
    shares: list[Share] = []
    for ch in channels:
        host_jobs = by_host.get(ch.host, [])
        keys = ch.claim_keys
        use_keys = keys or (CPU_TIME_KEYS if share_rule.kind == "cpu-time" else keys)
        idle_w = policy.idle_w(ch.host, ch.component, ch.device)
        by_use_split = UseSplit(host_jobs, use_keys, rates=bool(keys)) if use_keys else None
        energy: dict[str | None, list[float]] = defaultdict(list)
        dynamic: dict[str | None, list[float]] = defaultdict(list)
        by_use_parts: dict[str | None, list[float]] = defaultdict(list)
        estimated: dict[str | None, list[float]] = defaultdict(list)
        estimate_off: dict[str | None, list[float]] = defaultdict(list)
        coarse_off: dict[str | None, list[float]] = defaultdict(list)
        gaps: dict[str | None, list[float]] = defaultdict(list)
        split_pieces: list[Piece] = []
        edges = sorted(
            {t for j in host_jobs for t in (j.start_ns, j.end_ns)}
            | {
                t
                for j in host_jobs
                for k in use_keys & j.uses.keys()
                for u in j.uses[k].intervals
                for t in (u.start_ns, u.end_ns)
            }
        )
        series = (ch.host, ch.component, ch.device, ch.quality)
        for iv in ch.intervals:
            length = iv.end_ns - iv.start_ns
            idle_part = min(iv.energy_j, idle_w * length / NS_PER_S)
            dyn = iv.energy_j - idle_part
            inner = edges[bisect.bisect_right(edges, iv.start_ns) : bisect.bisect_left(edges, iv.end_ns)]
            cuts = [iv.start_ns, *inner, iv.end_ns]
            pieces = [(iv.start_ns, iv.end_ns)] if length == 0 else list(itertools.pairwise(cuts))
            left_e, left_d = iv.energy_j, dyn
            for n, (a, b) in enumerate(pieces):
                if n == len(pieces) - 1:
                    pe, pd = left_e, left_d
                else:
                    frac = (b - a) / length
                    pe, pd = iv.energy_j * frac, dyn * frac
                    left_e -= pe
                    left_d -= pd
                active = _active(host_jobs, a, b)
                off: Mapping[str, float] = {}
                if by_use_split is None:
                    by_use = None
                elif keys:
                    by_use = by_use_split.weights(active, a, b, share_rule.kind == "exclusive")
                else:  # a host-wide channel by CPU time: where a job's was not read, estimated
                    by_use, off = by_use_split.by_ratio(active, a, b) if active else (None, {})
                w: Sequence[tuple[str | None, float]] = (
                    by_use if by_use is not None else _weights(keys, active, share_rule)
                )
                for k, part in _hand_out(pe, w):
                    energy[k].append(part)
                    if detail is not None:
                        kept = detail.setdefault((*series, iv.start_ns, iv.end_ns), {})
                        kept[k] = kept.get(k, 0.0) + part
                    if by_use is not None:
                        by_use_parts[k].append(part)
                    if k is not None and k in off:
                        estimated[k].append(part)
                        estimate_off[k].append(pe * off[k])
                    if by_use_split is not None and k in by_use_split.coarse:
                        coarse_off[k].append(pe * by_use_split.coarse[k])
                for k, part in _hand_out(pd, w):
                    dynamic[k].append(part)
                for k, part in _hand_out(iv.gap_j * ((b - a) / length if length else 1.0), w) if iv.gap_j else ():
                    gaps[k].append(part)
                if by_use_split is not None:
                    # no job's use there: nothing to say of any job's weight beside an unsteady period
                    opened = frozenset(j.job_id for j in active) if by_use is not None else frozenset()
                    split_pieces.append((a, b, pe, _parts(w) if by_use is not None else {}, opened))
        # an accelerator's split by its processes' use, where they changed inside a period; a
        # host's split by CPU time, where a job's processes appeared or went inside one (its edges)
        split_bounds = by_use_split.bounds(split_pieces) if by_use_split is not None else {}
        for k in sorted(energy, key=lambda x: (x is None, x or "")):
            total, dyn_total = math.fsum(energy[k]), math.fsum(dynamic[k])
            by_use_j, bound_j = math.fsum(by_use_parts[k]), split_bounds.get(k, 0.0) if k is not None else 0.0
            guessed = (
                math.fsum(estimated[k]),
                math.fsum(estimate_off[k]),
                math.fsum(coarse_off[k]),
                math.fsum(gaps[k]),
            )
            shares.append(
                Share(k, ch.host, ch.component, ch.device, ch.quality, total, dyn_total, by_use_j, bound_j, *guessed)
            )
    return Attribution(tuple(shares), policy)
