"""A job as the store remembers it: rebuilt from its events alone.

A command taking a JOB accepts its id, a job name (its latest run), ``latest`` or a
unique prefix of an id (:func:`resolve_job`).

Everything a report or ``wattline jobs`` needs (hosts, windows, units timeline,
phases, devices, exit codes) is derived from the ``job_events`` points, so reports work
after the fact and after a collector restart.

A host's window without a close is *running* while the job was heard there (any event,
heartbeats included) within the lease (``wire.lease_ns()``) before "now", and
*abandoned* after that: its window then ends when the job was last heard there.

A host's window without an open (the event was lost: a store restarted empty, a spool
dropped) starts at the earliest time its stored events cover (:func:`evidence_ns`: a USE
event's period reaches back before its time), and the host names the open in
:attr:`HostWindow.missing`: the job ran there before that, so its figures are incomplete.

An event no figure can be computed from (units negative or not finite, stored by an
older version; a field of the wrong type) makes the job *bad*: :func:`build_view` raises
:class:`BadJob` saying what is wrong in one line, and :func:`all_views` lists the job
with its :attr:`JobView.problems`, so one bad job never breaks a listing.
"""

from __future__ import annotations

import datetime as dt
import math
import signal
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from wattline import wire
from wattline.jobs.events import SATURATED
from wattline.stores.reader import Reader, StoredJobEvent, UnitCuts, evidence_ns
from wattline.stores.schema import KIND_UNITS, UNIT_LABEL, UNIT_TAG
from wattline.text import clip


class JobNotFound(LookupError):
    """No events for that job id."""


class AmbiguousJob(LookupError):
    """A job reference that matches several jobs (the message lists them)."""


class BadJob(ValueError):
    """A job whose stored events no figure can be computed from (the message says why)."""


@dataclass
class HostWindow:
    """One host's part of a job."""

    host: str
    open_ns: int
    close_ns: int | None = None
    exit_code: int | None = None
    devices: list[str] = field(default_factory=list)
    last_ns: int = 0  #: when the job was last heard on this host (its latest event)
    #: Why another wattline process closed the window (its holder was found gone; see
    #: :mod:`wattline.agent.holders.registry`); empty for a close by the job's own wrapper.
    end_reason: str = ""
    #: How the scheduler ended the job here (a Slurm close's ``end_state``: cancelled, timeout...; a
    #: pod-job's ``pod_end``: succeeded, failed, oom_killed, evicted, deleted...); "" when not said.
    end_state: str = ""
    #: The events that define the window and were not stored (``["open"]``: it starts at the
    #: earliest stored evidence instead); empty when the window is the one its events give.
    missing: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.last_ns = max(self.last_ns, self.open_ns)

    def abandoned(self, now_ns: int, lease_ns: int | None = None) -> bool:
        """No close, and nothing heard for over the lease before ``now_ns``."""
        lease = wire.lease_ns() if lease_ns is None else lease_ns
        return self.close_ns is None and now_ns - self.last_ns > lease

    def end_ns(self, now_ns: int, running_end_ns: int | None = None) -> int:
        """Its close; its last heard time once abandoned; else (running) ``running_end_ns``
        (default ``now_ns``). Abandonment is judged at ``now_ns``."""
        if self.close_ns is not None:
            return self.close_ns
        if self.abandoned(now_ns):
            return self.last_ns
        return now_ns if running_end_ns is None else running_end_ns


