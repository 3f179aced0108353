"""Every row a SQLite store holds, decoded, for tests to compare with what they sent.

Reports read through the Reader queries; these read the tables whole (what a test wants to
see), through the store's own connection (its lock, its errors), so ``:memory:`` works too.
"""

from __future__ import annotations

import json
from typing import Any

from wattline.stores.base import Store
from wattline.stores.sqlite.store import SqliteStore

_ENERGY_ORDER = "time_ns, host, source, component, device, quality"


def _select(store: Store, table: str, order: str, *conditions: tuple[str, object]) -> list[dict[str, Any]]:
    assert isinstance(store, SqliteStore), f"rows are read from SQLite stores, not {type(store).__name__}"
    used = [(sql, arg) for sql, arg in conditions if arg is not None]
    where = " WHERE " + " AND ".join(sql for sql, _ in used) if used else ""
    names = [row[1] for row in store._rows(f"PRAGMA table_info({table})", [])]
    rows = store._rows(f"SELECT * FROM {table}{where} ORDER BY {order}", [arg for _, arg in used])
    return [dict(zip(names, row, strict=True)) for row in rows]


def energy_rows(
    store: Store, host: str | None = None, start_ns: int | None = None, end_ns: int | None = None
) -> list[dict[str, Any]]:
    """Energy rows with ``start_ns <= time_ns < end_ns`` (each bound optional), oldest first."""
    rows = _select(
        store, "energy", _ENERGY_ORDER, ("host = ?", host), ("time_ns >= ?", start_ns), ("time_ns < ?", end_ns)
    )
    for row in rows:
        row["labels"] = json.loads(row["labels"])
        row["gauges"] = json.loads(row["gauges"])
        row["healthy"] = bool(row["healthy"])
    return rows


def job_event_rows(store: Store, job_id: str | None = None) -> list[dict[str, Any]]:
    """Job event rows (``fields`` decoded), oldest first."""
    rows = _select(store, "job_events", "time_ns, host, job_id, event_seq", ("job_id = ?", job_id))
    for row in rows:
        row["labels"] = json.loads(row["labels"])
        row["fields"] = json.loads(row["fields"])
    return rows
