"""A job's report: saturation, energy of every host and component, per-unit figures
(what a report holds: :mod:`.model`).

Steps (each documented where it lives):

1. The job is rebuilt from its stored events (:mod:`wattline.jobs.jobs_view`).
2. Saturation is detected from the units timeline, the workload's own mark or
   ``--saturated-after`` (``accounting/saturation.py``); without units, from accelerator utilization.
3. Per host, each channel's energy in the warm-up ``[open, saturation)`` and the
   saturated window ``[saturation, close)`` is the difference of its cumulative counter
   at the window edges (O(1) in the job's length); when the edges lie in several agent
   streams (a restart, or streams overlapping in time: counted once, ``accounting/streams.py``), or
   when other jobs shared the host, the samples themselves are split (``accounting/attribution.py``).
   Each channel's energy in each window carries its error bound, from the same samples
   (``accounting/window_bounds.py``, terms in ``accounting/uncertainty.py``). A host's channels are built in
   :mod:`.channels`, the idle baseline of ``--idle subtract`` in :mod:`.idle`.
4. Figures per unit, cost and CO2 come from :mod:`.economics`.
5. Completeness: a host window is complete when its open is stored (else it starts at the
   earliest stored evidence, and the report names the open missing) and every series the
   host reported during the job has samples from before its open to after its close (a
   running job's: now). An agent ships samples every batch interval, so a report built
   right at job end may lack the last seconds;
   :func:`build_complete_report` waits (bounded) for them, and a report that still lacks
   them says so ("incomplete: samples up to ..."), never a quiet shortfall.

Component totals never add RAPL sub-domains to their parent: ``cpu_core`` and
``cpu_uncore`` are inside ``cpu_package``, and ``psys`` (the whole platform) overlaps
everything, so those three are left out of the host's energy.
"""

from __future__ import annotations

import time
from collections import defaultdict

from wattline import wire
from wattline.accounting.attribution import (
    ACCELERATOR_COMPONENTS,
)
from wattline.accounting.device_shares import DeviceShare
from wattline.accounting.saturation import Saturation, detect_saturation, grid_bins
from wattline.accounting.window_bounds import LAG_HORIZON_NS
from wattline.accounting.window_energy import window_energy
from wattline.jobs.jobs_view import JobNotFound, JobView, inspect_view, shown_as_of, utc_iso, view_at
from wattline.reports import economics
from wattline.reports.carbon import apply_series
from wattline.reports.channels import EXCLUDED_COMPONENTS, Bounds
from wattline.reports.host_energy import accumulate, concurrent_jobs, host_attribution
from wattline.reports.idle import idle_busy_jobs, idle_busy_note
from wattline.reports.latency import latencies
from wattline.reports.model import Report, ReportSettings
from wattline.reports.model_split import split_note
from wattline.reports.stored_intervals import STORED, Plan, read_plan
from wattline.reports.window_view import clip_view, intervals_bound, units_bound
from wattline.reports.windows import WindowEnergy
from wattline.stores.reader import Reader, StoredJobEvent, StoredSample, UnitCuts

#: How often :func:`build_complete_report` looks again while it waits.
POLL_S = 0.5