#: An extra unit kind's series: its kind and its labels' (name, value) pairs, sorted.
UnitSeries = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class JobView:
    """A job rebuilt from its stored events."""

    job_id: str
    name: str = ""
    kind: str = "other"
    unit_name: str = "units"
    #: Serves until stopped (its open says so): its figures are asked over windows.
    service: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    hosts: dict[str, HostWindow] = field(default_factory=dict)
    unit_events: list[tuple[int, float]] = field(default_factory=list)  #: (time_ns, units) all hosts
    #: (start_ns, end_ns, units) per UNITS event: each covers the time since the same
    #: host's previous UNITS event (or its open), so units apportion like energy.
    unit_intervals: list[tuple[int, int, float]] = field(default_factory=list)
    #: An extra unit kind's series (:data:`UnitSeries`) -> its intervals as ``unit_intervals``
    #: (each since the series' previous event on its host): never in the job's own units.
    kind_intervals: dict[UnitSeries, list[tuple[int, int, float]]] = field(default_factory=dict)
    #: A latency histogram's bucket (or sum) series, its labels holding ``le``, -> its intervals
    #: as ``kind_intervals`` (observations; seconds for ``le="sum"``): not units.
    latency_intervals: dict[UnitSeries, list[tuple[int, int, float]]] = field(default_factory=dict)
    phases: list[tuple[int, str, str]] = field(default_factory=list)  #: (time_ns, host, phase)
    #: What is wrong with its stored events (empty for a good job); bad events are left out.
    problems: list[str] = field(default_factory=list)
    #: None: built from every UNITS event; else from those :func:`view_at` read, which give
    #: the units total and the unit count at these cuts only.
    unit_cuts: UnitCuts | None = None

    def check(self) -> JobView:
        """This view; :class:`BadJob` (one line: the first problem and how many) if it has problems."""
        if self.problems:
            more = f" (and {len(self.problems) - 1} more bad events)" if len(self.problems) > 1 else ""
            raise BadJob(f"job {clip(self.job_id)}: {self.problems[0]}{more}; no figure can be computed")
        return self

    @property
    def start_ns(self) -> int:
        return min(w.open_ns for w in self.hosts.values())

    @property
    def closed(self) -> bool:
        return all(w.close_ns is not None for w in self.hosts.values())

    @property
    def missing_events(self) -> dict[str, list[str]]:
        """Host -> the events that define its window and were not stored (empty: none)."""
        return {host: list(w.missing) for host, w in sorted(self.hosts.items()) if w.missing}

    def end_ns(self, now_ns: int) -> int:
        """The latest host's end (see :meth:`HostWindow.end_ns`): ``now_ns`` while one runs."""
        return max(w.end_ns(now_ns) for w in self.hosts.values())

    def state(self, now_ns: int) -> str:
        """``closed`` (every host closed), ``running`` (a host heard within the lease) or
        ``abandoned`` (a host without a close, none of them heard within the lease)."""
        unclosed = [w for w in self.hosts.values() if w.close_ns is None]
        if not unclosed:
            return "abandoned" if self.end_reason else "closed"
        return "abandoned" if all(w.abandoned(now_ns) for w in unclosed) else "running"

    @property
    def end_reason(self) -> str:
        """Why the job was closed for its dead holder (the first host's reason); empty otherwise."""
        return next((w.end_reason for w in self.hosts.values() if w.end_reason), "")

    @property
    def end_state(self) -> str:
        """How the scheduler ended the job, or its pods (the first host that says; a pod that
        succeeded on one host never hides one that did not on another); empty when not said."""
        said = [w.end_state for w in self.hosts.values() if w.end_state]
        return next((state for state in said if state != "succeeded"), said[0] if said else "")

    def last_heard_ns(self) -> int:
        """When the job was last heard on a host without a close (or on any host); for a job
        closed for its dead holder, when that holder was last known alive."""
        unclosed = [w.last_ns for w in self.hosts.values() if w.close_ns is None]
        if not unclosed and self.end_reason:
            return max(w.close_ns or 0 for w in self.hosts.values() if w.end_reason)
        return max(unclosed or [w.last_ns for w in self.hosts.values()])

    @property
    def heard_at_ns(self) -> int | None:
        """:meth:`last_heard_ns` where it tells something (a job not closed by its own wrapper
        everywhere), else None."""
        return None if self.closed and not self.end_reason else self.last_heard_ns()

    def status(self, now_ns: int) -> str:
        """:meth:`state` as shown to people: an abandoned job says why and when it was last heard."""
        state = self.state(now_ns)
        return abandoned_text(self.end_reason, self.last_heard_ns()) if state == "abandoned" else state

    @property
    def units_total(self) -> float:
        return sum(u for _, u in self.unit_events)

    @property
    def saturation_mark_ns(self) -> int | None:
        """When the workload (or ``--saturated-after``) declared saturation: the latest
        host's mark, so every host is saturated from then on."""
        marks = [t for t, _, phase in self.phases if phase == SATURATED]
        return max(marks) if marks else None

    @property
    def exit_code(self) -> int | None:
        codes = [w.exit_code for w in self.hosts.values() if w.exit_code is not None]
        return max(codes, key=abs) if codes else None


