"""The SQLite store's file: its schema versions (each one's migration script), its columns
and how values sit in them (JSON columns), and opening an existing store read-only
(:func:`connect_read_only`), which creates and changes nothing."""

from __future__ import annotations

import functools
import json
import operator
import os
import sqlite3
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wattline.config import ConfigError
from wattline.point_limits import LineProtocolError
from wattline.stores.base import StoreUnavailable
from wattline.stores.lineprotocol import escape_field_key
from wattline.stores.schema import NOT_GAUGES, SAMPLE_FIELD_NAMES
from wattline.text import clip

SCHEMA_VERSION = 7

_SCHEMA_V1 = """
CREATE TABLE energy (
    host TEXT NOT NULL, source TEXT NOT NULL, component TEXT NOT NULL, device TEXT NOT NULL,
    quality TEXT NOT NULL, labels TEXT NOT NULL, time_ns INTEGER NOT NULL, start_ns INTEGER NOT NULL,
    energy_j REAL NOT NULL, power_w REAL NOT NULL, cumulative_j REAL NOT NULL, interval_s REAL NOT NULL,
    utilization REAL, healthy INTEGER NOT NULL, status TEXT NOT NULL, energy_error_j REAL,
    stream TEXT NOT NULL, gauges TEXT NOT NULL,
    UNIQUE (host, source, component, device, quality, time_ns)
);
CREATE INDEX energy_time ON energy (time_ns);
CREATE TABLE job_events (
    host TEXT NOT NULL, labels TEXT NOT NULL, job_id TEXT NOT NULL, event TEXT NOT NULL,
    time_ns INTEGER NOT NULL, event_seq INTEGER NOT NULL, fields TEXT NOT NULL,
    UNIQUE (host, job_id, event, time_ns)
);
CREATE INDEX job_events_job ON job_events (job_id, time_ns);
"""

#: v2: the series of each host, so edge queries are one index lookup per series.
_SCHEMA_V2 = """
CREATE TABLE series (
    host TEXT NOT NULL, source TEXT NOT NULL, component TEXT NOT NULL, device TEXT NOT NULL,
    quality TEXT NOT NULL, PRIMARY KEY (host, source, component, device, quality)
) WITHOUT ROWID;
INSERT OR IGNORE INTO series SELECT DISTINCT host, source, component, device, quality FROM energy;
"""

#: v3: job events by host, kind and time, so a report finds the jobs near its window
#: without reading every job's events.
_SCHEMA_V3 = """
CREATE INDEX job_events_host ON job_events (host, event, time_ns);
"""

#: v4: a job event's identity is (host, job_id, event_seq), not its time. Rows of v3 that
#: share a (host, job_id, event_seq) were distinct events (several processes of one job on
#: one host each numbered from 1): the first (by time) keeps its seq, the others get -rowid,
#: which no wire event can have (event_seq is unsigned), so nothing is lost.
_SCHEMA_V4 = """
CREATE TABLE job_events_v4 (
    host TEXT NOT NULL, labels TEXT NOT NULL, job_id TEXT NOT NULL, event TEXT NOT NULL,
    time_ns INTEGER NOT NULL, event_seq INTEGER NOT NULL, fields TEXT NOT NULL,
    UNIQUE (host, job_id, event_seq)
);
INSERT INTO job_events_v4
    SELECT host, labels, job_id, event, time_ns,
        CASE WHEN row_number() OVER (PARTITION BY host, job_id, event_seq ORDER BY time_ns, event, rowid) = 1
            THEN event_seq ELSE -rowid END,
        fields
    FROM job_events;
DROP TABLE job_events;
ALTER TABLE job_events_v4 RENAME TO job_events;
CREATE INDEX job_events_job ON job_events (job_id, time_ns);
CREATE INDEX job_events_host ON job_events (host, event, time_ns);
"""

#: The oldest schema a read-only connection reads as it is (reads need the v2 ``series`` table).
MIN_READABLE_VERSION = 2
#: v5: each job's summary (the job_summary and job_summary_host measurements), one row per job.
_SCHEMA_V5 = """
CREATE TABLE job_summary (
    job_id TEXT PRIMARY KEY, time_ns INTEGER NOT NULL, tags TEXT NOT NULL, fields TEXT NOT NULL,
    hosts TEXT NOT NULL
);
CREATE INDEX job_summary_time ON job_summary (time_ns);
"""

