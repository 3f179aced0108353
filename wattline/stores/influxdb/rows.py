"""InfluxDB's JSON series turned into what readers return: stored samples and job events."""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from wattline.stores.base import IntervalSummary
from wattline.stores.reader import StoredJobEvent, StoredSample, counts_from_totals, writer
from wattline.stores.schema import KIND_UNITS, SEQ_BLOCK, unit_fields


def indexes(series: dict[str, Any], *names: str) -> tuple[int, ...]:
    """Positions of ``time`` and of ``names`` in a series' columns."""
    columns = series["columns"]
    return (columns.index("time"), *(columns.index(name) for name in names))


def job_events(series_list: list[dict[str, Any]]) -> list[StoredJobEvent]:
    """Job events from ``SELECT * FROM job_events ... GROUP BY *`` (tags apart from fields).

    The event time is the ``time_ns`` field; points written before it existed have none and
    read their point time (see :data:`~wattline.stores.schema.SEQ_BLOCK`)."""
    events = []
    for series in series_list:
        tags = series["tags"]
        columns = series["columns"]
        for values in series.get("values", []):
            fields = {k: v for k, v in zip(columns, values, strict=True) if v is not None and k != "time"}
            fields.update(unit_fields(tags) if tags.get("event") == KIND_UNITS else {})
            seq = int(fields.pop("event_seq", 0))
            time_ns = int(fields.pop("time_ns", None) or values[columns.index("time")])
            events.append(
                StoredJobEvent(
                    tags.get("host", ""), tags.get("job_id", ""), tags.get("event", ""), time_ns, seq, fields
                )
            )
    return events


def unit_events(found: list[dict[str, Any]]) -> list[StoredJobEvent]:
    """UNITS events from the series of ``SELECT units, units_total, event_seq, time_ns ... GROUP BY
    host, job_id`` (``units_total`` in their fields where stored: see :func:`~.reader.units_from_totals`)."""
    events = []
    for series in found:
        tags = series["tags"]
        host, job = tags.get("host", ""), tags.get("job_id", "")
        i_time, i_units, i_seq, i_true = indexes(series, "units", "event_seq", "time_ns")
        i_total = series["columns"].index("units_total") if "units_total" in series["columns"] else None
        for v in series.get("values", []):
            fields = {} if v[i_units] is None else {"units": v[i_units]}
            if i_total is not None and v[i_total] is not None:
                fields["units_total"] = v[i_total]
            events.append(StoredJobEvent(host, job, "units", int(v[i_true] or v[i_time]), int(v[i_seq] or 0), fields))
    return events


#: Row -> its event_seq.
SeqOf = Callable[[int], int]


@dataclass(frozen=True, slots=True)
class UnitRows:
    """One host's UNITS rows as columns, ordered by (time_ns, event_seq)."""

    times: list[int]
    units: list[Any]  #: as InfluxDB gives them (None: no field)
    seq: SeqOf  #: row -> its event_seq (made only for the rows that become events)
    totals: list[Any]  #: their ``units_total`` (None: not stored)
    writers: frozenset[int]  #: who numbered them (:func:`~.reader.writer`)

    def from_totals(self) -> UnitRows:
        """These rows with each one's units from the totals (:func:`~.reader.counts_from_totals`)
        where one writer wrote them all and the totals say it; else these rows."""
        if len(self.writers) != 1 or None in self.totals:
            return self
        counts = counts_from_totals(self.units, self.totals)
        return self if counts is None else UnitRows(self.times, counts, self.seq, self.totals, self.writers)


#: One series' columns: times, units, totals, event_seq of a row, writers.
_Columns = tuple[list[int], list[Any], list[Any], SeqOf, frozenset[int]]


def _columns(series: dict[str, Any]) -> _Columns | None:
    """One series' times, units, totals, event_seq of a row and writers (see :func:`unit_rows`)."""
    columns, values = series["columns"], series.get("values", [])
    i_time, i_units, i_true = indexes(series, "units", "time_ns")
    units = list(map(operator.itemgetter(i_units), values))
    totals = list(map(operator.itemgetter(columns.index("units_total")), values)) if "units_total" in columns else []
    totals = totals or [None] * len(values)
    if "event_seq" in columns:
        i_seq = columns.index("event_seq")
        writers = frozenset(writer(int(v[i_seq] or 0)) for v in values)
        return [v[i_true] or v[i_time] for v in values], units, totals, lambda i: int(values[i][i_seq] or 0), writers
    block = series["tags"].get("seq_block", "")
    times = list(map(operator.itemgetter(i_true), values))
    if not block.isdigit() or None in times:
        return None
    base = int(block) * SEQ_BLOCK

    def seq(i: int) -> int:
        return base + int(values[i][i_time]) % SEQ_BLOCK

    if writer(base) == writer(base + SEQ_BLOCK - 1):  # the block lies in one writer's numbers
        return times, units, totals, seq, frozenset({writer(base)}) if values else frozenset()
    return times, units, totals, seq, frozenset(writer(seq(i)) for i in range(len(values)))


