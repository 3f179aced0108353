"""A serving process's work counted from its own Prometheus metrics, as wattline counts energy
counters: the holder of a service (``wattline run``, the agent for a pod or a unit) scrapes the
server every few seconds and passes each scrape here; what is counted goes on as the job's units.

Public surface::

    specs    parse_unit(line, by=()) / parse_latency(line, by=()) -> Spec, PRESETS, preset(name)
             (:mod:`wattline.served_specs`: the one-line grammar and the known servers)
    fetch    scrape(url, timeout_s, max_bytes=MAX_BYTES) -> str; ScrapeError
             (:mod:`wattline.served_scrape`)
    count    counters = ServedCounters(unit_specs, latency_specs, start_ns=..., started_server=False)
             counters.update(text, now_ns) -> Reading     (ScrapeError: unparsable, nothing changed)
             counters.failed(now_ns, reason) -> Gap | None
             quantile(q, later, earlier=None) -> float | None

A holder's loop::

    try:
        reading = counters.update(scrape(url, timeout_s), time.time_ns())
    except ScrapeError as exc:
        counters.failed(time.time_ns(), str(exc))

The rules, per raw series (one sample's name and labels; a histogram's labels without ``le``):

- At the first good scrape a series is a baseline (the server counted it before we watched), its
  units 0, unless the holder started the server (``started_server``: all its counts are ours) or
  the series' ``_created`` is at or after ``start_ns`` (wall-clock ns): then it counts from 0.
- A series that first appears later was born since: it counts from 0.
- A value that goes down, a ``_created`` that changes, or a histogram whose buckets change is a
  reset (the server restarted): the units are the new values, what it counted since.
- A NaN, infinite or negative value, a gauge named as a counter, a histogram that is incomplete or
  not cumulative, a series exposed twice: refused for that scrape, never counted (the next good
  value is taken against the last good one).
- A failed scrape counts nothing; the next good scrape's difference covers the gap, and its
  reading carries the :class:`Gap`: a restart hidden in it (a counter back past its old value
  without ``_created``) cannot be seen, so its units are uncertain.

Series are summed into what the specs count: per unit spec and value of its ``by`` labels, the
units since the previous reading and the total since counting began; per latency spec, ``by``
value and bucket layout, the running totals of each bucket, ``_sum`` and ``_count``.
Every reading says what happened in :class:`Note` lines the caller can forward.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from wattline.served_scrape import ScrapeError
from wattline.served_specs import Spec
from wattline.text import one_line

Labels = tuple[tuple[str, str], ...]
#: A raw series: (sample name, or a histogram's base name; its labels, sorted, without ``le``).
SeriesKey = tuple[str, Labels]
#: Note kinds: what happened to a series, or to the scrapes.
BASELINE, COUNTED, APPEARED, RETURNED, RESET, REFUSED, GAP = (
    "baseline",
    "counted",
    "appeared",
    "returned",
    "reset",
    "refused",
    "gap",
)
#: Family types a unit may be read from: a counter, a histogram's or summary's _sum and _count,
#: or a series the server did not type.
_COUNTING_TYPES = ("counter", "histogram", "summary", "untyped", "unknown")


@dataclass(frozen=True, slots=True)
class Note:
    """Something a reading saw: ``kind`` (one of the kinds above), ``message`` one line naming it."""

    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class Gap:
    """Scrapes that failed between two good ones: the units of the reading at ``end_ns`` cover
    ``start_ns``..``end_ns`` (None: still failing) and may miss a restart hidden in it."""

    start_ns: int
    end_ns: int | None
    reason: str
    failures: int


@dataclass(frozen=True, slots=True)
class UnitCount:
    """A unit series: ``units`` since the previous reading, ``total`` since counting began."""

    kind: str
    labels: dict[str, str]
    units: float
    total: float


@dataclass(frozen=True, slots=True)
class LatencyTotals:
    """A latency series' running totals since counting began: each bucket's cumulative count by
    its bound (``le``, ascending, +Inf last), its ``_sum`` and ``_count``."""

    name: str
    labels: dict[str, str]
    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float


@dataclass(frozen=True, slots=True)
class Reading:
    """One good scrape, counted."""

    time_ns: int
    units: tuple[UnitCount, ...]
    latencies: tuple[LatencyTotals, ...]
    notes: tuple[Note, ...]
    gap: Gap | None = None


@dataclass(frozen=True, slots=True)
class _Seen:
    """A raw series in one scrape: its values (a counter's one; a histogram's buckets, sum,
    count), bucket bounds (a counter: none), ``_created`` (seconds), or why it is refused."""

    values: tuple[float, ...]
    bounds: tuple[float, ...] = ()
    created: float | None = None
    refused: str | None = None


@dataclass(slots=True)
class _Exposition:
    """A scrape's samples by name and labels, the type of each name's family, and the samples
    exposed twice."""

    samples: dict[str, dict[Labels, float]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    twice: set[tuple[str, Labels]] = field(default_factory=set)

    def value(self, name: str, labels: Labels) -> float | None:
        return self.samples.get(name, {}).get(labels)


class ServedCounters:
    """Counts the units and latency histograms named by specs across scrapes of one server."""

    def __init__(
        self, units: Sequence[Spec], latencies: Sequence[Spec] = (), *, start_ns: int, started_server: bool = False
    ) -> None:
        for what, specs in (("unit kind", units), ("latency name", latencies)):
            names = [spec.name for spec in specs]
            if len(set(names)) < len(names):
                raise ValueError(f"a {what} is named twice: {', '.join(names)}")
        self.units, self.latencies = tuple(units), tuple(latencies)
        self.start_ns, self.started_server = start_ns, started_server
        self.gap: Gap | None = None  #: the open gap: scrapes failing since the last good one
        self._last_ns: int | None = None  # the last good scrape
        self._clock: int | None = None  # the last call's time
        self._raw: dict[SeriesKey, _Seen] = {}
        self._absent: set[SeriesKey] = set()
        self._early: set[SeriesKey] = set()  # refused at the first scrape: there before we watched
        self._unit_totals: dict[tuple[str, Labels], float] = {}
        self._latency_totals: dict[tuple[str, Labels, tuple[float, ...]], list[float]] = {}

    def update(self, text: str, now_ns: int) -> Reading:
        """Counts one scrape's exposition (text format 0.0.4, or OpenMetrics ending ``# EOF``);
        :class:`ScrapeError` when it cannot be parsed, with nothing changed."""
        exposition = _parse(text)
        self._advance(now_ns)
        notes: list[Note] = []
        first = self._last_ns is None
        units = dict.fromkeys(self._unit_totals, 0.0)
        steps: dict[SeriesKey, tuple[float, ...] | None] = {}
        for spec, key, seen in self._observed(exposition):
            if key not in steps:
                steps[key] = self._step(key, seen, first, notes)
            step = steps[key]
            if step is None:
                continue
            labels = spec.split(dict(key[1]))
            if seen.bounds:
                totals = self._latency_totals.setdefault((spec.name, labels, seen.bounds), [0.0] * len(step))
                totals[:] = [t + s for t, s in zip(totals, step, strict=True)]
            else:
                units[spec.name, labels] = units.get((spec.name, labels), 0.0) + step[0]
        self._absent = set(self._raw) - set(steps)
        for key, count in units.items():
            self._unit_totals[key] = self._unit_totals.get(key, 0.0) + count
        gap = None if self.gap is None else replace(self.gap, end_ns=now_ns)
        if gap is not None:
            notes.append(Note(GAP, _gap_message(gap)))
        self.gap, self._last_ns = None, now_ns
        return Reading(now_ns, self._unit_counts(units), self._latency_readings(), tuple(notes), gap)

    def failed(self, now_ns: int, reason: str) -> Gap | None:
        """A scrape at ``now_ns`` that failed for ``reason``: nothing is counted, the gap is kept
        for the next good reading and returned; None before the first good scrape (no units yet)."""
        self._advance(now_ns)
        if self._last_ns is None:
            return None
        if self.gap is None:
            self.gap = Gap(self._last_ns, None, one_line(reason), 1)
        else:
            self.gap = replace(self.gap, failures=self.gap.failures + 1)
        return self.gap

    def _advance(self, now_ns: int) -> None:
        if self._clock is not None and now_ns <= self._clock:
            raise ValueError(f"scrape times must increase: {now_ns} ns after {self._clock} ns")
        self._clock = now_ns

    def _observed(self, exposition: _Exposition) -> Iterator[tuple[Spec, SeriesKey, _Seen]]:
        """Every raw series a spec selects: (spec, series, what the scrape shows of it)."""
        for spec in self.units:
            for name in _counter_names(spec.metric):
                for labels, value in exposition.samples.get(name, {}).items():
                    if spec.selects(dict(labels)):
                        yield spec, (name, labels), _counter_seen(exposition, name, labels, value)
        for spec in self.latencies:
            for labels, seen in _histograms(exposition, spec.metric).items():
                if spec.selects(dict(labels)):
                    yield spec, (spec.metric, labels), seen

    def _step(self, key: SeriesKey, seen: _Seen, first: bool, notes: list[Note]) -> tuple[float, ...] | None:
        """What one raw series counted since the previous reading (None: refused), by the rules above."""
        series = _series_name(key)
        if seen.refused is not None:
            notes.append(Note(REFUSED, f"{series}: {seen.refused}; not counted"))
            if first:
                self._early.add(key)
            return None
        before = self._raw.get(key)
        self._raw[key] = seen
        if before is None:
            first = first or key in self._early
            self._early.discard(key)
            ours = self.started_server or (seen.created is not None and seen.created * 1e9 >= self.start_ns)
            if first and not ours:
                notes.append(Note(BASELINE, f"{series}: counted before we watched; taken as the baseline"))
                return tuple(0.0 for _ in seen.values)
            kind, why = (COUNTED, "ours from the start") if first else (APPEARED, "appeared since")
            notes.append(Note(kind, f"{series}: {why}; counted from 0"))
            return seen.values
        if key in self._absent:
            notes.append(Note(RETURNED, f"{series}: back after scrapes without it; a restart meanwhile may be unseen"))
        reset = (
            "its buckets changed"
            if seen.bounds != before.bounds
            else "it went down"
            if any(now < then for now, then in zip(seen.values, before.values, strict=True))
            else "its _created changed"
            if None not in (seen.created, before.created) and seen.created != before.created
            else None
        )
        if reset is not None:
            notes.append(Note(RESET, f"{series}: reset ({reset}); counted from 0 again"))
            return seen.values
        return tuple(now - then for now, then in zip(seen.values, before.values, strict=True))

    def _unit_counts(self, units: dict[tuple[str, Labels], float]) -> tuple[UnitCount, ...]:
        return tuple(
            UnitCount(kind, dict(labels), units[kind, labels], total)
            for (kind, labels), total in self._unit_totals.items()
        )

    def _latency_readings(self) -> tuple[LatencyTotals, ...]:
        return tuple(
            LatencyTotals(name, dict(labels), tuple(zip(bounds, totals[:-2], strict=True)), totals[-2], totals[-1])
            for (name, labels, bounds), totals in self._latency_totals.items()
        )


def quantile(q: float, later: LatencyTotals, earlier: LatencyTotals | None = None) -> float | None:
    """The ``q`` quantile (0 < q <= 1) of the observations between two readings of one latency
    series (``earlier`` None: since counting began), as Prometheus' histogram_quantile computes
    it: linear within the bucket it falls in (from 0 in the lowest), the last finite bound when
    it falls in +Inf's. None when there were no observations or no finite bucket."""
    if not 0 < q <= 1:
        raise ValueError(f"a quantile is in (0, 1], got {q}")
    bounds = [le for le, _ in later.buckets]
    counts = [count for _, count in later.buckets]
    if earlier is not None:
        if [le for le, _ in earlier.buckets] != bounds:
            raise ValueError(f"{later.name}: the two readings' buckets differ; a quantile needs one layout")
        counts = [now - then for now, (_, then) in zip(counts, earlier.buckets, strict=True)]
    for i in range(1, len(counts)):  # cumulative, as Prometheus forces it: a torn scrape may dent it
        counts[i] = max(counts[i], counts[i - 1])
    if len(counts) < 2 or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    at = next(i for i, count in enumerate(counts) if count >= rank)
    if at == len(counts) - 1:
        return bounds[-2]
    if at == 0 and bounds[0] <= 0:
        return bounds[0]
    low, below = (bounds[at - 1], counts[at - 1]) if at else (0.0, 0.0)
    return low + (bounds[at] - low) * (rank - below) / (counts[at] - below)


