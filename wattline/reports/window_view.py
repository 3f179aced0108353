"""A job seen through a window of time asked for (``wattline report JOB --since 15m``, ``--from``
/``--to``): a service never ends, so its figures are those of a stretch of it.

The job's view is cut to the window: each host's part starts no earlier than the window and
ends no later (a close after the window's end is not yet a close), and each UNITS event's
units, which cover the time since the host's previous one, are apportioned to the window by
overlap, as energy is. Where an event's span crosses an edge of the window, where in that span
its units were done is not known: :func:`units_bound` says how far the window's units may be off.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from wattline.jobs.jobs_view import HostWindow, JobView, utc_iso


@dataclass(frozen=True)
class Window:
    """A stretch of time asked for, ns since the epoch."""

    from_ns: int
    to_ns: int

    def __post_init__(self) -> None:
        if self.to_ns <= self.from_ns:
            raise ValueError(f"the window ends ({utc_iso(self.to_ns)}) before it starts ({utc_iso(self.from_ns)})")

    def describe(self) -> str:
        return f"{utc_iso(self.from_ns)} to {utc_iso(self.to_ns)}"


class OutsideJob(ValueError):
    """The window asked holds none of the job."""


def clip_view(job: JobView, window: Window, now_ns: int) -> JobView:
    """``job`` as seen inside ``window`` (judged at ``now_ns``, at most the window's end)."""
    hosts: dict[str, HostWindow] = {}
    for host, w in job.hosts.items():
        end = w.end_ns(now_ns)
        if w.open_ns >= window.to_ns or end <= window.from_ns:
            continue
        closed = w.close_ns is not None and w.close_ns <= window.to_ns
        hosts[host] = dataclasses.replace(
            w,
            open_ns=max(w.open_ns, window.from_ns),
            close_ns=w.close_ns if closed else None,
            exit_code=w.exit_code if closed else None,
            end_reason=w.end_reason if closed else "",
            end_state=w.end_state if closed else "",
            last_ns=min(w.last_ns, window.to_ns),
            missing=[m for m in w.missing if m != "open" or w.open_ns >= window.from_ns],
        )
    if not hosts:
        raise OutsideJob(
            f"job {job.job_id} ran from {utc_iso(job.start_ns)} to {utc_iso(job.end_ns(now_ns))}: "
            f"the window {window.describe()} holds none of it"
        )
    intervals = _clipped(job.unit_intervals, window)
    return dataclasses.replace(
        job,
        hosts=hosts,
        unit_intervals=intervals,
        kind_intervals={series: _clipped(spans, window) for series, spans in job.kind_intervals.items()},
        latency_intervals={series: _clipped(spans, window) for series, spans in job.latency_intervals.items()},
        unit_events=[(e, u) for _, e, u in intervals],
        phases=[p for p in job.phases if window.from_ns <= p[0] <= window.to_ns],
    )


def units_bound(job: JobView, window: Window) -> float:
    """How far the job's units apportioned to ``window`` may be off (:func:`intervals_bound`)."""
    return intervals_bound(job.unit_intervals, window)


def intervals_bound(intervals: Iterable[tuple[int, int, float]], window: Window) -> float:
    """How far the units of ``intervals`` (one unit series') apportioned to ``window`` may be
    off: of each UNITS event whose span crosses an edge, the units were all inside or all
    outside at worst."""
    bound = 0.0
    for s, e, u in intervals:
        if e <= s or not any(s < edge < e for edge in (window.from_ns, window.to_ns)):
            continue
        inside = (min(e, window.to_ns) - max(s, window.from_ns)) / (e - s)
        bound += max(inside, 1.0 - inside) * u
    return bound


def _clipped(intervals: Iterable[tuple[int, int, float]], window: Window) -> list[tuple[int, int, float]]:
    return [_clip(s, e, u, window) for s, e, u in intervals if _overlaps(s, e, window)]


def _overlaps(start_ns: int, end_ns: int, window: Window) -> bool:
    """An event's span overlaps the window (an instant's event: it lies inside)."""
    if end_ns <= start_ns:
        return window.from_ns < end_ns <= window.to_ns
    return start_ns < window.to_ns and end_ns > window.from_ns


def _clip(start_ns: int, end_ns: int, units: float, window: Window) -> tuple[int, int, float]:
    """The part of one event's span and units inside the window, apportioned by overlap."""
    if end_ns <= start_ns:
        return start_ns, end_ns, units
    a, b = max(start_ns, window.from_ns), min(end_ns, window.to_ns)
    return a, b, units * (b - a) / (end_ns - start_ns)
