"""The bound of one channel's energy in one window, from the samples a report read.

Two ways, matching how :mod:`wattline.reports.build` reads energy (the terms are :mod:`.uncertainty`'s):

* :func:`edge_bound`: from the samples at the window's two edges only (the cumulative
  counter's difference), so the bound costs no more for a long job than for a short one;
  a stretch between two samples of one stream whose energy the store lacks is an edge
  piece like a sample, and time before the first or after the last sample is a gap. An
  unhealthy (0 J) sample strictly inside the window is not read this way, so not bounded.
* :func:`samples_bound`: from every sample of the window (restarts, shared hosts): a stretch
  between two samples of one stream whose energy the store lacks is bridged by the stream's
  counter (:mod:`.streams`), an edge piece like a sample; every other uncovered stretch
  (:func:`uncovered`) and every unhealthy sample is a gap.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from wattline.accounting.uncertainty import Bound, edge_term, facts, quality_terms
from wattline.accounting.window_energy import Interval, overlap
from wattline.quality import Quality
from wattline.stores.reader import StoredSample
from wattline.units import NS_PER_S

__all__ = [
    "LAG_HORIZON_NS",
    "Gaps",
    "counter_step_s",
    "edge_bound",
    "edge_power_w",
    "p_max_w",
    "samples_bound",
    "uncovered",
]

#: A piece of a channel's timeline: (start_ns, end_ns, energy_j, healthy); energy None: no
#: sample covers it.
Piece = tuple[int, int, float | None, bool]
_FAR = 2**62
#: A series whose last sample ended this long before a window is gone (a device removed), not
#: late: the time after it is no gap. (The report's incomplete notes use the same horizon.)
LAG_HORIZON_NS = 3600 * 10**9


def _powers(samples: Iterable[StoredSample | Interval | None], step_s: float = 0.0) -> list[float]:
    """Each sample's mean power. A counter that advances every ``step_s`` shows a sample the
    energy of whole steps: one shorter than a step holds at most one, drawn over a whole step,
    so its power is its energy over ``step_s``; one longer holds at most one step more than its
    length. Either way at most twice the true power, however short the sample (a sampler that
    catches up after a stall reads some a few ms apart)."""
    floor_ns = step_s * NS_PER_S
    return [
        s.energy_j * NS_PER_S / max(s.end_ns - s.start_ns, floor_ns)
        for s in samples
        if s is not None and s.end_ns > s.start_ns
    ]


def counter_step_s(series: tuple[str, str]) -> float:
    """How often the counter of ``series`` (source, quality) advances; 0 for power readings and models."""
    source, quality = series
    return facts(source).update_s if quality == Quality.COUNTER else 0.0


def p_max_w(
    samples: Iterable[StoredSample | Interval | None], energy_j: float, seconds: float, step_s: float = 0.0
) -> float:
    """The channel's plausible maximum power: the highest mean power among ``samples`` (a
    counter's advancing every ``step_s`` taken into account) and the window's."""
    return max([energy_j / seconds if seconds > 0 else 0.0, *_powers(samples, step_s)])


def edge_power_w(around: Iterable[StoredSample | Interval | None], interior_w: float, step_s: float = 0.0) -> float:
    """The highest power inside a sample straddling an edge: the highest mean power of the
    samples ``around`` the edge plus how much they differ (a trend between them goes on inside
    the straddling one), and at least the mean power of the window's interior."""
    powers = _powers(around, step_s)
    return max(2 * max(powers) - min(powers) if powers else 0.0, interior_w)


Around = Sequence[StoredSample | Interval | None]


#: Where a window's ``gaps`` term lies: (start_ns, end_ns, joules) per stretch without a good sample.
Gaps = list[tuple[int, int, float]]


def _edge_terms(
    pieces: Sequence[tuple[Piece, Around]], window: tuple[int, int, float], p_max: float, gaps: Gaps, step: float
) -> Bound:
    """Edge and gap terms of the pieces a window covers in part, each with the samples around it
    (the gap stretches also to ``gaps``)."""
    t0, t1, energy = window
    parts = [(p, around, inside) for p, around in pieces if (inside := min(p[1], t1) - max(p[0], t0)) > 0]
    apportioned = sum(p[2] * inside / (p[1] - p[0]) for p, _, inside in parts if p[2] is not None and p[3])
    interior_ns = t1 - t0 - sum(inside for *_, inside in parts)
    interior_w = (energy - apportioned) * NS_PER_S / interior_ns if interior_ns > 0 else energy * NS_PER_S / (t1 - t0)
    bound = Bound()
    for (start, end, e, healthy), around, inside in parts:
        if e is None or not healthy:
            bound = bound + Bound(gaps_j=p_max * inside / NS_PER_S)
            gaps.append((max(start, t0), min(end, t1), p_max * inside / NS_PER_S))
        else:
            bound = bound + Bound(edges_j=edge_term(start, end, e, inside, edge_power_w(around, interior_w, step)))
    return bound


def _edge_piece(before: StoredSample | None, after: StoredSample | None, t: int, t0: int, t1: int) -> Piece | None:
    """The piece of the timeline straddling ``t`` (an edge of the window ``[t0, t1]``), if any.
    A series whose samples start after the window, or ended long before it, has none."""
    if after is None:  # nothing after: uncovered, unless long gone
        return None if before is None or before.end_ns <= t0 - LAG_HORIZON_NS else (before.end_ns, _FAR, None, True)
    if before is None and after.start_ns >= t1:
        return None  # the series begins after the window
    if after.start_ns < t:
        return (after.start_ns, after.end_ns, after.energy_j, after.healthy)
    if after.start_ns == t:
        return None
    if before is not None and before.stream == after.stream:  # samples the store lacks: energy spread
        lost = after.cumulative_j - after.energy_j - before.cumulative_j
        return (before.end_ns, after.start_ns, max(lost, 0.0), True)
    return (before.end_ns if before is not None else -_FAR, after.start_ns, None, True)  # uncovered


