"""InfluxDB's JSON series turned into what readers return: stored samples and job events."""

from __future__ import annotations

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
