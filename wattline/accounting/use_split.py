"""A device's energy split by the jobs' recorded use (USE job events), their periods overlapping.

Each job's holder (its wrapper, the pod or Slurm watcher) sends the mean use of a device by
the job's processes (``job_use``) and by every process (``device_use``) over periods of its
own, which start and end when that holder happened to ask. One period's ratio
``job_use / device_use`` is the job's part of the device over that period as a whole, but
not over each of its pieces: where another job started inside it, the job's part there was
smaller than the period's ratio, and where the other had not started yet, larger. Two such
ratios applied to the pieces they share may add up to more than the device.

So a piece ``(a, b]`` goes by rates instead: each job using the device then is taken at its
own period's mean (``job_use``, the job's processes alone); the processes of no job at the
largest *others* estimate of the periods that cover the piece, one period's estimate being
``device_use - job_use -`` the other jobs' mean use over that period (from their own
periods, never below 0); and a job gets ``rate / (sum of the jobs' rates + others)``. Where
a single job's periods cover the device this is exactly its period ratio. The largest
estimate is kept because a period's ``device_use`` can only fall short: NVML drops an
exited process's samples, so a job that asks after another's process ended sees none of
that process's use in the time before it ended. A job that is running but whose use has no
period covering the piece yet (its holder's next event is still to come) counts at the
rate of its nearest period in the sum, never in its own favour: it is charged only where its
own periods cover it.

How far that may be off (:meth:`UseSplit.bounds`): a period's mean stands for one set of
processes only where the same processes held the device throughout (a *steady* period);
the split is then exact while their rates hold. Where one started or ended inside a period
(a wrapper sends the ask in which it did as a period of its own; the pod and Slurm
watchers' periods may all hold one), a job's part there lay somewhere between its parts
before and after that period: its term is the energy there x how far its weight is from
the farther of the two. A process's change of pace inside a steady period is not bounded.

A host's CPU split by CPU time (:meth:`UseSplit.by_ratio`) has the same blind spot at a job's
edges: its holder reads its CPU time and the host's when it happens to look, so a period in
which the job's processes appeared or went (its first or last period, one next to a period
without its use or to a stretch not read) spreads its CPU time over the whole period, and
charges it the period's ratio where it was not there yet (``U f / (O + U f)`` of the period
for a truth of ``f U / (O + U)``: U, O the job's and the others' paces, f the part it ran).
Such a period is an *edge* (:func:`mark_edges`, :attr:`UseInterval.edge`), the CPU split's
unsteady one, bounded as above, unless its holder sent it steady (it knew its processes ran
throughout: a pod's periods run from its containers' start to their end; a unit holder's
do not where it saw the unit start or stop). An older holder's periods, none sent steady, have
each job's first and last period bounded so. A period not sent steady with the job's use on
both sides (its processes went and came back inside it) is not bounded.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol


@dataclass(frozen=True, slots=True)
class UseInterval:
    """A job's recorded use of one device over ``(start_ns, end_ns]`` (a USE job event).

    ``job_use`` and ``device_use`` are in one unit (percent of the device): the job's
    processes' and every process's; the job's fraction is their ratio.
    """

    start_ns: int
    end_ns: int
    job_use: float
    device_use: float
    metric: str = ""  #: "sm", "memory", "neuroncore", "mig-memory" (a rule by MIG instance size)
    #: The same processes held the device throughout (else one may have started or ended in it).
    steady: bool = False
    #: Standing for several periods (:func:`coarsen`): how far their fractions are from its fraction.
    spread: float = 0.0
    #: A CPU-time period in which the job's use may have begun or ended (:func:`mark_edges`).
    edge: bool = False

    @property
    def fraction(self) -> float:
        """The job's part of the device's use, 0..1; 0 when the device was idle."""
        return min(self.job_use / self.device_use, 1.0) if self.device_use > 0 else 0.0


def mark_edges(timeline: UseTimeline) -> UseTimeline:
    """The job's CPU-time periods with those in which its use may have begun or ended marked
    :attr:`UseInterval.edge`: a period with use, not sent steady by its holder (its processes
    there throughout), whose neighbour on either side is not a period of use that touches it
    (none: its first or last, a stretch not read; or a period without use). Already marked
    ones stay so (a merged period holding an edge)."""
    periods = timeline.intervals

    def used(i: int, touching: int) -> bool:
        return 0 <= i < len(periods) and periods[i].job_use > 0 and touching == 0

    out = [
        replace(u, edge=True)
        if u.job_use > 0
        and not u.steady
        and not u.edge
        and not (
            used(i - 1, u.start_ns - periods[i - 1].end_ns if i else 1)
            and used(i + 1, periods[i + 1].start_ns - u.end_ns if i + 1 < len(periods) else 1)
        )
        else u
        for i, u in enumerate(periods)
    ]
    return UseTimeline(out)


def coarsen(timeline: UseTimeline, most: int) -> UseTimeline:
    """At most about ``most`` intervals (one per run of contiguous periods more where the
    periods have gaps): contiguous periods merged ``k`` at a time, ``k`` the fewest that fits,
    each merged one their use's means over it and its :attr:`UseInterval.spread`; one holding
    a CPU-time edge (:func:`mark_edges`, marked here first) is an edge."""
    timeline = mark_edges(timeline)
    periods = timeline.intervals
    if len(periods) <= most:
        return timeline
    k = -(-len(periods) // most)
    out: list[UseInterval] = []
    group: list[UseInterval] = []
    for u in periods:
        if group and (len(group) == k or group[-1].end_ns != u.start_ns):
            out.append(_merged(group))
            group = []
        group.append(u)
    out.append(_merged(group))
    return UseTimeline(out)


def _merged(group: Sequence[UseInterval]) -> UseInterval:
    start, end = group[0].start_ns, group[-1].end_ns
    if len(group) == 1 or end <= start:
        return group[0]
    job = math.fsum(u.job_use * (u.end_ns - u.start_ns) for u in group) / (end - start)
    device = math.fsum(u.device_use * (u.end_ns - u.start_ns) for u in group) / (end - start)
    merged = UseInterval(start, end, job, device, group[0].metric, all(u.steady for u in group))
    merged = replace(merged, edge=any(u.edge for u in group))
    return replace(merged, spread=max(abs(u.fraction - merged.fraction) for u in group))


class UseTimeline:
    """A job's use intervals of one device, sorted and disjoint, found by time in O(log n)."""

    __slots__ = ("_ends", "intervals")

    def __init__(self, intervals: Iterable[UseInterval]) -> None:
        self.intervals = tuple(sorted(intervals, key=lambda u: u.end_ns))
        self._ends = [u.end_ns for u in self.intervals]

    def at(self, a: int, b: int) -> UseInterval | None:
        """The interval covering the piece ``(a, b]`` (a point when ``a == b``), if any."""
        i = bisect.bisect_left(self._ends, b)
        if i == len(self.intervals):
            return None
        u = self.intervals[i]
        return u if u.start_ns <= a and (a < b or u.start_ns < b) else None

    def nearest(self, b: int) -> UseInterval:
        """The interval that ends at or after ``b`` and is closest to it, else the last one
        (the rate a job held where no interval covers it; the timeline is not empty)."""
        i = bisect.bisect_left(self._ends, b)
        return self.intervals[min(i, len(self.intervals) - 1)]

    def integral(self, lo: int, hi: int) -> float:
        """Use x ns over ``(lo, hi]``: each interval's ``job_use`` where it covers, and
        where none does, the next interval's (the last one's after the last)."""
        total, pos = 0.0, lo
        i = bisect.bisect_right(self._ends, lo)
        while pos < hi and i < len(self.intervals):
            u = self.intervals[i]
            end = min(u.end_ns, hi)
            total += u.job_use * (end - pos)  # a gap before u holds u's rate
            pos, i = end, i + 1
        if pos < hi:
            total += self.intervals[-1].job_use * (hi - pos)
        return total

    def rate(self, lo: int, hi: int) -> float:
        """The mean use over ``(lo, hi]`` (``lo < hi``): over the parts of its steady
        intervals there, where it has any (an unsteady one may lack the use of a process
        that exited in it), else :meth:`integral`'s."""
        total, covered = 0.0, 0
        i = bisect.bisect_right(self._ends, lo)
        while i < len(self.intervals) and self.intervals[i].start_ns < hi:
            u = self.intervals[i]
            if u.steady and (inside := min(u.end_ns, hi) - max(u.start_ns, lo)) > 0:
                total, covered = total + u.job_use * inside, covered + inside
            i += 1
        return total / covered if covered else self.integral(lo, hi) / (hi - lo)


