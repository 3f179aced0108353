"""A job's report, one host at a time: the host's channels read (at the window's edges, or
every sample where the host was shared or its energy is split by use), split between the
job's two windows and the other jobs that ran there (:func:`host_attribution`), and added
to the report's windows (:func:`accumulate`); and each sample's part of the job, for
``wattline export`` (:func:`sample_parts`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from wattline.accounting.attribution import (
    CPU_TIME_KEYS,
    Attribution,
    ChannelEnergy,
    IdlePolicy,
    IntervalKey,
    JobWindow,
    ShareRule,
    split_shared,
)
from wattline.accounting.device_shares import DeviceShare, device_shares, use_scope, use_timelines
from wattline.accounting.uncertainty import Bound
from wattline.accounting.use_split import UseTimeline, coarsen
from wattline.jobs.jobs_view import JobView, views_of
from wattline.reports.channels import Bounds, channels_from_edges, channels_from_samples
from wattline.reports.host_split import host_split_notes
from wattline.reports.idle import idle_baselines
from wattline.reports.model import Report, ReportSettings
from wattline.reports.windows import ComponentEnergy, WindowEnergy
from wattline.stores.reader import Reader, StoredJobEvent


def concurrent_jobs(reader: Reader, job: JobView, end_ns: int) -> list[JobView]:
    """The other jobs that may have shared the job's hosts during its window (the overlap per
    host, lease included, is checked in :func:`host_attribution`), from the events near the
    window and each unclosed job's last heard time only: the cost does not grow with the rest
    of the store."""
    if not job.hosts:
        return []
    events = reader.job_events_between(job.start_ns, end_ns, sorted(job.hosts))
    return [v for v in views_of(events) if v.job_id != job.job_id]


#: Most shares a job's CPU time is taken at where it ran alone (more periods are merged):
#: its report reads the counters at their edges, so its cost does not grow with its length.
MAX_SHARES = 360
#: The components a complete measurement of a host has, for coverage's "missing" list.
EXPECTED = {"cpu": ("cpu_package", "cpu"), "memory": ("dram",), "network": ("nic",)}


def host_attribution(
    reader: Reader,
    job_and_events: tuple[JobView, Sequence[StoredJobEvent]],
    host: str,
    edges: tuple[int, int, int],
    others: Sequence[JobView],
    settings: ReportSettings,
    at: tuple[int, int],
    bounds: Bounds,
    detail: dict[IntervalKey, dict[str | None, float]] | None = None,
) -> tuple[Attribution, set[str], list[str], list[DeviceShare]]:
    """Split one host's energy over [open, close) (``edges``: open, split, close) between this
    job's two windows and others. Another job's window ends at its close, at its last heard
    time once abandoned at ``now_ns`` (it shares nothing after that), or at ``end_ns``
    (``at``: both). Accelerators the jobs recorded their use of are split by it
    (:mod:`wattline.accounting.device_shares`). Each channel's bound in the job's two
    windows goes to ``bounds``; with ``detail``, the samples are read and each one's parts
    go there (:func:`~wattline.accounting.attribution.split_shared`)."""
    job, events = job_and_events
    now_ns, end_ns = at
    open_ns, split_ns, close_ns = edges
    keys = (f"{job.job_id}#warmup", f"{job.job_id}#saturated")
    notes: list[str] = []
    uses = use_timelines(events, host)
    windows_of = ((v, v.hosts[host].open_ns, v.hosts[host].end_ns(now_ns, end_ns)) for v in others if host in v.hosts)
    concurrent = [
        JobWindow(v.job_id, host, start, end, frozenset(v.hosts[host].devices))
        for v, start, end in windows_of
        if start < close_ns and end > open_ns
    ]
    other_events = {w.job_id: reader.job_events(w.job_id, every=False) for w in concurrent}
    other_uses = {k: use_timelines(v, host) for k, v in other_events.items()}
    lo = min([open_ns] + [w.start_ns for w in concurrent])
    hi = max([close_ns] + [w.end_ns for w in concurrent])
    if settings.window is not None and detail is None:
        # a window's figures need its own samples only (the others' beyond it change only theirs):
        # a service's stretch beside a job that runs all day reads the stretch, not the day
        lo, hi = open_ns, close_ns
    cpu_key = next(iter(sorted(CPU_TIME_KEYS & uses.keys())), None) if settings.share_rule == "cpu-time" else None
    alone = not concurrent and not device_uses(uses)
    if alone and cpu_key is not None:  # a long job's CPU time at a few hundred shares at most
        uses = {**uses, cpu_key: coarsen(uses[cpu_key], MAX_SHARES)}
    if concurrent or device_uses(uses) or detail is not None:
        # the samples themselves where the host was shared or a device is split by use; with each
        # series' last sample before (one that stopped before the window is a gap there) and first
        # sample after (the stream's counter on both sides bridges a stretch the store lacks there)
        (before, _), (_, after) = reader.around(host, (lo, hi))
        read = [*before, *reader.samples(host, lo, hi), *(s for s in after if s.start_ns >= hi)]
        channels = channels_from_samples(read, host, settings, notes, (keys, edges, bounds))
    elif cpu_key is not None:  # alone, split by its CPU time: the counters at its periods' edges
        periods = uses[cpu_key].intervals
        cuts = sorted({*edges, *(t for u in periods for t in (u.start_ns, u.end_ns) if open_ns < t < close_ns)})
        channels = channels_from_edges(reader, host, tuple(cuts), settings, [], (("",) * len(cuts), {}))
        # the job's two windows' bounds, and where their gaps lie
        gaps = {
            (c.component, c.device, c.quality): [iv for iv in c.intervals if iv.gap_j]
            for c in channels_from_edges(reader, host, edges, settings, notes, (keys, bounds))
        }
        channels = [
            replace(
                c,
                intervals=[
                    *(iv for iv in c.intervals if not iv.gap_j),
                    *gaps.get((c.component, c.device, c.quality), []),
                ],
            )
            for c in channels
        ]
    else:  # alone, the host-wide energy by a rule: the counters at its windows' edges
        channels = channels_from_edges(reader, host, edges, settings, notes, (keys, bounds))
    every_device = frozenset().union(*(c.claim_keys for c in channels))

    def claims(given: Iterable[str], used: object, scope: frozenset[str]) -> frozenset[str]:
        """Claimed devices; without claims, every device but those whose per-process use the
        job's wrapper read (``scope``: it is charged those by its recorded use), or none but
        by recorded use when it recorded some and its scope is not known yet (running)."""
        if given:
            return frozenset(given)
        if scope:
            return every_device - scope
        return frozenset() if used else every_device

    devices = claims(job.hosts[host].devices, device_uses(uses), use_scope(events, host))
    windows = [
        JobWindow(f"{job.job_id}#warmup", host, open_ns, split_ns, devices, uses),
        JobWindow(f"{job.job_id}#saturated", host, split_ns, close_ns, devices, uses),
        *(
            JobWindow(
                w.job_id,
                host,
                w.start_ns,
                w.end_ns,
                claims(w.devices, device_uses(other_uses[w.job_id]), use_scope(other_events[w.job_id], host)),
                other_uses[w.job_id],
            )
            for w in concurrent
        ),
    ]
    idle = IdlePolicy(settings.idle, idle_baselines(reader, host, open_ns, channels, settings, notes))  # type: ignore[arg-type]
    rule = ShareRule(settings.share_rule, settings.deviceless_fraction)  # type: ignore[arg-type]
    missing = {name for name, comps in EXPECTED.items() if not any(c.component in comps for c in channels)}
    if not channels:
        notes.append(f"{host}: no energy samples in the job's window (is an agent running there?)")
    attribution = split_shared(channels, windows, rule, idle=idle, detail=detail)
    notes += host_split_notes(attribution, keys, channels, (open_ns, close_ns), rule.kind, len(concurrent))
    shares = device_shares(attribution, keys, channels, (open_ns, close_ns), uses, (lo, hi))
    notes += [s.note() for s in shares if s.basis != "claimed" or job.hosts[host].devices]
    claimed = frozenset().union(*(w.devices for w in windows))
    notes += sorted({c.assumed for c in channels if c.assumed and c.claim_keys & claimed})
    notes += unmatched_claims(host, job.hosts[host].devices, channels)
    return attribution, missing, notes, shares


def unmatched_claims(host: str, given: Iterable[str], channels: Iterable[ChannelEnergy]) -> list[str]:
    """The note for the job's claims that name no device measured on ``host``: nothing is charged
    for them, so its figure lacks their energy (a GPU is matched by its UUID; a claim by index,
    left by a holder that could not map it, matches none)."""
    channels = list(channels)
    if not channels:
        return []  # the host's "no energy samples" note says it already
    known = frozenset().union(*(c.claim_keys for c in channels))
    unmatched = sorted(set(given) - known)
    if not unmatched:
        return []
    return [
        f"{host}: the job claims {', '.join(unmatched)}, which match no device measured there: "
        "nothing is charged for them (a GPU is claimed by its UUID)"
    ]


def device_uses(timelines: Mapping[str, UseTimeline]) -> bool:
    """Whether a job recorded its use of a device (its CPU time is no device's)."""
    return any(key not in CPU_TIME_KEYS for key in timelines)


def accumulate(window: WindowEnergy, attribution: Attribution, job_key: str, host: str, bounds: Bounds) -> None:
    """Add the job window ``job_key``'s shares on ``host`` and their bounds to ``window``."""
    shared = {(s.component, s.device, s.quality.value) for s in attribution.shares if s.job_id == job_key}
    for (key, component, device, quality), (bound, _) in bounds.items():
        # no sample of the channel in the window: what it could have held there (a gap)
        if key == job_key and (component, device, quality) not in shared and bound.total_j > 0:
            window.components.setdefault(component, ComponentEnergy(component)).bound += bound
    for share in attribution.shares:
        if share.job_id != job_key or share.host != host:
            continue
        comp = window.components.setdefault(share.component, ComponentEnergy(share.component))
        bound, channel_j = bounds.get((job_key, share.component, share.device, share.quality.value), (Bound(), 0.0))
        # its part of the gaps where they lie (it may have run alone there), the rest by its share
        scaled = bound.scaled(min(share.energy_j / channel_j, 1.0) if channel_j > 0 else 1.0)
        comp.bound += replace(scaled, gaps_j=share.gaps_bound_j)
        comp.bound += Bound(split_j=share.split_bound_j, unread_j=share.estimate_bound_j, coarse_j=share.coarse_bound_j)
        comp.estimated_j += share.estimated_j
        comp.energy_j += share.energy_j
        comp.dynamic_j += share.dynamic_j
        comp.split_by_use_j += share.split_by_use_j
        comp.by_quality[share.quality.value] = comp.by_quality.get(share.quality.value, 0.0) + share.energy_j
        window.hosts[host] = window.hosts.get(host, 0.0) + share.energy_j


def sample_parts(reader: Reader, report: Report) -> dict[IntervalKey, dict[str, float]]:
    """What ``report`` charged its job for each sample of its hosts, J, by window (``warmup``,
    ``saturated``): the hosts split again as the report split them, sample by sample. A
    sample another stream's counted (streams overlapping in time) has none."""
    job = report.job
    events = reader.job_events(job.job_id, every=False)
    others = concurrent_jobs(reader, job, report.end_ns)
    windows = {f"{job.job_id}#warmup": "warmup", f"{job.job_id}#saturated": "saturated"}
    out: dict[IntervalKey, dict[str, float]] = {}
    for host, window in sorted(job.hosts.items()):
        close = window.end_ns(report.end_ns, report.end_ns)
        split = min(max(report.saturated_from_ns, window.open_ns), close)
        detail: dict[IntervalKey, dict[str | None, float]] = {}
        edges = (window.open_ns, split, close)
        host_attribution(reader, (job, events), host, edges, others, report.settings, (report.end_ns,) * 2, {}, detail)
        for key, parts in detail.items():
            out[key] = {name: parts.get(window_id, 0.0) for window_id, name in windows.items()}
    return out
