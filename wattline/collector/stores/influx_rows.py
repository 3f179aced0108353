"""InfluxDB's JSON series turned into what readers return: stored samples and job events."""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Sequence
from typing import Any

from wattline.collector.stores.reader import StoredJobEvent, StoredSample


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


def reduced_units(job_id: str, series: dict[str, Any], instants: Sequence[int]) -> list[StoredJobEvent] | None:
    """One host's UNITS events (a series of ``SELECT units, event_seq, time_ns ... GROUP BY
    host, job_id``) reduced as :func:`~.reader.reduce_units` does for ``instants``, without a
    Python step per row: the rows come in point-time order, so where their event times
    strictly increase (the usual case) that is the (time, event_seq) order, a span is a slice
    found by bisection, and its middle units are summed in C (the same additions in the same
    order). None when that does not hold (events at one instant or out of order, a units
    value that is not a plain number >= 0): the caller reduces the rows one by one."""
    i_time, i_units, i_seq, i_true = indexes(series, "units", "event_seq", "time_ns")
    values = series.get("values", [])
    times = [v[i_true] or v[i_time] for v in values]
    units = [v[i_units] for v in values]
    if not (
        set(map(type, times)) <= {int}
        and all(map(operator.lt, times, itertools.islice(times, 1, None)))
        and set(map(type, units)) <= {int, float}
        and (not units or (min(units) >= 0 and max(units) < math.inf))
    ):
        return None
    host = series["tags"].get("host", "")

    def event(i: int, count: float) -> StoredJobEvent:
        return StoredJobEvent(host, job_id, "units", times[i], int(values[i][i_seq] or 0), {"units": count})

    out: list[StoredJobEvent] = []
    ends = [bisect.bisect_right(times, t) for t in instants]  # events up to each cut
    for lo, hi in itertools.pairwise([0, *ends, len(times)]):
        if hi > lo:
            out.append(event(lo, units[lo]))  # the span's first instant: one event (times strictly increase)
        if hi - lo == 2:
            out.append(event(lo + 1, units[lo + 1]))
        elif hi - lo > 2:  # the last one carries the units of all but the first
            out.append(event(hi - 1, sum(map(float, units[lo + 1 : hi]))))
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