def abandoned_text(reason: str, last_heard_ns: int) -> str:
    """The status of an abandoned job: "abandoned (wrapper gone: ...; last alive at T)" when a
    wattline process on its host found its holder gone, else "abandoned (no close; last heard at T)"."""
    if reason:
        return f"abandoned ({reason}; last alive at {utc_iso(last_heard_ns)})"
    return f"abandoned (no close; last heard at {utc_iso(last_heard_ns)})"


def shown_as_of(reader: Reader, now_ns: int) -> str:
    """Why a job the store shows running at ``now_ns`` may have closed already: "" where the
    store shows a write at once, else "as the store shows it N s ago (T): WHY" (the store's
    ``search_lag_s`` and ``search_lag_why``: a close is a new series on VictoriaMetrics)."""
    lag_s = float(getattr(reader, "search_lag_s", 0.0))
    if lag_s <= 0:
        return ""
    why = str(getattr(reader, "search_lag_why", f"the store shows a write up to {lag_s:.0f} s after it took it"))
    return f"as the store shows it {lag_s:.0f} s ago ({utc_iso(now_ns - round(lag_s * 1e9))}): {why}"


def utc_iso(ns: int) -> str:
    """``ns`` since the epoch as an ISO 8601 UTC time, to the millisecond."""
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).isoformat(timespec="milliseconds")


def build_view(job_id: str, events: list[StoredJobEvent]) -> JobView:
    """Fold events (any order) into a :class:`JobView`; JobNotFound when there are none,
    :class:`BadJob` when one of them is bad."""
    return inspect_view(job_id, events).check()


def view_at(reader: Reader, job_id: str, cuts: UnitCuts, others: list[StoredJobEvent] | None = None) -> JobView:
    """:func:`build_view` of the job with its UNITS events read for figures at ``cuts`` only
    (:meth:`Reader.unit_events`: cost flat in the job's length); ``others``: its other events,
    when already read."""
    marks = reader.job_events(job_id, every=False) if others is None else others
    view = build_view(job_id, [*marks, *reader.unit_events(job_id, cuts)])
    view.unit_cuts = cuts
    return view


def _number(fields: dict[str, Any], name: str, integer: bool = False) -> float:
    """``fields[name]`` (0 when absent) as a finite number (>= 0 unless ``integer``); ValueError saying why not."""
    value = fields.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} {clip(value)} is not a finite number")
    if integer:
        if value != int(value):
            raise ValueError(f"{name} {clip(value)} is not an integer")
        return int(value)
    if value < 0:
        raise ValueError(f"{name} {clip(value)} is negative")
    return float(value)


def inspect_view(job_id: str, events: list[StoredJobEvent]) -> JobView:
    """Fold events (any order) into a :class:`JobView`, its bad events in ``problems``;
    JobNotFound when there are none. Every host with an event has a window: one without an
    open starts at its earliest evidence (:func:`evidence_ns`) and names the open missing."""
    mine = sorted((e for e in events if e.job_id == job_id), key=lambda e: (e.time_ns, e.event_seq))
    if not mine:
        raise JobNotFound(f"no job {clip(job_id)} in the store")
    view = JobView(job_id)
    opened = {e.host for e in mine if e.event == "open"}
    starts: dict[str, int] = {}
    for e in mine:
        if e.host not in opened:
            starts[e.host] = min(starts.get(e.host, e.time_ns), evidence_ns(e))
    last_units: dict[tuple[str, UnitSeries | None], int] = {}
    for e in mine:
        try:
            _fold(view, e, last_units, starts)
        except ValueError as exc:
            view.problems.append(f"{e.event} event at {utc_iso(e.time_ns)} on host {clip(e.host)}: {exc}")
    for host, start in starts.items():
        window = view.hosts.setdefault(host, HostWindow(host, start))
        window.open_ns, window.missing = min(window.open_ns, start), ["open"]
    for e in mine:  # heartbeats and every other kind: when the job was last heard per host
        if e.host in view.hosts:
            window = view.hosts[e.host]
            window.last_ns = max(window.last_ns, e.time_ns)
    return view


