"""A job's report: saturation, energy of every host and component, per-unit figures.

Steps (each documented where it lives):

1. The job is rebuilt from its stored events (:mod:`.jobs_view`).
2. Saturation is detected from the units timeline, the workload's own mark or
   ``--saturated-after`` (:mod:`.saturation`); without units, from accelerator
   utilization.
3. Per host, each channel's energy in the warm-up ``[open, saturation)`` and the
   measured window ``[saturation, close)`` is the difference of its cumulative counter
   at the window edges (O(1) in the job's length); when the edges lie in several agent
   streams (a restart, or streams overlapping in time: counted once, :mod:`.streams`), or
   when other jobs shared the host, the samples themselves are split (:mod:`.attribution`).
   Each channel's energy in each window carries its error bound, from the same samples
   (:mod:`.window_bounds`, terms in :mod:`.uncertainty`).
4. Figures per unit, cost and CO2 come from :mod:`.economics`.
5. Completeness: a host window is complete when every series the host reported during
   the job has samples from before its open to after its close. An agent ships samples every
   batch interval, so a report built right at job end may lack the last seconds;
   :func:`build_complete_report` waits (bounded) for them, and a report that still lacks
   them says so ("incomplete: samples up to ..."), never a quiet shortfall.

Component totals never add RAPL sub-domains to their parent: ``cpu_core`` and
``cpu_uncore`` are inside ``cpu_package``, and ``psys`` (the whole platform) overlaps
everything, so those three are left out of the host's energy.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from wattline.collector.lineprotocol import clip
from wattline.collector.stores.reader import Reader, StoredJobEvent, StoredSample, UnitCuts
from wattline.quality import Quality
from wattline.workloads import economics, window_bounds
from wattline.workloads.attribution import (
    ACCELERATOR_COMPONENTS,
    Attribution,
    ChannelEnergy,
    EdgeSample,
    IdlePolicy,
    Interval,
    JobWindow,
    ShareRule,
    coverage,
    cumulative_window_energy,
    split_shared,
    window_energy,
)
from wattline.workloads.device_shares import DeviceShare, device_shares, use_scope, use_timelines
from wattline.workloads.jobs_view import JobView, inspect_view, utc_iso, view_at, views_of
from wattline.workloads.saturation import Saturation, SaturationParams, detect_saturation, grid_bins
from wattline.workloads.streams import StreamMerge, StreamSample, merge_streams
from wattline.workloads.uncertainty import Bound
from wattline.workloads.window_bounds import edge_bound, samples_bound

if TYPE_CHECKING:
    from wattline.workloads.carbon import IntensitySeries

#: Sub-domains and supersets left out of a host's total (see the module docstring).
EXCLUDED_COMPONENTS = frozenset({"cpu_core", "cpu_uncore", "psys"})
#: A series whose last sample before a host's close ended this long before the host's open
#: is not taken as one the job should have had samples from (a device gone before the job).
LAG_HORIZON_NS = window_bounds.LAG_HORIZON_NS
#: How often :func:`build_complete_report` looks again while it waits.
POLL_S = 0.5

#: The components a complete measurement of a host has, for coverage's "missing" list.
EXPECTED = {"cpu": ("cpu_package", "cpu"), "memory": ("dram",), "network": ("nic",)}

Series = tuple[str, str, str, str, str]  # host, source, component, device, quality
#: (window key, component, device, quality) -> (the channel's bound in that window, its energy there).
Bounds = dict[tuple[str, str, str, str], tuple[Bound, float]]


@dataclass(frozen=True)
class ReportSettings:
    """Knobs of a report (prices, carbon, idle and sharing policy)."""

    price_per_instance_hour: float | None = None
    carbon_intensity: float | None = None
    pue: float = 1.0
    idle: str = "none"  #: none | subtract
    idle_lookback_s: float = 60.0  #: idle baseline measured over this long before the job
    share_rule: str = "equal"  #: equal | device-share | exclusive
    deviceless_share: float = 0.1
    cores_per_neuron_device: int = 2
    saturation: SaturationParams = field(default_factory=SaturationParams)
    #: Carbon intensity over time (a CSV file), applied interval by interval (:mod:`.carbon`).
    carbon_series: IntensitySeries | None = None


@dataclass
class ComponentEnergy:
    """Energy of one component (summed over hosts and devices) in one window."""

    component: str
    energy_j: float = 0.0
    dynamic_j: float = 0.0
    by_quality: dict[str, float] = field(default_factory=dict)
    #: Of energy_j, the part the job got as its measured share of a shared device.
    split_by_use_j: float = 0.0
    #: How far energy_j may be off (:mod:`.uncertainty`).
    bound: Bound = field(default_factory=Bound)


@dataclass
class WindowEnergy:
    """Energy of the job in one window, by component and by host."""

    seconds: float
    components: dict[str, ComponentEnergy] = field(default_factory=dict)
    hosts: dict[str, float] = field(default_factory=dict)

    @property
    def energy_j(self) -> float:
        return math.fsum(c.energy_j for c in self.components.values())

    @property
    def dynamic_j(self) -> float:
        return math.fsum(c.dynamic_j for c in self.components.values())

    @property
    def bound(self) -> Bound:
        """How far energy_j may be off: the components' bounds added (worst case)."""
        return sum((c.bound for c in self.components.values()), Bound())

    def by_quality(self) -> dict[Quality, float]:
        out: dict[Quality, float] = defaultdict(float)
        for comp in self.components.values():
            for q, j in comp.by_quality.items():
                out[Quality(q)] += j
        return dict(out)


