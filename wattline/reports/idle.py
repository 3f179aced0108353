"""The idle baseline of ``--idle subtract``: each channel's mean power before the job, and
the other jobs that ran in that look-back (a baseline that was not idle)."""

from __future__ import annotations

from collections.abc import Sequence

from wattline.accounting.attribution import ChannelEnergy
from wattline.accounting.window_energy import cumulative_window_energy
from wattline.jobs.jobs_view import JobView, views_of
from wattline.reports.channels import edge_sample
from wattline.reports.model import ReportSettings
from wattline.stores.reader import Reader
from wattline.text import clip


def idle_baselines(
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
    (last0, first0), (last1, first1) = reader.around(host, (t0, open_ns))
    before0, after0 = {s.series: s for s in last0}, {s.series: s for s in first0}
    before1, after1 = {s.series: s for s in last1}, {s.series: s for s in first1}
    baselines: dict[tuple[str, str, str], float] = {}
    for key in before1:
        first = after0.get(key)
        if first is None or first.start_ns > t0:
            continue  # no samples covering the whole look-back: no honest baseline
        energy = cumulative_window_energy(
            edge_sample(before0.get(key)),
            edge_sample(first),
            edge_sample(before1.get(key)),
            edge_sample(after1.get(key)),
            t0,
            open_ns,
        )
        if energy is not None:
            baselines[(key[0], key[2], key[3])] = energy / settings.idle_lookback_s
    if not baselines and channels:
        notes.append(
            f"{host}: no idle baseline (no samples {settings.idle_lookback_s:.0f} s before the job): "
            "idle counted as 0 W"
        )
    return baselines


def idle_busy_jobs(
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


def idle_busy_note(host: str, lookback_s: float, busy: list[str]) -> str:
    more = f" and {len(busy) - 1} more" if len(busy) > 1 else ""
    return (
        f"warning: {host}: the idle baseline ({lookback_s:.0f} s before the job) was not idle: job "
        f"{clip(busy[0], 60)}{more} ran in it; 'above idle' figures subtract more than idle power"
    )