#: v6: a job's UNITS events (most of a long job's events) in an index of their own that holds
#: what a report sums (:meth:`SqliteStore.unit_events`), its heartbeats in another, and its
#: other events in a third, so a report visits neither the UNITS rows nor every heartbeat.
_SCHEMA_V6 = """
CREATE INDEX IF NOT EXISTS job_events_units ON job_events (job_id, host, time_ns, event_seq, fields)
    WHERE event = 'units';
CREATE INDEX IF NOT EXISTS job_events_beats ON job_events (job_id, host, time_ns) WHERE event = 'heartbeat';
CREATE INDEX IF NOT EXISTS job_events_marks ON job_events (job_id, time_ns) WHERE event NOT IN ('units', 'heartbeat');
"""

#: v7: a service job's interval figures (measurement service_interval), one row per (job, tags,
#: interval start): a rewrite replaces it.
_SCHEMA_V7 = """
CREATE TABLE IF NOT EXISTS service_interval (
    job_id TEXT NOT NULL, tags TEXT NOT NULL, start_ns INTEGER NOT NULL, fields TEXT NOT NULL,
    PRIMARY KEY (job_id, tags, start_ns)
);
CREATE INDEX IF NOT EXISTS service_interval_time ON service_interval (start_ns);
"""

#: Schema version -> script that upgrades the version before it.
_MIGRATIONS = {1: _SCHEMA_V1, 2: _SCHEMA_V2, 3: _SCHEMA_V3, 4: _SCHEMA_V4, 5: _SCHEMA_V5, 6: _SCHEMA_V6, 7: _SCHEMA_V7}


_ENERGY_COLUMNS = (
    "host, source, component, device, quality, labels, time_ns, start_ns, energy_j, power_w, cumulative_j, "
    "interval_s, utilization, healthy, status, energy_error_j, stream, gauges"
)
_INSERT_ENERGY = f"INSERT OR REPLACE INTO energy ({_ENERGY_COLUMNS}) VALUES ({', '.join('?' * 18)})"
_INSERT_SERIES = "INSERT OR IGNORE INTO series VALUES (?, ?, ?, ?, ?)"
_SERIES_KEY = "host = ? AND source = ? AND component = ? AND device = ? AND quality = ?"
_READ_COLUMNS = (
    "host, source, component, device, quality, start_ns, time_ns, energy_j, cumulative_j, stream, healthy, "
    "utilization, energy_error_j, json_extract(gauges, '$.neuroncores_per_device')"
)
_JOB_COLUMNS = "host, labels, job_id, event, time_ns, event_seq, fields"
#: What a StoredJobEvent is made of.
_EVENT_COLUMNS = "host, job_id, event, time_ns, event_seq, fields"
_INSERT_JOB = f"INSERT OR REPLACE INTO job_events ({_JOB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
#: Job event fields that have a column of their own (not in ``fields``).
_EVENT_KEYS = frozenset({"event_seq", "time_ns"})
#: Sample fields that have a column of their own; every other field is a gauge.
_SAMPLE_COLUMNS = SAMPLE_FIELD_NAMES

#: One encoder for every JSON column (``json.dumps`` with options builds a new one per call).
_encode_json = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")).encode


def _json(value: dict[str, Any]) -> str:
    """A JSON column: keys sorted, compact, NaN and infinities refused (ValueError)."""
    return _encode_json(value) if value else "{}"


#: A gauges JSON %-template and the function that picks its values from the gauges map.
GaugesTemplate = tuple[str, Callable[[Any], tuple[float, ...]]]


def _gauges_template(names: tuple[str, ...]) -> GaugesTemplate | None:
    """For a sample whose gauges are ``names`` (in the map's order): a %-template of the
    ``gauges`` JSON column and a function giving the values in its order (names sorted,
    fixed-field and tag names left out, as :func:`sample_fields` does); None when a name is
    not a valid field key, so the sample goes the checked way and is refused with the reason.
    """
    order = sorted(n for n in names if n not in NOT_GAUGES)
    try:
        for name in order:
            escape_field_key(name)
    except LineProtocolError:
        return None
    items = ",".join(_encode_json(name).replace("%", "%%") + ":%r" for name in order)
    values: Callable[[Any], tuple[float, ...]]
    if len(order) > 1:
        values = operator.itemgetter(*order)
    elif order:
        values = functools.partial(_one_value, order[0])
    else:
        values = _no_values
    return "{" + items + "}", values


def _one_value(name: str, gauges: Any) -> tuple[float]:
    return (gauges[name],)


def _no_values(gauges: Any) -> tuple[()]:
    return ()