def unit_rows(found: list[dict[str, Any]]) -> dict[str, UnitRows] | None:
    """Per host, the UNITS rows of ``SELECT units, time_ns ... GROUP BY host, seq_block`` (the
    event_seq, not read, is the ``seq_block`` tag's million plus the point time's nanoseconds
    past its millisecond, see :data:`~.schema.SEQ_BLOCK`) or of ``SELECT units, event_seq,
    time_ns ...``. None for rows without ``seq_block`` or ``time_ns`` (an older version wrote
    them) in a series without ``event_seq``: read that too."""
    hosts: dict[str, list[_Columns]] = {}
    for series in found:
        part = _columns(series)
        if part is None:
            return None
        hosts.setdefault(series["tags"].get("host", ""), []).append(part)
    out = {}
    for host, parts in hosts.items():
        times, units, totals, seq, writers = parts[0]
        if len(parts) > 1:  # several writers (or a million events): one list of each
            times = [t for part in parts for t in part[0]]
            units = [u for part in parts for u in part[1]]
            totals = [u for part in parts for u in part[2]]
            seq = [part[3](i) for part in parts for i in range(len(part[0]))].__getitem__
            writers = frozenset().union(*(part[4] for part in parts))
        if not all(map(operator.lt, times, itertools.islice(times, 1, None))):  # out of (time, seq) order
            keys = [(t, seq(i)) for i, t in enumerate(times)]
            order = sorted(range(len(keys)), key=keys.__getitem__)
            times, units, totals = [times[k] for k in order], [units[k] for k in order], [totals[k] for k in order]
            seq = [keys[k][1] for k in order].__getitem__
        out[host] = UnitRows(times, units, seq, totals, writers)
    return out


def good_unit_rows(rows: UnitRows) -> bool:
    """Whether every units value is one a view takes (:func:`~.reader.good_units`; none is 0)."""
    units = rows.units if None not in rows.units else [u for u in rows.units if u is not None]
    return set(map(type, units)) <= {int, float} and (not units or (min(units) >= 0 and max(units) < math.inf))


def reduce_unit_rows(job_id: str, host: str, rows: UnitRows, instants: Sequence[int] | None) -> list[StoredJobEvent]:
    """:func:`~.reader.reduce_units` of one host's (good) rows, by slices rather than a Python
    step per row: a span's rows are found by bisection at the cuts, and its middle units summed
    in C (the same additions in the same order). Every row as an event when ``instants`` is None."""
    times, units, seq = rows.times, rows.units, rows.seq

    def event(i: int, count: Any) -> StoredJobEvent:
        return StoredJobEvent(host, job_id, "units", times[i], seq(i), {} if count is None else {"units": count})

    if instants is None:
        return [event(i, u) for i, u in enumerate(units)]
    plain = None not in units
    out: list[StoredJobEvent] = []
    lo = 0
    for hi in [*(bisect.bisect_right(times, t) for t in instants), len(times)]:  # rows up to each cut
        if hi > lo:
            first = bisect.bisect_right(times, times[lo], lo, hi)  # the rows at the span's first instant
            for i in range(lo, first):
                out.append(event(i, units[i]))
            if hi - first == 1:
                out.append(event(first, units[first]))
            elif hi - first > 1:  # the last one carries the units of all the others
                middle = units[first:hi]
                out.append(event(hi - 1, sum(map(float, middle)) if plain else sum(float(u or 0) for u in middle)))
        lo = hi
    return out


def stored_samples(host: str, series: list[dict[str, Any]]) -> list[StoredSample]:
    """Energy samples of ``host`` from one statement's series (the read fields, grouped by
    the series tags)."""
    rows = [
        {**one.get("tags", {}), **dict(zip(one["columns"], values, strict=True))}
        for one in series
        for values in one.get("values", [])
    ]
    return [
        StoredSample(
            host,
            r["source"],
            r["component"],
            r["device"],
            r["quality"],
            int(r["start_ns"]),
            int(r["time"]),
            float(r["energy_j"]),
            float(r["cumulative_j"]),
            r["stream"] or "",
            r["healthy"] is not False,
            None if r["utilization"] is None else float(r["utilization"]),
            None if r["energy_error_j"] is None else float(r["energy_error_j"]),
            None if r.get("neuroncores_per_device") is None else int(r["neuroncores_per_device"]),
        )
        for r in rows
        if r.get("energy_j") is not None
    ]


def interval_points(job_id: str, series: list[dict[str, Any]]) -> list[IntervalSummary]:
    """The ``service_interval`` points of ``job_id`` in a ``GROUP BY *`` answer's ``series``, oldest
    first; latency points (tag ``latency``) left out. Every field is a float (InfluxDB's JSON
    writes a whole one as an integer: read as such, a rewrite would conflict with its type)."""
    out = []
    for one in series:
        tags = {k: v for k, v in one.get("tags", {}).items() if k != "job_id" and v}
        if "latency" in tags:
            continue
        for values in one.get("values", []):
            fields = {k: v for k, v in zip(one["columns"], values, strict=True) if v is not None}
            start = int(fields.pop("time"))
            floats = {k: float(v) if isinstance(v, int | float) else v for k, v in fields.items() if k not in tags}
            out.append(IntervalSummary(job_id, start, tags, floats))
    return sorted(out, key=lambda i: i.start_ns)