def _fold(
    view: JobView, e: StoredJobEvent, last_units: dict[tuple[str, UnitSeries | None], int], starts: dict[str, int]
) -> None:
    """Add one event to ``view``; ValueError (and ``view`` unchanged) for a bad one. ``starts``:
    where the window of a host without an open starts."""
    f = e.fields
    if e.event == "open":
        view.name = str(f.get("name") or view.name or view.job_id)
        view.kind = str(f.get("job_kind") or view.kind)
        view.unit_name = str(f.get("unit_name") or view.unit_name)
        view.service = view.service or bool(f.get("service"))
        view.labels.update({k[6:]: str(v) for k, v in f.items() if k.startswith("label_")})
        devices = [d for d in str(f.get("devices") or "").split(",") if d]
        window = view.hosts.get(e.host)
        if window is None:
            view.hosts[e.host] = HostWindow(e.host, e.time_ns, devices=devices)
        else:
            window.open_ns = min(window.open_ns, e.time_ns)
    elif e.event in ("units", KIND_UNITS):
        count = _number(f, "units")
        series = _series(f) if e.event == KIND_UNITS else None
        opened = view.hosts[e.host].open_ns if e.host in view.hosts else starts.get(e.host, e.time_ns)
        interval = (min(last_units.get((e.host, series), opened), e.time_ns), e.time_ns, count)
        last_units[e.host, series] = e.time_ns
        if series is None:
            view.unit_events.append((e.time_ns, count))
            view.unit_intervals.append(interval)
        else:
            kinds = view.latency_intervals if any(k == "le" for k, _ in series[1]) else view.kind_intervals
            kinds.setdefault(series, []).append(interval)
    elif e.event == "phase":
        view.phases.append((e.time_ns, e.host, str(f.get("phase", ""))))
    elif e.event == "close":
        reason = " ".join(str(f.get("abandoned") or "").split())[:200]
        exit_code = None if reason else int(_number(f, "exit_code", integer=True))
        window = view.hosts.setdefault(e.host, HostWindow(e.host, starts.get(e.host, e.time_ns)))
        if reason and window.close_ns is not None and not window.end_reason:
            return  # the wrapper's own close stands: it saw the workload end
        if not reason and window.end_reason:  # ... and replaces one made for it by another process
            window.close_ns, window.end_reason = None, ""
        window.close_ns = max(window.close_ns or e.time_ns, e.time_ns)
        window.exit_code = exit_code if exit_code is not None else window.exit_code
        window.end_reason = reason
        if f.get("name") and view.name in ("", view.job_id):  # the open did not know it
            view.name = str(f["name"])
        for key, value in f.items():
            if key.startswith("label_"):
                view.labels.setdefault(key[6:], str(value))
        # A Slurm close says how the scheduler ended the job, a pod-job's how its pods ended: one field to show.
        window.end_state = " ".join(str(f.get("end_state") or f.get("pod_end") or "").split())[:64]


def _series(fields: dict[str, Any]) -> UnitSeries:
    """The series an extra unit kind's event counts; ValueError without its kind."""
    if not fields.get(UNIT_TAG):
        raise ValueError("an extra unit kind's units without their kind")
    labels = sorted((k.removeprefix(UNIT_LABEL), str(v)) for k, v in fields.items() if k.startswith(UNIT_LABEL))
    return str(fields[UNIT_TAG]), tuple(labels)


def all_views(reader: Reader) -> list[JobView]:
    """Every job in the store, oldest first; a bad job is listed with its ``problems``."""
    return views_of(reader.job_events())


