"""The embedded default back-end: one SQLite file (stdlib ``sqlite3``, WAL mode).

All of wattline's SQL lives in this module. Tables mirror the InfluxDB schema and its
point identity (measurement + tags + timestamp; host labels are metadata here):

- ``energy``: one row per Sample, UNIQUE (host, source, component, device, quality,
  time_ns) with ``time_ns`` = interval end;
- ``job_events``: one row per JobEvent, UNIQUE (host, job_id, event, time_ns).

Rows are written with ``INSERT OR REPLACE``: as in InfluxDB, the last write of a point
wins and a resent batch leaves one copy. Each batch is one transaction
(``synchronous=FULL``: committed means on disk). The points InfluxDB would refuse
(see :mod:`wattline.collector.lineprotocol`) are refused here too, so every back-end
stores the same points. ``PRAGMA user_version`` holds the schema version.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.collector.lineprotocol import LineEncoder, LineProtocolError, describe
from wattline.collector.stores.base import (
    ENERGY,
    JOB_EVENTS,
    SAMPLE_FIELD_NAMES,
    Store,
    StoreUnavailable,
    WriteResult,
    host_tags,
    job_event_fields,
    job_event_tags,
    sample_fields,
    sample_tags,
)
from wattline.collector.stores.reader import StoredJobEvent, StoredSample

SCHEMA_VERSION = 2

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

#: Schema version -> script that upgrades the version before it.
_MIGRATIONS = {1: _SCHEMA_V1, 2: _SCHEMA_V2}

_ENERGY_COLUMNS = (
    "host, source, component, device, quality, labels, time_ns, start_ns, energy_j, power_w, cumulative_j, "
    "interval_s, utilization, healthy, status, energy_error_j, stream, gauges"
)
_INSERT_ENERGY = f"INSERT OR REPLACE INTO energy ({_ENERGY_COLUMNS}) VALUES ({', '.join('?' * 18)})"
_INSERT_SERIES = "INSERT OR IGNORE INTO series VALUES (?, ?, ?, ?, ?)"
_SERIES_KEY = "host = ? AND source = ? AND component = ? AND device = ? AND quality = ?"
_READ_COLUMNS = (
    "host, source, component, device, quality, start_ns, time_ns, energy_j, cumulative_j, stream, healthy, "
    "utilization, energy_error_j"
)
_JOB_COLUMNS = "host, labels, job_id, event, time_ns, event_seq, fields"
_INSERT_JOB = f"INSERT OR REPLACE INTO job_events ({_JOB_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
#: Sample fields that have a column of their own; every other field is a gauge.
_SAMPLE_COLUMNS = SAMPLE_FIELD_NAMES


def _stored(row: tuple[Any, ...]) -> StoredSample:
    """A row of ``_READ_COLUMNS`` as a StoredSample."""
    host, source, component, device, quality, start, end, energy, cumulative, stream, healthy, util, err = row
    return StoredSample(
        host, source, component, device, quality, start, end, energy, cumulative, stream, bool(healthy), util, err
    )


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))


class SqliteStore(Store):
    """A SQLite file; one connection shared by the collector's threads behind a lock."""

    kind = "sqlite"

    def __init__(self, path: str | Path, timeout_s: float = 10.0) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._checker = LineEncoder()
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=timeout_s, check_same_thread=False, isolation_level=None)
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._migrate()
            except BaseException:
                self._db.close()
                raise
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"SQLite {self.path}: {exc}") from exc

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    def _migrate(self) -> None:
        """Create or upgrade the schema, in one transaction (safe against a concurrent opener)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            (version,) = self._db.execute("PRAGMA user_version").fetchone()
            if version > SCHEMA_VERSION:
                raise StoreUnavailable(f"SQLite {self.path}: schema version {version} is newer than {SCHEMA_VERSION}")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target].split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {target}")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def write(self, batch: wire.pb.Batch) -> WriteResult:
        result = WriteResult()
        host = host_tags(batch)
        host_id = host["host"]
        labels = _json({k: v for k, v in host.items() if k != "host"})
        stream = batch.stream_id
        energy_rows = []
        for sample in batch.samples:
            tags = sample_tags(sample)
            fields = sample_fields(sample, stream)
            try:
                self._checker.check(ENERGY, {**host, **tags}, fields)
                gauges = _json({k: v for k, v in fields.items() if k not in _SAMPLE_COLUMNS})
            except (LineProtocolError, ValueError) as exc:
                result.rejected += 1
                result.reasons.append(f"{ENERGY} {describe(host, tags)} at {sample.end_ns}: {exc}")
                continue
            energy_rows.append(
                (
                    host_id,
                    tags["source"],
                    tags["component"],
                    tags["device"],
                    tags["quality"],
                    labels,
                    sample.end_ns,
                    sample.start_ns,
                    sample.energy_j,
                    sample.power_w,
                    sample.cumulative_j,
                    fields["interval_s"],
                    fields.get("utilization"),
                    int(sample.healthy),
                    sample.status,
                    fields.get("energy_error_j"),
                    stream,
                    gauges,
                )
            )
        job_rows = []
        for event in batch.job_events:
            tags = job_event_tags(event)
            fields = job_event_fields(event)
            try:
                self._checker.check(JOB_EVENTS, {**host, **tags}, fields)
                extra = _json({k: v for k, v in fields.items() if k != "event_seq"})
            except (LineProtocolError, ValueError) as exc:
                result.rejected += 1
                result.reasons.append(f"{JOB_EVENTS} {describe(host, tags)} at {event.time_ns}: {exc}")
                continue
            job_rows.append((host_id, labels, tags["job_id"], tags["event"], event.time_ns, fields["event_seq"], extra))
        with self._lock:
            try:
                self._db.execute("BEGIN")
                try:
                    self._db.executemany(_INSERT_ENERGY, energy_rows)
                    self._db.executemany(_INSERT_SERIES, sorted({row[:5] for row in energy_rows}))
                    self._db.executemany(_INSERT_JOB, job_rows)
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"SQLite {self.path}: {exc}") from exc
        result.written = len(energy_rows) + len(job_rows)
        return result

    def query_energy(
        self, host: str | None = None, start_ns: int | None = None, end_ns: int | None = None
    ) -> list[dict[str, Any]]:
        """Energy rows with ``start_ns <= time_ns < end_ns`` (each bound optional), oldest first."""
        where, args = self._where(("host = ?", host), ("time_ns >= ?", start_ns), ("time_ns < ?", end_ns))
        rows = self._select(
            f"SELECT {_ENERGY_COLUMNS} FROM energy{where} ORDER BY time_ns, host, source, component, device, quality",
            args,
        )
        for row in rows:
            row["labels"] = json.loads(row["labels"])
            row["gauges"] = json.loads(row["gauges"])
            row["healthy"] = bool(row["healthy"])
        return rows

    def query_job_events(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """Job event rows (``fields`` decoded), oldest first."""
        where, args = self._where(("job_id = ?", job_id))
        rows = self._select(
            f"SELECT {_JOB_COLUMNS} FROM job_events{where} ORDER BY time_ns, host, job_id, event_seq", args
        )
        for row in rows:
            row["labels"] = json.loads(row["labels"])
            row["fields"] = json.loads(row["fields"])
        return rows

    # -- Reader (what reports need; see reader.py) -----------------------------------

    def job_events(self, job_id: str | None = None) -> list[StoredJobEvent]:
        return [
            StoredJobEvent(r["host"], r["job_id"], r["event"], r["time_ns"], r["event_seq"], r["fields"])
            for r in self.query_job_events(job_id)
        ]

    def samples(self, host: str, start_ns: int, end_ns: int) -> list[StoredSample]:
        sql = f"SELECT {_READ_COLUMNS} FROM energy WHERE host = ? AND time_ns > ? AND start_ns < ? ORDER BY time_ns"
        return [_stored(row) for row in self._rows(sql, [host, start_ns, end_ns])]

    def first_after(self, host: str, t_ns: int) -> list[StoredSample]:
        return self._edges(host, "time_ns >= ? ORDER BY time_ns LIMIT 1", t_ns)

    def last_before(self, host: str, t_ns: int) -> list[StoredSample]:
        return self._edges(host, "time_ns <= ? ORDER BY time_ns DESC LIMIT 1", t_ns)

    def _edges(self, host: str, condition: str, t_ns: int) -> list[StoredSample]:
        """One index lookup per series of ``host``: cost independent of the data's length."""
        series = self._rows("SELECT host, source, component, device, quality FROM series WHERE host = ?", [host])
        sql = f"SELECT {_READ_COLUMNS} FROM energy WHERE {_SERIES_KEY} AND {condition}"
        out: list[StoredSample] = []
        for key in series:
            out += [_stored(row) for row in self._rows(sql, [*key, t_ns])]
        return out

    def _rows(self, sql: str, args: list[object]) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"SQLite {self.path}: {exc}") from exc

    @staticmethod
    def _where(*conditions: tuple[str, object]) -> tuple[str, list[object]]:
        used = [(sql, arg) for sql, arg in conditions if arg is not None]
        if not used:
            return "", []
        return " WHERE " + " AND ".join(sql for sql, _ in used), [arg for _, arg in used]

    def _select(self, sql: str, args: list[object]) -> list[dict[str, Any]]:
        with self._lock:
            try:
                cursor = self._db.execute(sql, args)
                names = [d[0] for d in cursor.description]
                return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"SQLite {self.path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()