def edge_bound(
    series: tuple[str, str],
    at_t0: tuple[StoredSample | None, StoredSample | None],
    at_t1: tuple[StoredSample | None, StoredSample | None],
    window: tuple[int, int, float],
    gaps: Gaps | None = None,
) -> Bound:
    """Bound of a channel (``series``: source, quality) in ``window`` (t0, t1, energy_j) from
    the samples ``(last ending at or before t, first ending after t)`` at each edge; where its
    ``gaps`` term lies goes to ``gaps``. A source's own per-sample bound (``energy_error_j``)
    needs every sample: :func:`samples_bound`."""
    source, quality = series
    t0, t1, energy = window
    if t1 <= t0:
        return Bound()
    p_max = p_max_w([*at_t0, *at_t1], energy, (t1 - t0) / NS_PER_S, counter_step_s(series))
    bound = quality_terms(source, quality, energy, p_max, None)
    pieces: dict[tuple[int, int], tuple[Piece, Around]] = {}
    for before, after, t in ((*at_t0, t0), (*at_t1, t1)):
        piece = _edge_piece(before, after, t, t0, t1)
        if piece is not None:
            pieces.setdefault(piece[:2], (piece, (before, after)))
    return bound + _edge_terms(
        list(pieces.values()), window, p_max, [] if gaps is None else gaps, counter_step_s(series)
    )


def samples_bound(
    series: tuple[str, str],
    raw: Sequence[StoredSample],
    merged: Sequence[Interval],
    window: tuple[int, int, float],
    gaps: Gaps | None = None,
) -> Bound:
    """Bound of a channel in ``window`` (t0, t1, energy_j) from all its samples: ``raw`` as
    stored, ``merged`` counted once across streams (:mod:`.streams`); where its ``gaps`` term
    lies goes to ``gaps``."""
    source, quality = series
    t0, t1, energy = window
    if t1 <= t0:
        return Bound()
    near = [s for s in raw if s.end_ns > t0 and s.start_ns < t1]
    # and the last sample before the window, as edge_bound reads it
    prior = max((s for s in raw if s.end_ns <= t0 and s.healthy), key=lambda s: s.end_ns, default=None)
    healthy = [s for s in [*near, prior] if s is not None and s.healthy]
    p_max = p_max_w(healthy, energy, (t1 - t0) / NS_PER_S, counter_step_s(series))
    errors = [_overlap(s, t0, t1) * (s.energy_error_j or 0.0) for s in near if s.energy_error_j is not None]
    bound = quality_terms(source, quality, energy, p_max, sum(errors) if errors else None)
    failed = [(max(s.start_ns, t0), min(s.end_ns, t1)) for s in near if not s.healthy and s.end_ns > s.start_ns]
    pieces: list[tuple[Piece, Around]] = []
    for n, iv in enumerate(merged):
        inside = min(iv.end_ns, t1) - max(iv.start_ns, t0)
        if inside <= 0:
            continue
        if iv.start_ns < t0 or iv.end_ns > t1:
            # around it, as edge_bound reads them: the one before and itself; a bridged stretch's
            # samples on both sides
            around = merged[max(n - 1, 0) : n + 2 : 2] if iv.bridged else merged[max(n - 1, 0) : n + 1]
            pieces.append(((iv.start_ns, iv.end_ns, iv.energy_j, True), around))
    out: Gaps = [] if gaps is None else gaps
    bound = bound + _edge_terms(pieces, window, p_max, out, counter_step_s(series))
    stretches = [*uncovered(raw, merged, t0, t1), *failed]
    out += [(a, b, p_max * (b - a) / NS_PER_S) for a, b in stretches]
    return bound + Bound(gaps_j=p_max * sum(b - a for a, b in stretches) / NS_PER_S)


def uncovered(raw: Sequence[StoredSample], merged: Sequence[Interval], t0: int, t1: int) -> list[tuple[int, int]]:
    """The stretches of ``[t0, t1]`` that no interval of ``merged`` (never overlapping, ordered
    by end; bridged stretches included) covers, each a gap: where the series is there at all
    (``raw``: a sample starting before ``t1``, and one ending within :data:`LAG_HORIZON_NS`
    before ``t0`` or later)."""
    if not raw or min(s.start_ns for s in raw) >= t1 or max(s.end_ns for s in raw) <= t0 - LAG_HORIZON_NS:
        return []
    out: list[tuple[int, int]] = []
    at = t0
    for iv in merged:
        if iv.end_ns <= at or iv.end_ns == iv.start_ns:
            continue
        if iv.start_ns >= t1:
            break
        if iv.start_ns > at:
            out.append((at, iv.start_ns))
        at = iv.end_ns
    if at < t1:
        out.append((at, t1))
    return out


def _overlap(s: StoredSample, t0: int, t1: int) -> float:
    """Fraction of sample ``s`` inside ``[t0, t1]``."""
    inside, length = overlap(s.start_ns, s.end_ns, t0, t1)
    return inside / length
