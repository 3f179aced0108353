"""What reports read from an engine that serves the Prometheus HTTP API (VictoriaMetrics,
Prometheus, Grafana Mimir, Thanos): the :class:`~.reader.Reader` queries over the layout of
:mod:`.victoria_points`, through the raw samples its :class:`~.series_api.SeriesApi` reads
(VictoriaMetrics: ``/api/v1/export``; the others: range selectors at an instant).

A report asks for the samples around an instant: they are read from a window of
:data:`NEAR_NS` on each side (a live agent samples far more often), and only a channel
that has no sample there on one side is looked for further (:meth:`.SeriesApi.edges`, the
time stamp of its last or first sample within 31 days), so a read's cost does not grow
with the job's length. A field's series are joined back into points by labels and time
stamp; energy channels merge their streams (the ``stream`` label) as a report's series.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from wattline.stores.base import JobSummary
from wattline.stores.reader import (
    StoredJobEvent,
    StoredSample,
    UnitCuts,
    evidence_ns,
    heard,
    jobs_near,
    reduce_units,
    units_from_totals,
)
from wattline.stores.schema import (
    ENERGY,
    JOB_EVENTS,
    JOB_SUMMARY,
    JOB_SUMMARY_HOST,
    KIND_UNITS,
    SEQ_BLOCK,
    unit_fields,
)
from wattline.stores.series.api import Points, QueryError, SeriesApi, quote
from wattline.stores.series.points import (
    BOOLS,
    DURATION_NS,
    EMPTY,
    HIGH,
    INT_FIELDS,
    LOW,
    MS,
    SEQ_LOW,
    SUB_NS,
    SUMMARY_BOOLS,
    TIME_MS,
    summary_value,
)

#: How far around an instant samples are read at once.
NEAR_NS = 60 * 10**9
#: How far beyond the near window a channel's edge sample is looked for (as reports look
#: for jobs: docs/storage.md).
FAR_NS = 31 * 86400 * 10**9
_ENERGY_FIELDS = ("energy_j", "cumulative_j", SUB_NS, DURATION_NS, "healthy", "utilization", "energy_error_j")
_ENERGY = f'__name__=~"{ENERGY}_({"|".join((*_ENERGY_FIELDS, "neuroncores_per_device"))})"'
#: The labels of a job event that are not its fields.
_EVENT_LABELS = frozenset({"host", "job_id", "event", "event_seq", "seq_block", EMPTY})


class SeriesReads:
    """The queries of :class:`~.victoria.VictoriaStore` and :class:`~.prometheus.PrometheusStore`,
    over the raw samples of their :attr:`_api`."""

    url: str
    _api: SeriesApi
    #: Seconds a reader may wait for what the engine acknowledged to be searchable: a new
    #: series (a job's open and close among them) shows on VictoriaMetrics a moment later
    #: (:class:`~.series_api.Export`), more on a loaded server (0 where a write shows at once).
    search_lag_s = 15.0
    #: Why (a reader says so where what it shows may be that old).
    search_lag_why = "VictoriaMetrics shows a new series, such as a job's open or close, up to 15 s after it took it"

    # -- samples --------------------------------------------------------------------------

    def _samples(self, host: str, lo_ns: int, hi_ns: int, matcher: str = "") -> list[StoredSample]:
        """Samples of ``host`` (and ``matcher``) whose end is in [lo_ns, hi_ns]."""
        found = self._api.raw([f"{{{_ENERGY},host={quote(host)}{matcher}}}"], lo_ns, hi_ns).get(ENERGY, {})
        return [s for s in _stored(host, found) if lo_ns <= s.end_ns <= hi_ns]

    def _beyond(self, host: str, t_ns: int, before: bool, want: Collection[tuple[str, ...]]) -> list[StoredSample]:
        """Per channel of ``want`` (a series' labels, its stream included): its last sample ending
        at or before ``t_ns`` (``before``), else its first ending at or after, within :data:`FAR_NS`."""
        selector = f"{ENERGY}_{SUB_NS}{{host={quote(host)}}}"
        edges = self._api.edges(selector, t_ns, before, FAR_NS)
        spans = {(lo, hi) for labels, lo, hi in edges if _channel(labels) in want}
        found = [s for lo, hi in sorted(spans) for s in self._samples(host, lo, hi) if _key(s) in want]
        edge: dict[tuple[str, ...], StoredSample] = {}
        for s in found:
            if (s.end_ns <= t_ns) if before else (s.end_ns >= t_ns):
                have = edge.get(_key(s))
                if have is None or (s.end_ns > have.end_ns if before else s.end_ns < have.end_ns):
                    edge[_key(s)] = s
        return list(edge.values())

    def samples(self, host: str, start_ns: int, end_ns: int) -> list[StoredSample]:
        found = [s for s in self._samples(host, start_ns, end_ns + NEAR_NS) if s.end_ns > start_ns]
        last: dict[tuple[str, ...], int] = {}
        for s in found:
            last[_key(s)] = max(last.get(_key(s), s.end_ns), s.end_ns)
        short = {key for key, end in last.items() if end < end_ns}  # may span past the window
        found += self._beyond(host, end_ns + NEAR_NS, False, short) if short else []
        return sorted((s for s in found if s.start_ns < end_ns), key=lambda s: s.end_ns)

    def first_after(self, host: str, t_ns: int) -> list[StoredSample]:
        return self.around(host, [t_ns])[0][1]

    def last_before(self, host: str, t_ns: int) -> list[StoredSample]:
        return self.around(host, [t_ns])[0][0]

    def around(self, host: str, instants: Sequence[int]) -> list[tuple[list[StoredSample], list[StoredSample]]]:
        """The samples within :data:`NEAR_NS` of every instant (one export per cluster of
        instants); a channel the store knows that has none on one side is looked for further."""
        if not instants:
            return []
        near: list[StoredSample] = []
        for lo, hi in _merged((t - NEAR_NS, t + NEAR_NS) for t in instants):
            near += self._samples(host, lo, hi)
        known = self._channels(host, min(instants) - FAR_NS, max(instants) + FAR_NS)
        out = []
        for t in instants:
            before = [s for s in near if s.end_ns <= t]
            after = [s for s in near if s.end_ns >= t]
            lacking = [known - {_key(s) for s in side} for side in (before, after)]
            before += self._beyond(host, t, True, lacking[0]) if lacking[0] else []
            after += self._beyond(host, t, False, lacking[1]) if lacking[1] else []
            out.append((_edge(before, last=True), _edge(after, last=False)))
        return out

    def _channels(self, host: str, start_ns: int, end_ns: int) -> set[tuple[str, ...]]:
        """The channels (and streams) of ``host`` with samples in [start_ns, end_ns] (by day)."""
        found = self._api.series(f"{ENERGY}_{SUB_NS}{{host={quote(host)}}}", start_ns, end_ns)
        return {_channel(labels) for labels in found}

    # -- job events -------------------------------------------------------------------------

    def _events(
        self, matchers: Iterable[str], start_ns: int | None = None, end_ns: int | None = None
    ) -> list[StoredJobEvent]:
        selectors = [f'{{__name__=~"{JOB_EVENTS}_.+",{m}}}' for m in matchers]
        found = self._api.raw(selectors, start_ns, end_ns).get(JOB_EVENTS, {})
        events = [_event(dict(labels), ms, fields) for labels, points in found.items() for ms, fields in points.items()]
        return sorted(events, key=lambda e: (e.time_ns, e.host, e.event_seq))

    def job_events(self, job_id: str | None = None, every: bool = True) -> list[StoredJobEvent]:
        if job_id is None:
            if not every:
                raise ValueError("job_events(every=False) reads one job")
            return units_from_totals(self._events(['job_id!=""']))
        if every:
            return units_from_totals(self._events([f"job_id={quote(job_id)}"]))
        marks = self._events([f'job_id={quote(job_id)},event!~"units|heartbeat"'])
        beats: dict[str, list[StoredJobEvent]] = defaultdict(list)
        for e in self._events([f'job_id={quote(job_id)},event="heartbeat"']):
            beats[e.host].append(e)
        for host_beats in beats.values():  # when the job was first and last heard there
            marks += [host_beats[0], host_beats[-1]] if len(host_beats) > 1 else host_beats
        return sorted(marks, key=lambda e: (e.time_ns, e.host, e.event_seq))

    def unit_events(self, job_id: str, cuts: UnitCuts) -> list[StoredJobEvent]:
        return reduce_units(units_from_totals(self._events([f'job_id={quote(job_id)},event="units"'])), cuts)

    def job_events_between(self, start_ns: int, end_ns: int, hosts: Collection[str]) -> list[StoredJobEvent]:
        ids = sorted(jobs_near(self._job_ids, start_ns, end_ns, hosts))
        events: list[StoredJobEvent] = []
        for i in range(0, len(ids), 100):
            events += self._events(f'job_id={quote(j)},event=~"open|close"' for j in ids[i : i + 100])
        events += heard(events, self._last_heard, self._first_heard)
        return sorted(events, key=lambda e: (e.time_ns, e.host, e.event_seq))

    def _first_heard(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for job_id, host in pairs:
            for e in self._events([f"job_id={quote(job_id)},host={quote(host)}"]):
                out[job_id, host] = min(out.get((job_id, host), evidence_ns(e)), evidence_ns(e))
        return out

    def _job_ids(self, event: str, hosts: Collection[str], since_ns: int, until_ns: int) -> set[str]:
        matchers = [
            f"{{__name__={quote(JOB_EVENTS + '_' + SUB_NS)},event={quote(event)},host={quote(h)}}}" for h in hosts
        ]
        found = self._api.raw(sorted(matchers), max(since_ns, 0), until_ns).get(JOB_EVENTS, {})
        return {dict(labels)["job_id"] for labels, points in found.items() if points}

    def _last_heard(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for job_id, host in pairs:
            for e in self._events([f"job_id={quote(job_id)},host={quote(host)}"]):
                out[job_id, host] = max(out.get((job_id, host), e.time_ns), e.time_ns)
        return out

    # -- job summaries ----------------------------------------------------------------------

    def job_summaries_of(self, job_id: str, start_ns: int | None = None) -> list[JobSummary]:
        """Every stored ``job_summary`` point of ``job_id`` stamped from ``start_ns`` on, oldest
        first by ``computed_ns``, then stamp (more than one where the store keeps each rewrite,
        :mod:`.prometheus`, or a rewrite's delete missed a copy written a moment before,
        :mod:`.victoria`); a point's :data:`TIME_MS` field, where it has one, is the summary's time, else
        its stamp is. Reads both layouts of :mod:`.victoria_points`."""
        found = self._api.raw([f'{{__name__=~"{JOB_SUMMARY}(_host)?_.+",job_id={quote(job_id)}}}'], start_ns)
        energy: dict[int, dict[str, float]] = defaultdict(dict)
        for labels, points in found.get(JOB_SUMMARY_HOST, {}).items():
            for ms, fields in points.items():
                energy[ms][dict(labels)["host"]] = fields["energy_j"]
        out = []
        for labels, points in found.get(JOB_SUMMARY, {}).items():
            tags = dict(labels)
            del tags["job_id"]
            bools = SUMMARY_BOOLS | set(json.loads(tags.pop(BOOLS, "[]")))
            strings: dict[str, Any] = dict.fromkeys(json.loads(tags.pop(EMPTY, "[]")), "")
            strings.update((k, tags.pop(k)) for k in list(tags) if k not in ("name", "kind", "unit"))
            for ms, fields in points.items():
                summary = _summary(job_id, ms, tags, fields, bools)
                summary.fields.update(strings)
                summary.hosts.update(energy[ms])
                out.append(((summary.fields.get("computed_ns", 0), ms), summary))
        return [summary for _, summary in sorted(out, key=lambda found: found[0])]


def _summary(
    job_id: str, ms: int, tags: dict[str, str], fields: dict[str, float], bools: Collection[str]
) -> JobSummary:
    """One stamp's fields of a ``job_summary`` series as a summary (its hosts left to fill)."""
    sub = int(fields.pop(SUB_NS, 0))
    at = int(fields.pop(TIME_MS, ms))
    values: dict[str, Any] = {}
    for key, value in fields.items():
        try:
            text = summary_value(key, value)
        except ValueError as exc:
            raise QueryError(f"job {job_id[:100]!r}: {exc}") from None
        values[key] = bool(value) if key in bools else text if text is not None else _number(value)
    for key in [k[: -len(HIGH)] for k in values if k.endswith(HIGH)]:
        values[key] = values.pop(key + HIGH) * MS + values.pop(key + LOW, 0)
    return JobSummary(job_id, at * MS + sub, dict(tags), values, {})


def _number(value: float) -> float | int:
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def _channel(labels: dict[str, str]) -> tuple[str, ...]:
    return tuple(labels.get(k, "") for k in ("source", "component", "device", "quality", "stream"))


def _key(s: StoredSample) -> tuple[str, ...]:
    return (*s.series[1:], s.stream)


def _edge(samples: list[StoredSample], last: bool) -> list[StoredSample]:
    """Per report series (streams merged): the latest (``last``) or earliest sample."""
    best: dict[tuple[str, ...], StoredSample] = {}
    for s in samples:
        have = best.get(s.series)
        if have is None or (s.end_ns > have.end_ns if last else s.end_ns < have.end_ns):
            best[s.series] = s
    return list(best.values())


def _merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _stored(host: str, points: Points) -> list[StoredSample]:
    out = []
    for labels, per_time in points.items():
        tags = dict(labels)
        for ms, f in per_time.items():
            if not {"energy_j", "cumulative_j", SUB_NS, DURATION_NS} <= f.keys():
                continue  # a point of another layout (written through /api/v2/write)
            end = ms * MS + int(f[SUB_NS])
            cores = f.get("neuroncores_per_device")
            out.append(
                StoredSample(
                    host,
                    tags.get("source", ""),
                    tags.get("component", ""),
                    tags.get("device", ""),
                    tags.get("quality", ""),
                    end - int(f[DURATION_NS]),
                    end,
                    f["energy_j"],
                    f["cumulative_j"],
                    tags.get("stream", ""),
                    f.get("healthy", 1.0) != 0,
                    f.get("utilization"),
                    f.get("energy_error_j"),
                    None if cores is None else int(cores),
                )
            )
    return out


def _event(labels: dict[str, str], ms: int, fields: dict[str, float]) -> StoredJobEvent:
    """A job event from its labels and one time stamp's fields (see :mod:`.victoria_points`):
    the labels of a per-event series beyond its identity are its string fields."""
    sub = int(fields.pop(SUB_NS, 0))
    values: dict[str, Any] = {}
    if "event_seq" in labels:
        seq = int(labels["event_seq"])
        values.update(dict.fromkeys(json.loads(labels.get(EMPTY, "[]")), ""))
        values.update((k, v) for k, v in labels.items() if k not in _EVENT_LABELS)
    else:
        seq = int(labels.get("seq_block", "0")) * SEQ_BLOCK + int(fields.pop(SEQ_LOW, 0))
        values.update(unit_fields(labels) if labels.get("event") == KIND_UNITS else {})
    values.update((k, int(v) if k in INT_FIELDS else v) for k, v in fields.items())
    host, job_id, event = labels.get("host", ""), labels.get("job_id", ""), labels.get("event", "")
    return StoredJobEvent(host, job_id, event, ms * MS + sub, seq, values)