def _parse(text: str) -> _Exposition:
    """Every sample of an exposition; :class:`ScrapeError` when the parser cannot read it."""
    parse = openmetrics_families if text.rstrip().endswith("# EOF") else text_families
    exposition = _Exposition()
    try:  # the parsers raise ValueError, IndexError, ... on text they cannot read
        for family in parse(text):
            for sample in family.samples:
                labels = tuple(sorted(sample.labels.items()))
                exposition.types[sample.name] = family.type
                named = exposition.samples.setdefault(sample.name, {})
                if labels in named:
                    exposition.twice.add((sample.name, labels))
                named[labels] = sample.value
    except Exception as exc:
        raise ScrapeError(f"unparsable exposition: {one_line(str(exc)) or type(exc).__name__}") from None
    return exposition


def _counter_names(metric: str) -> tuple[str, ...]:
    """The sample names a unit's METRIC is read from: the parsers name a counter exposed as
    ``x`` (Triton's, TGI's) ``x_total``."""
    return (metric,) if metric.endswith("_total") else (metric, metric + "_total")


def _created_name(sample: str) -> str:
    for suffix in ("_total", "_sum", "_count"):
        if sample.endswith(suffix):
            return sample.removesuffix(suffix) + "_created"
    return sample + "_created"


def _created(exposition: _Exposition, name: str, labels: Labels) -> float | None:
    created = exposition.value(name, labels)
    return created if created is not None and math.isfinite(created) else None