def views_of(events: list[StoredJobEvent]) -> list[JobView]:
    """The jobs ``events`` belong to, oldest first (bad ones with their ``problems``)."""
    grouped: dict[str, list[StoredJobEvent]] = defaultdict(list)
    for e in events:
        grouped[e.job_id].append(e)
    views = [inspect_view(job_id, job_events) for job_id, job_events in grouped.items()]
    return sorted(views, key=lambda v: v.start_ns)


#: How many candidates an ambiguous reference names.
CANDIDATES_SHOWN = 4


def resolve_job(reader: Reader, ref: str) -> str:
    """The id of the job ``ref`` names: an id; else ``latest`` (the job opened last); else a
    job name (its latest run); else a unique prefix of an id. :class:`JobNotFound` or
    :class:`AmbiguousJob` (one line, listing candidates) otherwise.

    An exact id costs a query for that job (not one row per UNITS event); the others read the
    store's job events once (no report is built)."""
    if reader.job_events(ref, every=False) or reader.unit_events(ref, UnitCuts(0, 0)):
        return ref
    opens: dict[str, tuple[int, str]] = {}  # job id -> (its first event, the name its open gives)
    for e in reader.job_events():
        start, name = opens.get(e.job_id, (e.time_ns, ""))
        if e.event == "open":
            name = name or str(e.fields.get("name") or "")
        opens[e.job_id] = (min(start, e.time_ns), name)
    by_start = sorted(opens, key=lambda j: (opens[j][0], j))
    if ref == "latest":
        if not by_start:
            raise JobNotFound("no job in the store")
        return by_start[-1]
    named = [j for j in by_start if opens[j][1] == ref]
    if named:
        return named[-1]
    prefixed = [j for j in by_start if j.startswith(ref)]
    if len(prefixed) == 1:
        return prefixed[0]
    if not prefixed:
        raise JobNotFound(f"no job {clip(ref)} in the store (an id, a unique id prefix, a job name or latest)")
    shown = ", ".join(clip(j, 60) for j in reversed(prefixed[-CANDIDATES_SHOWN:]))
    more = f" and {len(prefixed) - CANDIDATES_SHOWN} more" if len(prefixed) > CANDIDATES_SHOWN else ""
    raise AmbiguousJob(
        f"job {clip(ref)} is ambiguous: {len(prefixed)} ids start with it, latest first: {shown}{more}; "
        "give more of the id"
    )


#: A scheduler's ``end_state`` (Slurm) or how a pod ended (a pod-job's ``pod_end``) as people
#: read it; another value is shown as it is.
END_STATE_TEXT = {
    "cancelled": "cancelled",
    "timeout": "timed out",
    "node_fail": "node failure",
    "preempted": "preempted",
    "out_of_memory": "out of memory",
    "deadline": "deadline reached",
    "boot_fail": "boot failure",
    "oom_killed": "OOM-killed",
    "shutdown": "node shutdown",
}


def status_text(
    state: str, exit_code: int | None, last_heard_ns: int | None, end_reason: str = "", end_state: str = ""
) -> str:
    """How a job ended, for people: "ok (exit 0)", "failed (exit 143, SIGTERM)", "cancelled
    (exit 143, SIGTERM)" (the scheduler ended it), "evicted (exit 137, SIGKILL)" (how its
    pod ended), "running", "abandoned (no close; last heard
    at T)", "abandoned (wrapper gone: ...; last alive at T)"."""
    if state == "running":
        return "running"
    if state == "abandoned":
        return abandoned_text(end_reason, last_heard_ns or 0)
    verdict = END_STATE_TEXT.get(end_state, end_state) or ("failed" if exit_code else "ok")
    if not exit_code:
        return f"{verdict} (exit 0)"
    number = -exit_code if exit_code < 0 else exit_code - 128
    try:
        name = f", {signal.Signals(number).name}" if number > 0 else ""
    except ValueError:
        name = ""
    return f"{verdict} (exit {exit_code}{name})"