class UsingWindow(Protocol):
    """What a use split reads of a job's window (:class:`~.attribution.JobWindow`)."""

    @property
    def job_id(self) -> str: ...
    @property
    def start_ns(self) -> int: ...
    @property
    def end_ns(self) -> int: ...
    @property
    def uses(self) -> Mapping[str, UseTimeline]: ...


@dataclass(slots=True)
class _User:
    """One job's timeline on the device and its span there: its windows and its periods."""

    timeline: UseTimeline
    start_ns: int
    end_ns: int
    others: dict[int, float]  #: id() of its interval -> the others' rate estimated from it


class UseSplit:
    """The pieces of one device channel split by the recorded use of ``windows`` (the
    windows of one job share its timeline object; see the module doc)."""

    def __init__(self, windows: Sequence[UsingWindow], keys: frozenset[str], rates: bool = True) -> None:
        """``rates``: split by rates (:meth:`weights`); without, only :meth:`by_ratio` is asked
        (the other processes' estimates are not made), and the periods the bound takes as
        unsteady are the CPU-time edges (:func:`mark_edges`), not those sent unsteady."""
        self._rates = rates
        edged: dict[int, UseTimeline] = {}
        self._users: dict[int, _User] = {}
        self._user_of: dict[str, _User] = {}
        #: Set by :meth:`by_ratio` for its last piece: each job whose fraction there stands for
        #: several of its periods (:func:`coarsen`), and how far they differ from it.
        self.coarse: dict[str, float] = {}
        for w in windows:
            tl = next((w.uses[k] for k in sorted(keys & w.uses.keys()) if w.uses[k].intervals), None)
            if tl is None:
                continue
            if not rates:  # one marked timeline per job (its windows share one)
                if id(tl) not in edged:
                    edged[id(tl)] = mark_edges(tl)
                tl = edged[id(tl)]
            user = self._users.get(id(tl))
            if user is None:  # its periods may reach past its windows (the first ask before its start)
                start, end = tl.intervals[0].start_ns, tl.intervals[-1].end_ns
                user = self._users[id(tl)] = _User(tl, min(start, w.start_ns), max(end, w.end_ns), {})
            user.start_ns, user.end_ns = min(user.start_ns, w.start_ns), max(user.end_ns, w.end_ns)
            self._user_of[w.job_id] = user
        for user in self._users.values() if rates else ():
            for u in user.timeline.intervals:
                length = u.end_ns - u.start_ns
                theirs = math.fsum(
                    v.timeline.rate(*clip) * (clip[1] - clip[0])
                    for v in self._users.values()
                    if v is not user
                    if (clip := _clip(v, u.start_ns, u.end_ns))
                )
                user.others[id(u)] = max(0.0, u.device_use - u.job_use - theirs / length) if length > 0 else 0.0

    def weights(
        self, active: Sequence[UsingWindow], a: int, b: int, exclusive: bool
    ) -> list[tuple[str | None, float]] | None:
        """Weights of the piece ``(a, b]`` among ``active`` (None: unattributed); None when
        no active job's recorded use covers it. Where the device was idle while jobs
        recorded their use, equal among them (one only when ``exclusive``)."""
        covered: list[tuple[str, UseInterval]] = []
        held: dict[int, float] = {}
        for w in active:
            user = self._user_of.get(w.job_id)
            if user is None:
                continue
            u = user.timeline.at(a, b)
            if u is not None:
                covered.append((w.job_id, u))
                held[id(user)] = u.job_use
            else:
                held.setdefault(id(user), user.timeline.nearest(b).job_use)
        if not covered:
            return None
        # a steady period's estimate where one covers the piece: an unsteady one's may lack
        # the use of a process that exited in it
        trusted = [(j, u) for j, u in covered if u.steady] or covered
        others = max(self._user_of[j].others[id(u)] for j, u in trusted)
        total = math.fsum(held.values()) + others
        if total <= 0:  # jobs on the device, the device idle: among them
            if exclusive:
                return [(covered[0][0], 1.0)] if len(covered) == 1 else []
            return [(j, 1.0) for j, _ in covered]
        weights: list[tuple[str | None, float]] = [(j, u.job_use / total) for j, u in covered if u.job_use > 0]
        return [*weights, (None, 1.0 - math.fsum(w for _, w in weights))]

    def by_ratio(
        self, active: Sequence[UsingWindow], a: int, b: int
    ) -> tuple[list[tuple[str | None, float]], dict[str, float]]:
        """Weights of the piece ``(a, b]`` among ``active`` for a host's CPU split by CPU time,
        and for each job whose use was not read there how far its weight may be off.

        A period's CPU time is a count, the job's against every process's over the same
        stretch: a job whose period covers the piece gets that period's ratio (all the jobs'
        ratios scaled down where they add up to more than the host). What they leave goes to
        the jobs whose use was not read there: one read elsewhere at its nearest period's
        ratio, at most all that is left; one never read an equal part of the rest (all of the
        piece where no active job's use was read: the equal rule); then to no job. An
        estimated weight lay anywhere between none and all that the jobs read there left: it
        may be off by the farther of the two."""
        self.coarse = {}
        parts: dict[str, float] = {}
        near: dict[str, float] = {}
        unknown: list[str] = []
        for w in active:
            user = self._user_of.get(w.job_id)
            if user is None:
                unknown.append(w.job_id)
            elif (u := user.timeline.at(a, b)) is not None:
                parts[w.job_id] = u.fraction
                if u.spread > 0:
                    self.coarse[w.job_id] = u.spread
            else:
                near[w.job_id] = user.timeline.nearest(b).fraction
        read = math.fsum(parts.values())
        if read > 1.0:
            parts = {j: w / read for j, w in parts.items()}
        room = max(0.0, 1.0 - math.fsum(parts.values()))
        wanted = math.fsum(near.values())
        parts.update({j: w * (min(1.0, room / wanted) if wanted > 0 else 1.0) for j, w in near.items()})
        left = max(0.0, 1.0 - math.fsum(parts.values()))
        parts.update({j: left / len(unknown) for j in unknown})
        off = {j: max(parts[j], room - parts[j]) for j in [*near, *unknown]}
        weights: list[tuple[str | None, float]] = [(j, w) for j, w in parts.items() if w > 0]
        return [*weights, (None, max(0.0, 1.0 - math.fsum(w for _, w in weights)))], off

    def bounds(self, pieces: Sequence[Piece]) -> dict[str, float]:
        """Each window's term (J, see the module doc) over the channel's ``pieces`` in time
        order. In a piece of an unsteady period (of any job), a job whose window is open there
        may have had any weight between its weights on the pieces just outside that period
        (the processes before and after the change): its term there is the piece's energy x
        how far its weight is from the farther of the two. Where its window is not open on
        one side (the job's first or last period, or a piece no job's use covers: its weights
        are claims', no measure of use), that side's weight is what it would have been with
        the job's processes not yet there or gone: all of the piece where nothing else shared
        it, else none. A piece in several unsteady periods counts once, at the largest."""
        starts = [p[0] for p in pieces]
        worst: dict[tuple[int, int], tuple[float, str]] = {}  # (piece, job's timeline) -> (weight off, window)
        unsteady = [
            u
            for user in self._users.values()
            for u in user.timeline.intervals
            if (not u.steady if self._rates else u.edge)
        ]
        for u in unsteady:
            first, end = bisect.bisect_left(starts, u.start_ns), bisect.bisect_left(starts, u.end_ns)
            before = self._by_user(pieces[first - 1]) if first > 0 and pieces[first - 1][1] == u.start_ns else {}
            after = self._by_user(pieces[end]) if end < len(pieces) and pieces[end][0] == u.end_ns else {}
            for i in range(first, end):
                for key, (w, window) in self._by_user(pieces[i]).items():
                    alone = 1.0 if w >= 1.0 - 1e-9 else 0.0
                    sides = (side[key][0] if key in side else alone for side in (before, after))
                    off = max(abs(w - side) for side in sides)
                    if off > worst.get((i, key), _NONE)[0]:
                        worst[(i, key)] = (off, window)
        out: dict[str, float] = defaultdict(float)
        for (i, _), (off, window) in worst.items():
            out[window] += off * pieces[i][2]
        return dict(out)

    def _by_user(self, piece: Piece) -> dict[int, tuple[float, str]]:
        """Per job's timeline, its part of ``piece`` and its window there, for the jobs whose
        windows are open on it (part 0 where they got none)."""
        out: dict[int, tuple[float, str]] = {}
        weights = piece[3]
        for window in sorted(piece[4]):
            user = self._user_of.get(window)
            if user is None:
                continue
            w = weights.get(window, 0.0)
            part, best = out.get(id(user), (0.0, ""))
            out[id(user)] = (part + w, window if not best or w > weights.get(best, 0.0) else best)
        return out


_NONE = (0.0, "")
#: A piece of a channel as :meth:`UseSplit.bounds` reads it: ``(start_ns, end_ns, energy_j,
#: window id -> its part of the piece (0..1), the ids of the windows open on it)``; a piece no
#: job's use covers has neither.
Piece = tuple[int, int, float, Mapping[str, float], frozenset[str]]


def _clip(user: _User, lo: int, hi: int) -> tuple[int, int] | None:
    """``(lo, hi]`` within the user's span, None when they do not meet."""
    lo, hi = max(lo, user.start_ns), min(hi, user.end_ns)
    return (lo, hi) if lo < hi else None