def build_report(
    reader: Reader, job_id: str, settings: ReportSettings | None = None, now_ns: int | None = None
) -> Report:
    """Compute the report of ``job_id`` from the store behind ``reader``."""
    settings = settings or ReportSettings()
    now_ns = now_ns or time.time_ns()
    events = reader.job_events(job_id, every=False)
    job = _view(reader, job_id, events, now_ns, settings)
    state = job.state(now_ns)
    asked = settings.window
    if asked is not None:  # figures over the window: the job as it was inside it
        now_ns = min(now_ns, asked.to_ns)
        unclipped, job = job, clip_view(job, asked, now_ns)
    end_ns = job.end_ns(now_ns)  # an abandoned job ends when it was last heard
    notes: list[str] = []
    if asked is not None:
        notes.append(f"figures over the window asked, {asked.describe()}")
        if end_ns < asked.to_ns or job.start_ns > asked.from_ns:
            notes.append(f"the job ran {utc_iso(job.start_ns)} to {utc_iso(end_ns)} of it")
    elif state == "running" and job.service:
        notes.append("a service, still serving: figures since it started; ask a window (--since, --from/--to, --every)")
    elif state == "running":
        notes.append("job still running: figures up to now")
        if shown := shown_as_of(reader, now_ns):  # its close may be written and not shown yet
            notes.append(f"running {shown}; the job may have closed since")
    elif state == "abandoned":
        notes.append(job.status(now_ns))
    saturation = _saturation(reader, job, end_ns, settings)
    start = saturation.at_ns if saturation.saturated and saturation.at_ns is not None else job.start_ns
    if not saturation.saturated and asked is None:
        notes.append(f"not saturated ({saturation.reason}): whole-run figures")
    others = concurrent_jobs(reader, job, end_ns)
    warm = WindowEnergy(seconds=(start - job.start_ns) / 1e9)
    sat = WindowEnergy(seconds=(end_ns - start) / 1e9)
    missing: set[str] = set()
    idle_busy: dict[str, list[str]] = {}
    incomplete: dict[str, int] = {}
    late_start: dict[str, int] = {}
    shares: list[DeviceShare] = []
    from_stored = asked is not None and settings.from_stored and job.service  # a service's stored intervals
    plan = read_plan(reader, job_id, asked, settings) if from_stored and asked is not None else None
    if plan is not None:
        notes.append(plan.note())
        if plan.stored:
            sat.components[STORED] = plan.energy()
    for host, whole in sorted(job.hosts.items()):
        if whole.missing:
            notes.append(_missing_note(job, host, whole.open_ns))
        for opened, close in _raw_parts(whole.open_ns, whole.end_ns(now_ns, end_ns), plan):
            at_open, at_close = reader.around(host, (opened, close))
            late = _samples_from(at_open, opened, close)
            if late is not None:
                late_start[host] = late[0]
                notes.append(_late_note(host, opened, *late))
            lag = _samples_up_to(at_close, opened)  # a running window's end ("now") included
            if lag is not None:
                incomplete[host] = lag[0]
                notes.append(_incomplete_note(host, close, *lag))
            busy = idle_busy_jobs(reader, job, host, opened, settings, now_ns)
            if busy:
                idle_busy[host] = busy
                notes.append(idle_busy_note(host, settings.idle_lookback_s, busy))
            split = min(max(start, opened), close)
            bounds: Bounds = {}
            attribution, host_missing, host_notes, host_shares = host_attribution(
                reader, (job, events), host, (opened, split, close), others, settings, (now_ns, end_ns), bounds
            )
            missing |= host_missing
            notes += host_notes
            shares += host_shares
            accumulate(warm, attribution, f"{job_id}#warmup", host, bounds)
            accumulate(sat, attribution, f"{job_id}#saturated", host, bounds)
    units_warm = window_energy(job.unit_intervals, job.start_ns, start)  # apportioned like energy
    units_sat = job.units_total - units_warm
    energy = sat.dynamic_j if settings.idle == "subtract" else sat.energy_j
    stretch = economics.Window(units_sat, sat.seconds, energy, max(len(job.hosts), 1))
    figures = economics.figures(stretch, settings.price_per_instance_hour, settings.carbon_intensity, settings.pue)
    report = Report(
        job,
        end_ns,
        saturation,
        start,
        units_warm,
        units_sat,
        warm,
        sat,
        figures,
        settings,
        sorted(missing),
        notes,
        incomplete,
        late_start,
        state,
        idle_busy,
        shares,
        *_sharing(job, others, now_ns, end_ns),
        units_bound=0.0 if asked is None else units_bound(unclipped, asked),
        kind_bounds={}
        if asked is None
        else {k: intervals_bound(v, asked) for k, v in unclipped.kind_intervals.items()},
        latencies=latencies(job if asked is None else unclipped, asked),
    )
    if note := split_note(report):
        report.notes.append(note)
    if settings.carbon_series is not None:
        apply_series(reader, report, settings.carbon_series)
    return report


def _raw_parts(open_ns: int, close_ns: int, plan: Plan | None) -> list[tuple[int, int]]:
    """The stretches of a host's window [open_ns, close_ns) computed from raw samples: all of it,
    or what the stored intervals of ``plan`` leave of it (an abandoned host's ends when last heard)."""
    if plan is None:
        return [(open_ns, close_ns)]
    parts = [(max(open_ns, w.from_ns), min(close_ns, w.to_ns)) for w in plan.raw]
    return [(a, b) for a, b in parts if b > a]


def report_wait_s(batch_interval_s: float) -> float:
    """How long a report at job end waits for the last samples: two batch intervals (the
    agent ships every batch interval; one more for the collector's write) plus 3 s."""
    return 2 * batch_interval_s + 3.0


def search_lag_s(reader: Reader) -> float:
    """How long after acknowledging a write the store may take to show it (0: at once)."""
    return float(getattr(reader, "search_lag_s", 0.0))


def build_complete_report(
    reader: Reader,
    job_id: str,
    settings: ReportSettings | None = None,
    wait_s: float = report_wait_s(1.5),
    closed: bool = False,
) -> Report:
    """:func:`build_report`, waiting up to ``wait_s`` after the job's end for samples that
    have not reached the store yet (an agent ships them every batch interval).

    Waits only for a closed job that ended less than ``wait_s`` ago; returns the report
    as soon as it is complete, else the last one built, whose notes say what it lacks.
    ``closed``: the caller knows the job closed (its close was acknowledged): up to ``wait_s``
    (at least the store's :func:`search_lag_s`) for the store to show it (VictoriaMetrics makes rows searchable
    a moment after it took them), so the report is not that of a job still running.
    """
    shown_by = time.monotonic() + max(wait_s, search_lag_s(reader))
    while True:
        try:
            report = build_report(reader, job_id, settings)
        except JobNotFound:
            if not closed or time.monotonic() >= shown_by:
                raise
            time.sleep(POLL_S)  # its events are stored, not searchable yet
            continue
        if closed and not report.job.closed and time.monotonic() < shown_by:
            time.sleep(POLL_S)
            continue
        left_s = wait_s - (time.time_ns() - report.end_ns) / 1e9
        if not report.incomplete or not report.job.closed or left_s <= 0:
            return report
        time.sleep(min(POLL_S, left_s))