@dataclass
class Report:
    """Everything ``wattline report`` prints."""

    job: JobView
    end_ns: int
    saturation: Saturation
    measured_from_ns: int
    units_warmup: float
    units_measured: float
    warmup: WindowEnergy
    measured: WindowEnergy
    figures: economics.Figures
    settings: ReportSettings
    missing: list[str]
    notes: list[str]
    #: Hosts whose samples do not (yet) reach their close: host -> samples up to (ns).
    incomplete: dict[str, int] = field(default_factory=dict)
    #: Hosts whose samples begin after their open: host -> samples only from (ns).
    late_start: dict[str, int] = field(default_factory=dict)
    state: str = "closed"  #: closed | running | abandoned (see JobView.state)
    #: With ``idle="subtract"``: host -> the other jobs that ran in its idle baseline's look-back.
    idle_busy: dict[str, list[str]] = field(default_factory=dict)
    #: The job's charge per accelerator: measured share or claimed (:mod:`.device_shares`).
    device_shares: list[DeviceShare] = field(default_factory=list)

    @property
    def saturated(self) -> bool:
        return self.saturation.saturated

    @property
    def complete(self) -> bool:
        """Every host's samples cover its window, from its open to its close."""
        return not self.incomplete and not self.late_start

    @property
    def energy_data(self) -> bool:
        """Any energy sample of the job's hosts fell in its window: without one, its energy
        figures are "no samples", not 0 J."""
        return bool(self.measured.components or self.warmup.components)

    def to_dict(self) -> dict[str, Any]:
        """The report JSON (``wattline report --json``; README "Report JSON")."""
        from wattline.workloads.render import report_json  # render imports this module

        return report_json(self)