def _counter_seen(exposition: _Exposition, name: str, labels: Labels, value: float) -> _Seen:
    kind = exposition.types.get(name, "untyped")
    refused = (
        f"a {kind}, not a counter"
        if kind not in _COUNTING_TYPES
        else "exposed twice"
        if (name, labels) in exposition.twice
        else _bad_value(value)
    )
    return _Seen((value,), created=_created(exposition, _created_name(name), labels), refused=refused)


def _histograms(exposition: _Exposition, metric: str) -> dict[Labels, _Seen]:
    """Each histogram series of ``metric`` by its labels without ``le``."""
    buckets: dict[Labels, list[tuple[float, float]]] = {}
    refused: dict[Labels, str] = {}
    for labels, count in exposition.samples.get(metric + "_bucket", {}).items():
        rest = tuple(pair for pair in labels if pair[0] != "le")
        if (metric + "_bucket", labels) in exposition.twice:
            refused[rest] = "a bucket exposed twice"
        try:
            buckets.setdefault(rest, []).append((float(dict(labels)["le"]), count))
        except (KeyError, ValueError):
            refused[rest] = "a bucket without a numeric le"
    found: dict[Labels, _Seen] = {}
    for labels, pairs in buckets.items():
        pairs.sort()
        total, observed = (exposition.value(metric + part, labels) for part in ("_sum", "_count"))
        kind = exposition.types.get(metric + "_bucket", "")
        problem = refused.get(labels) or _histogram_problem(kind, pairs, total, observed)
        values = (*(count for _, count in pairs), total or 0.0, observed or 0.0)
        created = _created(exposition, metric + "_created", labels)
        found[labels] = _Seen(values, tuple(le for le, _ in pairs), created, problem)
    return found


def _histogram_problem(
    kind: str, pairs: list[tuple[float, float]], total: float | None, observed: float | None
) -> str | None:
    """Why a histogram series cannot be counted (its (le, count) pairs sorted, its _sum and
    _count); None when it can."""
    if kind not in ("histogram", "untyped", "unknown"):
        return f"a {kind}, not a histogram"
    if pairs[-1][0] != math.inf or total is None or observed is None:
        return "incomplete: no +Inf bucket, _sum or _count"
    if any(lower[1] > upper[1] for lower, upper in itertools.pairwise(pairs)):
        return "its buckets are not cumulative"
    return next(filter(None, map(_bad_value, (*(count for _, count in pairs), total, observed))), None)


def _bad_value(value: float) -> str | None:
    return None if 0 <= value < math.inf else f"its value {value} is not a finite count >= 0"


def _series_name(key: SeriesKey) -> str:
    name, labels = key
    return name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else "")


def _gap_message(gap: Gap) -> str:
    seconds = ((gap.end_ns or gap.start_ns) - gap.start_ns) / 1e9
    return (
        f"{gap.failures} scrape(s) failed over {seconds:.1f} s ({gap.reason}): this reading's units cover the gap, "
        "and a restart within it cannot be seen"
    )
