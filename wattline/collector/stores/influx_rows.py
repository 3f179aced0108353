"""InfluxDB's JSON series turned into what readers return: stored samples and job events."""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from wattline.collector.stores.reader import StoredJobEvent, StoredSample
from wattline.collector.stores.schema import SEQ_BLOCK


def indexes(series: dict[str, Any], *names: str) -> tuple[int, ...]:
    """Positions of ``time`` and of ``names`` in a series' columns."""
    columns = series["columns"]
    return (columns.index("time"), *(columns.index(name) for name in names))


def job_events(series_list: list[dict[str, Any]]) -> list[StoredJobEvent]:
    """Job events from ``SELECT * FROM job_events ... GROUP BY *`` (tags apart from fields).

    The event time is the ``time_ns`` field; points written before it existed have none and
    read their point time (see :data:`~wattline.collector.stores.schema.SEQ_BLOCK`)."""
    events = []
    for series in series_list:
        tags = series["tags"]
        columns = series["columns"]
        for values in series.get("values", []):
            fields = {k: v for k, v in zip(columns, values, strict=True) if v is not None and k != "time"}
            seq = int(fields.pop("event_seq", 0))
            time_ns = int(fields.pop("time_ns", None) or values[columns.index("time")])
            events.append(
                StoredJobEvent(
                    tags.get("host", ""), tags.get("job_id", ""), tags.get("event", ""), time_ns, seq, fields
                )
            )
    return events


def unit_events(found: list[dict[str, Any]]) -> list[StoredJobEvent]:
    """UNITS events from the series of ``SELECT units, event_seq, time_ns ... GROUP BY host, job_id``."""
    events = []
    for series in found:
        tags = series["tags"]
        host, job = tags.get("host", ""), tags.get("job_id", "")
        i_time, i_units, i_seq, i_true = indexes(series, "units", "event_seq", "time_ns")
        events += [
            StoredJobEvent(
                host,
                job,
                "units",
                int(v[i_true] or v[i_time]),
                int(v[i_seq] or 0),
                {} if v[i_units] is None else {"units": v[i_units]},
            )
            for v in series.get("values", [])
        ]
    return events


@dataclass(slots=True)
class UnitRows:
    """One host's UNITS rows as columns, ordered by (time_ns, event_seq)."""

    times: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    units: list[Any] = field(default_factory=list)  #: as InfluxDB gives them (None: no field)


def unit_rows(found: list[dict[str, Any]]) -> dict[str, UnitRows] | None:
    """Per host, the UNITS rows of ``SELECT units, time_ns ... GROUP BY host, seq_block`` (the
    event_seq, not read, is the ``seq_block`` tag's million plus the point time's nanoseconds
    past its millisecond, see :data:`~.schema.SEQ_BLOCK`) or of ``SELECT units, event_seq,
    time_ns ...``. None for rows without ``seq_block`` or ``time_ns`` (an older version wrote
    them) in a series without ``event_seq``: read that too."""
    hosts: dict[str, list[tuple[list[int], list[int], list[Any]]]] = {}
    for series in found:
        columns = series["columns"]
        values = series.get("values", [])
        i_time, i_units, i_true = indexes(series, "units", "time_ns")
        if "event_seq" in columns:
            i_seq = columns.index("event_seq")
            times = [v[i_true] or v[i_time] for v in values]
            seqs = [v[i_seq] or 0 for v in values]
        else:
            block = series["tags"].get("seq_block", "")
            times = [v[i_true] for v in values]
            if not block.isdigit() or None in times:
                return None
            base = int(block) * SEQ_BLOCK
            seqs = [base + v[i_time] % SEQ_BLOCK for v in values]
        hosts.setdefault(series["tags"].get("host", ""), []).append((times, seqs, [v[i_units] for v in values]))
    out = {}
    for host, parts in hosts.items():
        times, seqs, units = (list(itertools.chain.from_iterable(column)) for column in zip(*parts, strict=True))
        if not all(map(operator.lt, times, itertools.islice(times, 1, None))):
            keys = list(zip(times, seqs, strict=True))  # several writers, or events at one instant
            order = sorted(range(len(keys)), key=keys.__getitem__)
            times, seqs, units = ([column[k] for k in order] for column in (times, seqs, units))
        out[host] = UnitRows(times, seqs, units)
    return out


def good_unit_rows(rows: UnitRows) -> bool:
    """Whether every units value is one a view takes (:func:`~.reader.good_units`; none is 0)."""
    units = rows.units if None not in rows.units else [u for u in rows.units if u is not None]
    return set(map(type, units)) <= {int, float} and (not units or (min(units) >= 0 and max(units) < math.inf))


def reduce_unit_rows(job_id: str, host: str, rows: UnitRows, instants: Sequence[int] | None) -> list[StoredJobEvent]:
    """:func:`~.reader.reduce_units` of one host's (good) rows, by slices rather than a Python
    step per row: a span's rows are found by bisection at the cuts, and its middle units summed
    in C (the same additions in the same order). Every row as an event when ``instants`` is None."""
    times, seqs, units = rows.times, rows.seqs, rows.units
    plain = None not in units

    def event(i: int, count: Any) -> StoredJobEvent:
        return StoredJobEvent(host, job_id, "units", times[i], seqs[i], {} if count is None else {"units": count})

    if instants is None:
        return [event(i, u) for i, u in enumerate(units)]
    out: list[StoredJobEvent] = []
    ends = [bisect.bisect_right(times, t) for t in instants]  # rows up to each cut
    for lo, hi in itertools.pairwise([0, *ends, len(times)]):
        if hi == lo:
            continue
        first = bisect.bisect_right(times, times[lo], lo, hi)  # the rows at the span's first instant
        out += [event(i, units[i]) for i in range(lo, first)]
        if hi - first == 1:
            out.append(event(first, units[first]))
        elif hi - first > 1:  # the last one carries the units of all the others
            middle = units[first:hi]
            out.append(event(hi - 1, sum(map(float, middle)) if plain else sum(float(u or 0) for u in middle)))
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
        )
        for r in rows
        if r.get("energy_j") is not None
    ]