Edges = tuple[list[StoredSample], list[StoredSample]]  #: (last before, first after) an instant


def _samples_up_to(at_close: Edges, open_ns: int) -> tuple[int, list[str]] | None:
    """None when every series of the host active around the job has a sample ending at or
    after its close (``at_close``: the host's samples around it); else (the earliest
    last-sample end among those that lack one, their names)."""
    after = {s.series for s in at_close[1]}
    lagging = sorted(
        (s.end_ns, _name(s))
        for s in at_close[0]
        if s.series not in after and s.component not in EXCLUDED_COMPONENTS and s.end_ns > open_ns - LAG_HORIZON_NS
    )
    if not lagging:
        return None
    return lagging[0][0], [name for _, name in lagging]


def _samples_from(at_open: Edges, open_ns: int, close_ns: int) -> tuple[int, list[str]] | None:
    """None when every series of the host with samples in the job's window also covers its
    open (``at_open``: the host's samples around it); else (the latest first-sample start
    among those that begin after it, their names)."""
    before = {s.series for s in at_open[0]}
    late = sorted(
        ((s.start_ns, _name(s)) for s in at_open[1] if s.series not in before),
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


def _missing_note(job: JobView, host: str, start_ns: int) -> str:
    """What a host's window lacks when its open was not stored."""
    unknown = "" if len(job.missing_events) < len(job.hosts) else "; its kind and unit name (the open's) are unknown"
    return (
        f"incomplete: {host}: open not stored: the window starts at its first stored event, {utc_iso(start_ns)}; "
        f"the job ran there before it, and energy before it is not counted{unknown}"
    )


def _late_note(host: str, open_ns: int, from_ns: int, series: list[str]) -> str:
    return (
        f"incomplete: {host}: samples only from {utc_iso(from_ns)}, {(from_ns - open_ns) / 1e9:.1f} s after the "
        f"job opened ({_which(series)}); energy before that is not counted"
    )


def _sharing(job: JobView, others: list[JobView], now_ns: int, end_ns: int) -> tuple[list[str], int | None]:
    """The other jobs whose window overlapped the job's on one of its hosts, and the earliest
    time one of them that still runs would be abandoned if not heard again (its lease's
    end): the figures may change then, or when one of them closes."""
    shared: set[str] = set()
    until: list[int] = []
    for v in others:
        for host, window in job.hosts.items():
            theirs = v.hosts.get(host)
            if theirs is None:
                continue
            if theirs.open_ns < window.end_ns(now_ns, end_ns) and theirs.end_ns(now_ns, end_ns) > window.open_ns:
                shared.add(v.job_id)
                if theirs.close_ns is None and not theirs.abandoned(now_ns):
                    until.append(theirs.last_ns + wire.lease_ns())
    return sorted(shared), min(until, default=None)


def neighbours(reader: Reader, job: JobView, until_ns: int) -> list[str]:
    """The other jobs on the job's hosts from its open to ``until_ns``: those whose figures may
    have counted it as running there, before its window was known to end earlier (a close
    made for its dead holder, events that came late)."""
    others = concurrent_jobs(reader, job, until_ns)
    return sorted(
        v.job_id
        for v in others
        if any(
            host in v.hosts and v.hosts[host].open_ns < until_ns and v.hosts[host].end_ns(until_ns) > w.open_ns
            for host, w in job.hosts.items()
        )
    )


def _view(reader: Reader, job_id: str, others: list[StoredJobEvent], now_ns: int, settings: ReportSettings) -> JobView:
    """The job, its UNITS events read for what the report needs (:func:`wattline.jobs.jobs_view.view_at`):
    its units total and count at its start, its saturation mark and each edge of the
    saturation grid. The grid spans the job's window: its opens and closes give it, and for
    a job not closed everywhere the times it was last heard, or where an open was not stored
    its first evidence (the first read)."""
    first = inspect_view(job_id, others) if others else None
    if first is None or not first.hosts or not first.closed or first.missing_events:  # units may say more
        first = inspect_view(job_id, [*others, *reader.unit_events(job_id, UnitCuts(0, 0))])
    start, end = first.start_ns, first.end_ns(now_ns)
    mark = first.saturation_mark_ns
    extra = (start,) if mark is None else (start, mark)
    if settings.window is not None:  # no saturation grid: the units at the window's edges
        cuts = UnitCuts(start, end, 0, (*extra, settings.window.from_ns, settings.window.to_ns))
    else:
        cuts = UnitCuts(start, end, grid_bins(start, end, settings.saturation) if end > start else 0, extra)
    return view_at(reader, job_id, cuts, others)


def _saturation(reader: Reader, job: JobView, end_ns: int, settings: ReportSettings) -> Saturation:
    if settings.window is not None:  # a stretch asked for: its figures whole, saturated or not
        return Saturation(False, None, "window", None, f"window asked: {settings.window.describe()}")
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