def build_report(
    reader: Reader, job_id: str, settings: ReportSettings | None = None, now_ns: int | None = None
) -> Report:
    """Compute the report of ``job_id`` from the store behind ``reader``."""
    settings = settings or ReportSettings()
    now_ns = now_ns or time.time_ns()
    events = reader.job_events(job_id, every=False)
    job = _view(reader, job_id, events, now_ns, settings)
    end_ns = job.end_ns(now_ns)  # an abandoned job ends when it was last heard
    state = job.state(now_ns)
    notes: list[str] = []
    if state == "running":
        notes.append("job still running: figures up to now")
    elif state == "abandoned":
        notes.append(job.status(now_ns))
    saturation = _saturation(reader, job, end_ns, settings)
    start = saturation.at_ns if saturation.saturated and saturation.at_ns is not None else job.start_ns
    if not saturation.saturated:
        notes.append(f"not saturated ({saturation.reason}): whole-run figures")
    others = _concurrent_jobs(reader, job, end_ns)
    warm = WindowEnergy(seconds=(start - job.start_ns) / 1e9)
    meas = WindowEnergy(seconds=(end_ns - start) / 1e9)
    missing: set[str] = set()
    idle_busy: dict[str, list[str]] = {}
    incomplete: dict[str, int] = {}
    late_start: dict[str, int] = {}
    shares: list[DeviceShare] = []
    for host, window in sorted(job.hosts.items()):
        close = window.end_ns(now_ns, end_ns)  # an abandoned host's window ends when last heard
        late = _samples_from(reader, host, window.open_ns, close)
        if late is not None:
            late_start[host] = late[0]
            notes.append(_late_note(host, window.open_ns, *late))
        if window.close_ns is not None or window.abandoned(now_ns):
            lag = _samples_up_to(reader, host, window.open_ns, close)
            if lag is not None:
                incomplete[host] = lag[0]
                notes.append(_incomplete_note(host, close, *lag))
        busy = _idle_busy(reader, job, host, window.open_ns, settings, now_ns)
        if busy:
            idle_busy[host] = busy
            notes.append(_idle_busy_note(host, settings.idle_lookback_s, busy))
        split = min(max(start, window.open_ns), close)
        bounds: Bounds = {}
        attribution, host_missing, host_notes, host_shares = _host_attribution(
            reader, (job, events), host, (window.open_ns, split, close), others, settings, now_ns, end_ns, bounds
        )
        missing |= host_missing
        notes += host_notes
        shares += host_shares
        _accumulate(warm, attribution, f"{job_id}#warmup", host, bounds)
        _accumulate(meas, attribution, f"{job_id}#measured", host, bounds)
    units_warm = window_energy(job.unit_intervals, job.start_ns, start)  # apportioned like energy
    units_meas = job.units_total - units_warm
    energy = meas.dynamic_j if settings.idle == "subtract" else meas.energy_j
    measured = economics.Measured(units_meas, meas.seconds, energy, max(len(job.hosts), 1))
    figures = economics.figures(measured, settings.price_per_instance_hour, settings.carbon_intensity, settings.pue)
    report = Report(
        job,
        end_ns,
        saturation,
        start,
        units_warm,
        units_meas,
        warm,
        meas,
        figures,
        settings,
        sorted(missing),
        notes,
        incomplete,
        late_start,
        state,
        idle_busy,
        shares,
    )
    if settings.carbon_series is not None:
        from wattline.workloads.carbon import apply_series  # carbon reads the report's timeline

        apply_series(reader, report, settings.carbon_series)
    return report


def report_wait_s(batch_interval_s: float) -> float:
    """How long a report at job end waits for the last samples: two batch intervals (the
    agent ships every batch interval; one more for the collector's write) plus 3 s."""
    return 2 * batch_interval_s + 3.0


def build_complete_report(
    reader: Reader, job_id: str, settings: ReportSettings | None = None, wait_s: float = report_wait_s(1.5)
) -> Report:
    """:func:`build_report`, waiting up to ``wait_s`` after the job's end for samples that
    have not reached the store yet (an agent ships them every batch interval).

    Waits only for a closed job that ended less than ``wait_s`` ago; returns the report
    as soon as it is complete, else the last one built, whose notes say what it lacks.
    """
    while True:
        report = build_report(reader, job_id, settings)
        left_s = wait_s - (time.time_ns() - report.end_ns) / 1e9
        if not report.incomplete or not report.job.closed or left_s <= 0:
            return report
        time.sleep(min(POLL_S, left_s))


def _samples_up_to(reader: Reader, host: str, open_ns: int, close_ns: int) -> tuple[int, list[str]] | None:
    """None when every series of ``host`` active around the job has a sample ending at or
    after ``close_ns``; else (the earliest last-sample end among those that lack one, their
    names)."""
    after = {s.series for s in reader.first_after(host, close_ns)}
    lagging = sorted(
        (s.end_ns, _name(s))
        for s in reader.last_before(host, close_ns)
        if s.series not in after and s.component not in EXCLUDED_COMPONENTS and s.end_ns > open_ns - LAG_HORIZON_NS
    )
    if not lagging:
        return None
    return lagging[0][0], [name for _, name in lagging]


def _samples_from(reader: Reader, host: str, open_ns: int, close_ns: int) -> tuple[int, list[str]] | None:
    """None when every series of ``host`` with samples in the job's window also covers its
    open; else (the latest first-sample start among those that begin after it, their names)."""
    before = {s.series for s in reader.last_before(host, open_ns)}
    late = sorted(
        ((s.start_ns, _name(s)) for s in reader.first_after(host, open_ns) if s.series not in before),
        reverse=True,
    )
    late = [(t, name) for t, name in late if open_ns < t < close_ns and name.split("/")[1] not in EXCLUDED_COMPONENTS]
    if not late:
        return None
    return late[0][0], [name for _, name in late]