def _event_fields(text: str) -> dict[str, Any]:
    """A job event's ``fields`` column, but a UNITS event's ``units_total`` (what readers need of
    it: :func:`_units_total`; InfluxDB's readers do not read it either); a UNITS event's (most
    of a long job's events) without the JSON parser: ``{"units":X}`` or
    ``{"units":X,"units_total":Y}`` with X as ``float.__repr__`` wrote it, which float() reads
    back exactly."""
    if text.startswith('{"units":'):
        units = text[9:-1].partition(',"units_total":')[0]
        if "," not in units:
            try:
                return {"units": float(units)}
            except ValueError:
                pass
    fields = {} if text == "{}" else dict(json.loads(text))
    fields.pop("units_total", None)
    return fields


def _units_total(text: str) -> float | None:
    """The ``units_total`` of a UNITS event's ``fields`` column as this store writes it (None
    when it has none, or spelled otherwise)."""
    _, found, total = text.partition(',"units_total":')
    if found and total.endswith("}"):
        try:
            return float(total[:-1])
        except ValueError:
            pass
    return None


class NotAStore(ConfigError, StoreUnavailable):
    """The path holds no wattline store (missing, a directory, not SQLite, another schema):
    input to fix (a ConfigError, exit 2 in the CLI), and a store that cannot be used."""


def connect_read_only(path: str, timeout_s: float) -> sqlite3.Connection:
    """A connection that reads an existing wattline store and creates or changes nothing.

    No file or directory is created for a mistyped path (``mode=rw`` never creates) and no
    statement may write (``query_only``); SQLite's ``-wal``/``-shm`` side files, when no
    writer holds them, exist only while the connection is open (a ``mode=ro`` connection
    would leave them behind, owned by the reader). On a read-only mount the file is read
    as ``immutable`` (nothing can change it there). Raises NotAStore (the path is not a
    wattline store, one line) or StoreUnavailable (SQLite failed).
    """
    target = Path(path)
    if not target.exists():
        raise NotAStore(f"no store at {clip(path)} (nothing created): check --store or $WATTLINE_STORE")
    if target.is_dir():
        raise NotAStore(f"store {clip(path)} is a directory, not a SQLite file")
    if not os.access(target, os.R_OK):
        raise NotAStore(f"store {clip(path)}: permission denied")
    uri = "file:" + urllib.parse.quote(str(target.resolve()))
    try:
        try:
            return _checked(path, uri + "?mode=rw", timeout_s)
        except sqlite3.OperationalError:
            if os.access(target.parent, os.W_OK):
                raise
            return _checked(path, uri + "?mode=ro&immutable=1", timeout_s)  # a read-only mount
    except sqlite3.DatabaseError as exc:
        if exc.sqlite_errorcode == sqlite3.SQLITE_NOTADB:
            raise NotAStore(f"store {clip(path)} is not a SQLite file (not a wattline store)") from None
        raise StoreUnavailable(f"SQLite {clip(path)}: {exc}") from exc


def _checked(path: str, uri: str, timeout_s: float) -> sqlite3.Connection:
    """Connect to ``uri`` and check it holds a wattline schema it can read (MIN_READABLE_VERSION
    up to SCHEMA_VERSION: an older store is read as it is, not upgraded)."""
    db = sqlite3.connect(uri, uri=True, timeout=timeout_s, check_same_thread=False, isolation_level=None)
    try:
        db.execute("PRAGMA query_only = 1")
        (version,) = db.execute("PRAGMA user_version").fetchone()
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        (journal,) = db.execute("PRAGMA journal_mode").fetchone()
    except BaseException:
        db.close()
        raise
    if version == 0 and not tables and journal == "wal":  # our writer's first step, then it ended: nothing stored
        db.close()
        return _empty_store()
    problem = ""
    if version == 0 or "job_events" not in tables:
        problem = "is a SQLite file but not a wattline store (no job_events table)"
    elif version > SCHEMA_VERSION:
        problem = f"has schema version {version}, newer than this wattline's {SCHEMA_VERSION}: upgrade wattline"
    elif version < MIN_READABLE_VERSION:
        problem = (
            f"has schema version {version}, older than {MIN_READABLE_VERSION}: open it once with write access "
            "(wattline collector or wattline run --store) to upgrade it"
        )
    if problem:
        db.close()
        raise NotAStore(f"store {clip(path)} {problem}")
    return db


def _empty_store() -> sqlite3.Connection:
    """An in-memory store with the whole schema and no rows: what a reader sees of a file whose
    first writer was killed before it created its tables (a store with nothing in it)."""
    db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    for target in range(1, SCHEMA_VERSION + 1):
        for statement in _MIGRATIONS[target].split(";"):
            if statement.strip():
                db.execute(statement)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    db.execute("PRAGMA query_only = 1")
    return db