def _name(s: StoredSample) -> str:
    return "/".join(s.series[1:4])


def _which(series: list[str]) -> str:
    return series[0] + (f" and {len(series) - 1} more" if len(series) > 1 else "")


def _incomplete_note(host: str, close_ns: int, up_to_ns: int, series: list[str]) -> str:
    return (
        f"incomplete: {host}: samples up to {utc_iso(up_to_ns)}, {(close_ns - up_to_ns) / 1e9:.1f} s before the "
        f"end of the job's window ({_which(series)}); energy figures are low by that part: run the report "
        "again once the agent has shipped them"
    )


def _late_note(host: str, open_ns: int, from_ns: int, series: list[str]) -> str:
    return (
        f"incomplete: {host}: samples only from {utc_iso(from_ns)}, {(from_ns - open_ns) / 1e9:.1f} s after the "
        f"job opened ({_which(series)}); energy before that is not counted"
    )


def _concurrent_jobs(reader: Reader, job: JobView, end_ns: int) -> list[JobView]:
    """The other jobs that may have shared the job's hosts during its window (the overlap per
    host, lease included, is checked in :func:`_host_attribution`), from the events near the
    window and each unclosed job's last heard time only: the cost does not grow with the rest
    of the store."""
    if not job.hosts:
        return []
    events = reader.job_events_between(job.start_ns, end_ns, sorted(job.hosts))
    return [v for v in views_of(events) if v.job_id != job.job_id]


def _view(reader: Reader, job_id: str, others: list[StoredJobEvent], now_ns: int, settings: ReportSettings) -> JobView:
    """The job, its UNITS events read for what the report needs (:func:`.jobs_view.view_at`):
    its units total and count at its start, its saturation mark and each edge of the
    saturation grid. The grid spans the job's window: its opens and closes give it, and for
    a job not closed everywhere the times it was last heard (the first read)."""
    first = inspect_view(job_id, others) if others else None
    if first is None or not first.hosts or not first.closed:
        first = inspect_view(job_id, [*others, *reader.unit_events(job_id, UnitCuts(0, 0))])
    start, end = first.start_ns, first.end_ns(now_ns)
    bins = grid_bins(start, end, settings.saturation) if end > start else 0
    mark = first.saturation_mark_ns
    return view_at(reader, job_id, UnitCuts(start, end, bins, (start,) if mark is None else (start, mark)), others)


def _saturation(reader: Reader, job: JobView, end_ns: int, settings: ReportSettings) -> Saturation:
    utilization = None
    if not job.unit_events and job.saturation_mark_ns is None:
        utilization = _accelerator_utilization(reader, job, end_ns)
    return detect_saturation(
        job.start_ns,
        end_ns,
        unit_events=job.unit_events or None,
        utilization=utilization,
        mark_ns=job.saturation_mark_ns,
        params=settings.saturation,
    )


def _accelerator_utilization(reader: Reader, job: JobView, end_ns: int) -> list[tuple[int, float]] | None:
    points: dict[int, list[float]] = defaultdict(list)
    for host, window in job.hosts.items():
        for s in reader.samples(host, window.open_ns, window.close_ns or end_ns):
            if s.component in ACCELERATOR_COMPONENTS and s.utilization is not None:
                points[s.end_ns // 10**9 * 10**9].append(s.utilization)
    return [(t, sum(v) / len(v)) for t, v in sorted(points.items())] or None


def _host_attribution(
    reader: Reader,
    job_and_events: tuple[JobView, Sequence[StoredJobEvent]],
    host: str,
    edges: tuple[int, int, int],
    others: Sequence[JobView],
    settings: ReportSettings,
    now_ns: int,
    end_ns: int,
    bounds: Bounds,
) -> tuple[Attribution, set[str], list[str], list[DeviceShare]]:
    """Split one host's energy over [open, close) (``edges``: open, split, close) between this
    job's two windows and others. Another job's window ends at its close, at its last heard
    time once abandoned at ``now_ns`` (it shares nothing after that), or at ``end_ns``.
    Accelerators the jobs measured their use of are split by it (:mod:`.device_shares`).
    Each channel's bound in the job's two windows goes to ``bounds``."""
    job, events = job_and_events
    open_ns, split_ns, close_ns = edges
    keys = (f"{job.job_id}#warmup", f"{job.job_id}#measured")
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
    if concurrent or uses:
        lo = min([open_ns] + [w.start_ns for w in concurrent])
        hi = max([close_ns] + [w.end_ns for w in concurrent])
        channels = _channels_from_samples(reader.samples(host, lo, hi), host, settings, notes, (keys, edges, bounds))
        if concurrent:
            notes.append(f"{host}: shared with {len(concurrent)} other job(s); split by rule {settings.share_rule!r}")
    else:
        channels = _channels_from_edges(reader, host, (open_ns, split_ns, close_ns), settings, notes, (keys, bounds))
    every_device = frozenset().union(*(c.claim_keys for c in channels))

    def claims(given: Iterable[str], measured: object, scope: frozenset[str]) -> frozenset[str]:
        """Claimed devices; without claims, every device but those whose per-process use the
        job's wrapper read (``scope``: it is charged those by its measured use), or none but
        by measured use when it measured some and its scope is not known yet (running)."""
        if given:
            return frozenset(given)
        if scope:
            return every_device - scope
        return frozenset() if measured else every_device

    devices = claims(job.hosts[host].devices, uses, use_scope(events, host))
    windows = [
        JobWindow(f"{job.job_id}#warmup", host, open_ns, split_ns, devices, uses),
        JobWindow(f"{job.job_id}#measured", host, split_ns, close_ns, devices, uses),
        *(
            JobWindow(
                w.job_id,
                host,
                w.start_ns,
                w.end_ns,
                claims(w.devices, other_uses[w.job_id], use_scope(other_events[w.job_id], host)),
                other_uses[w.job_id],
            )
            for w in concurrent
        ),
    ]
    idle = IdlePolicy(settings.idle, _idle_baselines(reader, host, open_ns, channels, settings, notes))  # type: ignore[arg-type]
    rule = ShareRule(settings.share_rule, settings.deviceless_share)  # type: ignore[arg-type]
    missing = {name for name, comps in EXPECTED.items() if not any(c.component in comps for c in channels)}
    if not channels:
        notes.append(f"{host}: no energy samples in the job's window (is an agent running there?)")
    attribution = split_shared(channels, windows, rule, idle=idle)
    shares = device_shares(attribution, keys, channels, (open_ns, close_ns), uses)
    notes += [s.note() for s in shares if s.basis != "claimed" or job.hosts[host].devices]
    return attribution, missing, notes, shares


def _claim_keys(component: str, device: str, settings: ReportSettings) -> frozenset[str]:
    """Device claims that charge a channel: GPU by UUID, Neuron device by its cores."""
    if component == "gpu":
        return frozenset({f"gpu:{device}"})
    if component == "accelerator" and device.startswith("neuron") and device[6:].isdigit():
        n, per = int(device[6:]), settings.cores_per_neuron_device
        return frozenset({f"neuron:{n}", *(f"neuroncore:{c}" for c in range(n * per, (n + 1) * per))})
    return frozenset()


def _channel(series: Series, intervals: list[Interval], settings: ReportSettings) -> ChannelEnergy:
    host, _source, component, device, quality = series
    return ChannelEnergy(host, component, device, Quality(quality), intervals, _claim_keys(component, device, settings))


def _channels_from_samples(
    samples: Iterable[StoredSample],
    host: str,
    settings: ReportSettings,
    notes: list[str],
    out: tuple[tuple[str, str], tuple[int, int, int], Bounds],
) -> list[ChannelEnergy]:
    """One channel per series, each instant counted once across overlapping streams; each
    one's bound in the job's two windows (``out``: their keys, the edges, where to put them)."""
    grouped: dict[Series, list[StoredSample]] = defaultdict(list)
    for s in samples:
        if s.component not in EXCLUDED_COMPONENTS:
            grouped[s.series].append(s)
    merges = {k: _merge(v) for k, v in sorted(grouped.items())}
    _stream_notes(host, merges.values(), notes, restarts=False)
    keys, edges, bounds = out
    for key, merged in merges.items():
        for window, (t0, t1) in zip(keys, itertools.pairwise(edges), strict=True):
            energy = window_energy(merged.intervals, t0, t1)
            bound = samples_bound((key[1], key[4]), grouped[key], merged.intervals, (t0, t1, energy))
            bounds[(window, key[2], key[3], key[4])] = (bound, energy)
    return [_channel(k, list(m.intervals), settings) for k, m in merges.items()]


def _merge(samples: Iterable[StoredSample]) -> StreamMerge:
    return merge_streams(StreamSample(s.start_ns, s.end_ns, s.energy_j, s.stream) for s in samples)


def _stream_notes(host: str, merges: Iterable[StreamMerge], notes: list[str], *, restarts: bool) -> None:
    """One note per host when streams overlapped in time; with ``restarts``, one when one followed another."""
    done = list(merges)
    overlapping = max((m.overlapping for m in done), default=0)
    if overlapping:
        notes.append(f"{host}: {overlapping} streams overlapped in time (two agents under one host id?); counted once")
    if restarts and any(m.restarts for m in done):
        notes.append(f"{host}: agent restarted during the job; summed its samples")


def _edge(s: StoredSample | None) -> EdgeSample | None:
    return None if s is None else EdgeSample(s.start_ns, s.end_ns, s.energy_j, s.cumulative_j, s.stream)


def _channels_from_edges(
    reader: Reader,
    host: str,
    edges: tuple[int, ...],
    settings: ReportSettings,
    notes: list[str],
    out: tuple[tuple[str, ...], Bounds],
) -> list[ChannelEnergy]:
    """One Interval per window per series, from the cumulative counter at the edges; its
    bound from the same edge samples (``out``: the windows' keys, where to put the bounds).

    When the edge samples of a series inside the job's span come from more than one
    stream (an agent restarted, or two agents sample the host), its samples in the span
    are merged instead (:mod:`.streams`: overlapping streams count once, restarts add up).
    A second stream never seen at an edge (started and stopped inside the job) changes
    nothing: the edges' stream measured the whole job; it is only not noted.
    """
    lo, hi = edges[0], edges[-1]
    before = [{s.series: s for s in reader.last_before(host, t)} for t in edges]
    after = [{s.series: s for s in reader.first_after(host, t)} for t in edges]
    series = sorted({k for d in before[1:] + after[:-1] for k in d if k[2] not in EXCLUDED_COMPONENTS})
    windows = [(i, t0, t1) for i, (t0, t1) in enumerate(itertools.pairwise(edges)) if t1 > t0]
    channels: list[ChannelEnergy] = []
    samples: dict[Series, list[StoredSample]] | None = None
    merges: list[StreamMerge] = []
    for key in series:
        inside = [s for d in before + after if (s := d.get(key)) is not None and s.start_ns < hi and s.end_ns > lo]
        energies: list[float | None] = [None] * len(windows)
        if len({s.stream for s in inside}) <= 1:
            energies = [
                cumulative_window_energy(
                    _edge(before[i].get(key)),
                    _edge(after[i].get(key)),
                    _edge(before[i + 1].get(key)),
                    _edge(after[i + 1].get(key)),
                    t0,
                    t1,
                )
                for i, t0, t1 in windows
            ]
        merged: StreamMerge | None = None
        # A restart, or a source's own bound per sample (summed over the window): read the samples.
        if None in energies or any(s.energy_error_j is not None for s in inside):
            if samples is None:
                samples = defaultdict(list)
                for s in reader.samples(host, lo, hi):
                    samples[s.series].append(s)
            merged = _merge(samples.get(key, []))
            if None in energies:
                merges.append(merged)
                energies = [window_energy(merged.intervals, t0, t1) for _i, t0, t1 in windows]
        for (i, t0, t1), e in zip(windows, energies, strict=True):
            window = (t0, t1, e or 0.0)
            if merged is not None and samples is not None:
                bound = samples_bound((key[1], key[4]), samples.get(key, []), merged.intervals, window)
            else:
                at_t0, at_t1 = (before[i].get(key), after[i].get(key)), (before[i + 1].get(key), after[i + 1].get(key))
                bound = edge_bound((key[1], key[4]), at_t0, at_t1, window)
            out[1][(out[0][i], key[2], key[3], key[4])] = (bound, e or 0.0)
        intervals = [Interval(t0, t1, e or 0.0) for (_i, t0, t1), e in zip(windows, energies, strict=True)]
        channels.append(_channel(key, intervals, settings))
    _stream_notes(host, merges, notes, restarts=True)
    return channels


def _idle_baselines(
    reader: Reader,
    host: str,
    open_ns: int,
    channels: Sequence[ChannelEnergy],
    settings: ReportSettings,
    notes: list[str],
) -> dict[tuple[str, str, str], float]:
    """Idle power per channel: its mean power over ``idle_lookback_s`` before the job."""
    if settings.idle != "subtract":
        return {}
    t0 = open_ns - int(settings.idle_lookback_s * 1e9)
    before0 = {s.series: s for s in reader.last_before(host, t0)}
    after0 = {s.series: s for s in reader.first_after(host, t0)}
    before1 = {s.series: s for s in reader.last_before(host, open_ns)}
    after1 = {s.series: s for s in reader.first_after(host, open_ns)}
    baselines: dict[tuple[str, str, str], float] = {}
    for key in before1:
        first = after0.get(key)
        if first is None or first.start_ns > t0:
            continue  # no samples covering the whole look-back: no honest baseline
        energy = cumulative_window_energy(
            _edge(before0.get(key)), _edge(first), _edge(before1.get(key)), _edge(after1.get(key)), t0, open_ns
        )
        if energy is not None:
            baselines[(key[0], key[2], key[3])] = energy / settings.idle_lookback_s
    if not baselines and channels:
        notes.append(
            f"{host}: no idle baseline (no samples {settings.idle_lookback_s:.0f} s before the job): "
            "idle counted as 0 W"
        )
    return baselines


def _idle_busy(
    reader: Reader, job: JobView, host: str, open_ns: int, settings: ReportSettings, now_ns: int
) -> list[str]:
    """With ``idle="subtract"``: ids of the other jobs whose window on ``host`` overlaps the idle
    baseline's look-back before ``open_ns`` (from the job events near it only)."""
    if settings.idle != "subtract":
        return []
    t0 = open_ns - int(settings.idle_lookback_s * 1e9)
    views = views_of(reader.job_events_between(t0, open_ns, [host]))
    return sorted(
        v.job_id
        for v in views
        if v.job_id != job.job_id
        and host in v.hosts
        and v.hosts[host].open_ns < open_ns
        and v.hosts[host].end_ns(now_ns, open_ns) > t0
    )


def _idle_busy_note(host: str, lookback_s: float, busy: list[str]) -> str:
    more = f" and {len(busy) - 1} more" if len(busy) > 1 else ""
    return (
        f"warning: {host}: the idle baseline ({lookback_s:.0f} s before the job) was not idle: job "
        f"{clip(busy[0], 60)}{more} ran in it; 'above idle' figures subtract more than idle power"
    )


def _accumulate(window: WindowEnergy, attribution: Attribution, job_key: str, host: str, bounds: Bounds) -> None:
    for share in attribution.shares:
        if share.job_id != job_key or share.host != host:
            continue
        comp = window.components.setdefault(share.component, ComponentEnergy(share.component))
        bound, channel_j = bounds.get((job_key, share.component, share.device, share.quality.value), (Bound(), 0.0))
        comp.bound += bound.scaled(min(share.energy_j / channel_j, 1.0) if channel_j > 0 else 1.0)
        comp.energy_j += share.energy_j
        comp.dynamic_j += share.dynamic_j
        comp.split_by_use_j += share.measured_j
        comp.by_quality[share.quality.value] = comp.by_quality.get(share.quality.value, 0.0) + share.energy_j
        window.hosts[host] = window.hosts.get(host, 0.0) + share.energy_j


def report_coverage(report: Report) -> dict[str, Any]:
    """Share of the measured window's energy by quality, what was not measured at all, and
    the share that is the job's part of a shared device split by measured utilization (the
    device's energy is measured; the job's part of it is derived, not measured)."""
    cov = coverage(report.measured.by_quality(), report.missing)
    total = report.measured.energy_j
    split = math.fsum(c.split_by_use_j for c in report.measured.components.values())
    return {
        "shares": {q.value: v for q, v in cov.shares.items()},
        "measured_share": cov.measured_share,
        "missing": list(cov.missing),
        "split_by_utilization_share": split / total if total > 0 else 0.0,
    }
