"""The embedded default back-end: one SQLite file (stdlib ``sqlite3``, WAL mode).

All of wattline's SQL lives in this module and its schema's, :mod:`.sqlite_schema`
(versions, migrations, opening read-only). Tables mirror the InfluxDB schema and its
point identity (host labels are metadata here):

- ``energy``: one row per Sample, UNIQUE (host, source, component, device, quality,
  time_ns) with ``time_ns`` = interval end;
- ``job_events``: one row per JobEvent, UNIQUE (host, job_id, event_seq) (schema v4; v3
  keyed them by time, so events at one instant overwrote each other), ``time_ns`` = the
  event time;
- ``job_summary``: one row per job (schema v5), PRIMARY KEY job_id, ``time_ns`` = the job's
  start; the measurement's tags, fields and per-host energy as JSON columns.

Rows are written with ``INSERT OR REPLACE``: as in InfluxDB, the last write of a point
wins and a resent batch leaves one copy. Each :meth:`SqliteStore.write_group` (a group of
batches; :meth:`~SqliteStore.write` is a group of one) is one transaction
(``synchronous=FULL``: committed means on disk): all of its batches or none. The points InfluxDB would refuse
(see :mod:`wattline.collector.lineprotocol`) are refused here too, so every back-end
stores the same points. ``PRAGMA user_version`` holds the schema version.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import sqlite3
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.collector.lineprotocol import (
    MAX_TIME_NS,
    MIN_TIME_NS,
    LineEncoder,
    LineProtocolError,
    clip,
    describe,
    job_event_point,
)
from wattline.collector.pointfields import sample_fields
from wattline.collector.stores.base import JobSummary, Store, StoreUnavailable, WriteResult
from wattline.collector.stores.reader import (
    StoredJobEvent,
    StoredSample,
    UnitCuts,
    jobs_near,
    last_heard,
    reduce_units,
)
from wattline.collector.stores.schema import (
    ENERGY,
    JOB_EVENTS,
    host_tags,
    job_event_tags,
    sample_tags,
    summary_points,
)
from wattline.collector.stores.sqlite_schema import (
    _EVENT_COLUMNS,
    _EVENT_KEYS,
    _INSERT_ENERGY,
    _INSERT_JOB,
    _INSERT_SERIES,
    _MIGRATIONS,
    _READ_COLUMNS,
    _SAMPLE_COLUMNS,
    _SERIES_KEY,
    SCHEMA_VERSION,
    GaugesTemplate,
    NotAStore,
    _event_fields,
    _gauges_template,
    _json,
    connect_read_only,
)

#: A UNITS event's ``fields`` as the store writes them, ``{"units":X}`` with X >= 0 (see
#: :func:`_event_fields`), and its units in SQL; any other (``{}`` is 0 units) is read in Python.
_PLAIN_UNITS = """fields GLOB '{"units":[0-9]*}'"""


#: Spans of :meth:`SqliteStore.unit_events` per statement (3 variables each).
_SPANS_PER_QUERY = 3000
#: A row of job_events_units as one text (exact: integers and the fields' own text).
_PACK = "time_ns || ' ' || event_seq || ' ' || fields"
_UNITS_OF = "FROM job_events WHERE job_id = ? AND event = 'units'"
#: The events along index job_events_marks (the term must read as in the index).
_MARKS = "event NOT IN ('units', 'heartbeat')"
_IN_SPAN = (
    "FROM job_events WHERE job_id = ?1 AND event = 'units' AND host = s.host AND time_ns > s.lo AND time_ns <= s.hi"
)
#: Per span: its first two rows, its last, and the sum of its units (inf when a row's units
#: are not written as this store writes them).
_SPAN_COLUMNS = (
    f"(SELECT {_PACK} {_IN_SPAN} ORDER BY time_ns, event_seq LIMIT 1), "
    f"(SELECT {_PACK} {_IN_SPAN} ORDER BY time_ns, event_seq LIMIT 1 OFFSET 1), "
    f"(SELECT {_PACK} {_IN_SPAN} ORDER BY time_ns DESC, event_seq DESC LIMIT 1), "
    f"(SELECT SUM(CASE WHEN {_PLAIN_UNITS} THEN CAST(substr(fields, 10) AS REAL) "
    f"WHEN fields = '{{}}' THEN 0 ELSE 9e999 END) {_IN_SPAN})"
)


@functools.lru_cache(maxsize=8)
def _spans_query(n: int) -> str:
    """The statement of :meth:`SqliteStore.unit_events` for ``n`` spans (?1: the job id)."""
    values = ", ".join(f"(?{3 * i + 2}, ?{3 * i + 3}, ?{3 * i + 4})" for i in range(n))
    return f"WITH s(host, lo, hi) AS (VALUES {values}) SELECT {_SPAN_COLUMNS} FROM s"


def _packed(host: str, job_id: str, text: str) -> StoredJobEvent:
    t, seq, fields = text.split(" ", 2)
    return StoredJobEvent(host, job_id, "units", int(t), int(seq), _event_fields(fields))


def _stored(row: tuple[Any, ...]) -> StoredSample:
    """A row of ``_READ_COLUMNS`` as a StoredSample."""
    host, source, component, device, quality, start, end, energy, cumulative, stream, healthy, util, err = row
    return StoredSample(
        host, source, component, device, quality, start, end, energy, cumulative, stream, bool(healthy), util, err
    )


#: Entries kept in each per-store cache (hosts seen, gauge-name tuples seen) before it is emptied.
_MAX_CACHED = 100_000


#: ``Sample.HasField`` unbound: calling it costs half of calling the bound method.
_has_field = wire.pb.Sample.HasField


@dataclass(slots=True)
class _Prepared:
    """One batch, checked and turned into rows (outside the lock)."""

    result: WriteResult
    energy: list[tuple[Any, ...]]
    jobs: list[tuple[Any, ...]]
    series: list[tuple[str, str, str, str, str]]


class SqliteStore(Store):
    """A SQLite file; one connection shared by the collector's threads behind a lock."""

    kind = "sqlite"
    #: One writer at a time (the connection's lock), so batches waiting for it group up.
    max_concurrent_writes = 1

    def __init__(self, path: str | Path, timeout_s: float = 10.0, read_only: bool = False) -> None:
        """Open (creating it and its directory) the store at ``path``; with ``read_only``, an
        existing store only, for reading (:func:`connect_read_only`)."""
        self.path = str(path)
        self._lock = threading.Lock()
        self._checker = LineEncoder()
        #: host tag set -> (labels JSON, {(source, component, device, quality number): quality
        #: name} of the series whose tags passed the line-protocol check).
        self._hosts: dict[tuple[tuple[str, str], ...], tuple[str, dict[tuple[str, str, str, int], str]]] = {}
        #: gauge names in map order -> _gauges_template() of them.
        self._gauge_templates: dict[tuple[str, ...], GaugesTemplate | None] = {}
        #: Rows of the ``series`` table (only ever added to): new series are the only ones inserted.
        self._series: set[tuple[str, str, str, str, str]] = set()
        if read_only:
            self._db = connect_read_only(self.path, timeout_s)
            return
        if Path(self.path).is_dir():
            raise NotAStore(f"store {clip(self.path)} is a directory, not a SQLite file")
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=timeout_s, check_same_thread=False, isolation_level=None)
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._migrate()
                self._series.update(self._db.execute("SELECT host, source, component, device, quality FROM series"))
            except BaseException:
                self._db.close()
                raise
        except (sqlite3.Error, OSError) as exc:
            if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB:
                raise NotAStore(f"store {clip(self.path)} is not a SQLite file (not a wattline store)") from None
            parent = Path(self.path).parent
            if parent.is_dir() and not os.access(parent, os.W_OK):
                raise StoreUnavailable(f"SQLite {self.path}: cannot write: {parent} is read-only ({exc})") from exc
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
        return self.write_group([batch])[0]

    def write_group(self, batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
        """Every batch in ONE transaction (one fsync); one result per batch, in order.

        Raises :class:`StoreUnavailable` (and rolls back: none of them is written) on any
        SQLite error.
        """
        prepared = [self._prepare(batch) for batch in batches]
        if len(prepared) == 1:
            energy, jobs, series = prepared[0].energy, prepared[0].jobs, prepared[0].series
        else:
            energy = [row for p in prepared for row in p.energy]
            jobs = [row for p in prepared for row in p.jobs]
            series = [key for p in prepared for key in p.series]
        db = self._db
        with self._lock:
            new_series = sorted({key for key in series if key not in self._series})
            try:
                db.execute("BEGIN")
                try:
                    db.executemany(_INSERT_ENERGY, energy)
                    if new_series:
                        db.executemany(_INSERT_SERIES, new_series)
                    if jobs:
                        db.executemany(_INSERT_JOB, jobs)
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"SQLite {self.path}: {exc}") from exc
            self._series.update(new_series)
        for p in prepared:
            p.result.written = len(p.energy) + len(p.jobs)
        return [p.result for p in prepared]

    def _prepare(self, batch: wire.pb.Batch) -> _Prepared:
        """Check a batch's points as InfluxDB would (refused ones get a reason) and build its rows.

        Per sample, the common case costs attribute reads and one dict lookup: the series'
        tags are checked once per host and series (cached), its float fields in one sum (a
        NaN or infinity makes it non-finite), its gauges through a cached JSON template.
        Anything else (a new series, a non-finite value, an unseen gauge name) goes through
        :meth:`_checked_row`, which stores the same row or refuses the point with the reason.
        """
        result = WriteResult()
        host = host_tags(batch)
        host_key = tuple(host.items())
        cached = self._hosts.get(host_key)
        if cached is None:
            if len(self._hosts) >= _MAX_CACHED:
                self._hosts.clear()
            cached = self._hosts[host_key] = (_json({k: v for k, v in host.items() if k != "host"}), {})
        labels, checked = cached
        host_id = host["host"]
        stream = batch.stream_id
        templates = self._gauge_templates
        seen: dict[tuple[str, str, str, int], str] = {}
        rows: list[tuple[Any, ...]] = []
        append = rows.append
        has_field = _has_field
        for s in batch.samples:
            source, component, device, _ = key = (s.source, s.component, s.device, s.quality)
            energy, power, cumulative, start, end = s.energy_j, s.power_w, s.cumulative_j, s.start_ns, s.end_ns
            total = energy + power + cumulative
            utilization = energy_error = None
            if has_field(s, "utilization"):
                utilization = s.utilization
                total += utilization
            if has_field(s, "energy_error_j"):
                energy_error = s.energy_error_j
                total += energy_error
            gauges = s.gauges
            gauges_json: str | None = "{}"
            if gauges:
                names = tuple(gauges)
                template = templates.get(names)
                if template is None and names not in templates:
                    if len(templates) >= _MAX_CACHED:
                        templates.clear()
                    template = templates[names] = _gauges_template(names)
                if template is None:
                    gauges_json = None
                else:
                    values = template[1](gauges)
                    total += sum(values)
                    gauges_json = template[0] % values
            quality = seen.get(key)
            if quality is None:
                quality = checked.get(key)
                if quality is not None:
                    seen[key] = quality
            if (
                quality is None
                or gauges_json is None
                or total - total != 0.0  # NaN or +-inf somewhere
                or not MIN_TIME_NS <= end <= MAX_TIME_NS
            ):
                row = self._checked_row(host, labels, stream, s, result)
                if row is not None:
                    append(row)
                    checked[key] = seen[key] = row[4]
                continue
            append(  # the columns of _INSERT_ENERGY, in order
                (
                    host_id,
                    source,
                    component,
                    device,
                    quality,
                    labels,
                    end,
                    start,
                    energy,
                    power,
                    cumulative,
                    (end - start) / 1e9,
                    utilization,
                    1 if s.healthy else 0,  # (an int binds faster than a bool)
                    s.status,
                    energy_error,
                    stream,
                    gauges_json,
                )
            )
        jobs = []
        for event in batch.job_events:
            try:
                tags, fields, point_ns = job_event_point(host, event)
                self._checker.check(JOB_EVENTS, tags, fields, point_ns)
                extra = _json({k: v for k, v in fields.items() if k not in _EVENT_KEYS})
            except (LineProtocolError, ValueError) as exc:
                result.rejected += 1
                result.reasons.append(f"{JOB_EVENTS} {describe(host, job_event_tags(event))} at {event.time_ns}: {exc}")
                continue
            jobs.append((host_id, labels, tags["job_id"], tags["event"], event.time_ns, fields["event_seq"], extra))
        series = [
            (host_id, source, component, device, quality) for (source, component, device, _), quality in seen.items()
        ]
        return _Prepared(result, rows, jobs, series)

    def _checked_row(
        self, host: dict[str, str], labels: str, stream: str, sample: wire.pb.Sample, result: WriteResult
    ) -> tuple[Any, ...] | None:
        """A sample's row after the full line-protocol check; None (and the reason in
        ``result``) when InfluxDB would refuse the point."""
        tags = sample_tags(sample)
        fields = sample_fields(sample, stream)
        try:
            self._checker.check(ENERGY, {**host, **tags}, fields, sample.end_ns)
            gauges = _json({k: v for k, v in fields.items() if k not in _SAMPLE_COLUMNS})
        except (LineProtocolError, ValueError) as exc:
            result.rejected += 1
            result.reasons.append(f"{ENERGY} {describe(host, tags)} at {sample.end_ns}: {exc}")
            return None
        return (
            *(host["host"], tags["source"], tags["component"], tags["device"], tags["quality"], labels),
            *(sample.end_ns, sample.start_ns, sample.energy_j, sample.power_w, sample.cumulative_j),
            *(fields["interval_s"], fields.get("utilization"), int(sample.healthy), sample.status),
            *(fields.get("energy_error_j"), stream, gauges),
        )

    # -- job summaries -----------------------------------------------------------------

    def write_summary(self, summary: JobSummary) -> WriteResult:
        """Write (replace) the job's one summary row; refused (rejected) if a value cannot be stored."""
        try:
            for point in summary_points(summary):
                self._checker.check(*point)
            row = (summary.job_id, summary.time_ns, _json(summary.tags), _json(summary.fields), _json(summary.hosts))
        except (LineProtocolError, ValueError) as exc:
            return WriteResult(rejected=1, reasons=[f"job summary {clip(summary.job_id)}: {exc}"])
        with self._lock:
            try:
                self._db.execute("INSERT OR REPLACE INTO job_summary VALUES (?, ?, ?, ?, ?)", row)
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"SQLite {self.path}: {exc}") from exc
        return WriteResult(written=1)

    def job_summary(self, job_id: str) -> JobSummary | None:
        """The stored summary of ``job_id`` (None when there is none)."""
        found = self.job_summaries(job_id)
        return found[0] if found else None

    def job_summaries(self, job_id: str | None = None) -> list[JobSummary]:
        """Stored summaries (of ``job_id``, else all), oldest start first."""
        where, args = self._where(("job_id = ?", job_id))
        sql = f"SELECT job_id, time_ns, tags, fields, hosts FROM job_summary{where} ORDER BY time_ns, job_id"
        return [
            JobSummary(job, t, json.loads(tags), json.loads(fields), json.loads(hosts))
            for job, t, tags, fields, hosts in self._rows(sql, args)
        ]

    # -- Reader (what reports need; see reader.py) -----------------------------------

    def job_events(self, job_id: str | None = None, every: bool = True) -> list[StoredJobEvent]:
        where, args = self._where(("job_id = ?", job_id))
        if every:
            sql = f"SELECT {_EVENT_COLUMNS} FROM job_events{where} ORDER BY time_ns, host, event_seq"
            return self._events(sql, args)
        if job_id is None:
            raise ValueError("job_events(every=False) reads one job")
        events = self._events(f"SELECT {_EVENT_COLUMNS} FROM job_events WHERE job_id = ? AND {_MARKS}", [job_id])
        beat = f"SELECT {_EVENT_COLUMNS} FROM job_events WHERE job_id = ? AND event = 'heartbeat' AND host = ? "
        for host in self._hosts_with(job_id, "heartbeat"):  # along job_events_beats
            first, last = (self._events(f"{beat}ORDER BY time_ns {d} LIMIT 1", [job_id, host]) for d in ("", "DESC"))
            events += first + (last if last != first else [])
        return sorted(events, key=lambda e: (e.time_ns, e.host, e.event_seq))

    def _events(self, sql: str, args: list[object]) -> list[StoredJobEvent]:
        return [
            StoredJobEvent(host, job, event, t, seq, _event_fields(fields))
            for host, job, event, t, seq, fields in self._rows(sql, args)
        ]

    def unit_events(self, job_id: str, cuts: UnitCuts) -> list[StoredJobEvent]:
        """Per host and span of ``cuts``, index lookups along job_events_units (its first rows,
        its last, :func:`reduce_units`) and one sum, all in one statement: no row leaves
        SQLite but those, so a report's cost does not grow with the job's UNITS events."""
        bounds = [-(2**63), *cuts.instants, 2**63 - 1]
        spans = [(host, lo, hi) for host in self._hosts_with(job_id, "units") for lo, hi in itertools.pairwise(bounds)]
        found: list[tuple[Any, ...]] = []
        for i in range(0, len(spans), _SPANS_PER_QUERY):
            chunk = spans[i : i + _SPANS_PER_QUERY]
            found += self._rows(_spans_query(len(chunk)), [job_id, *itertools.chain.from_iterable(chunk)])
        if any(total == math.inf for *_, total in found):  # units not as this store writes them
            return reduce_units(self._events(f"SELECT {_EVENT_COLUMNS} {_UNITS_OF}", [job_id]), cuts)
        out: list[StoredJobEvent] = []
        for (host, lo, hi), (first, second, last, total) in zip(spans, found, strict=True):
            if first is None:
                continue
            head = _packed(host, job_id, first)
            if second is None:
                out.append(head)
            elif second.split(" ", 1)[0] == first.split(" ", 1)[0]:  # events at one instant: read the span
                sql = f"SELECT {_EVENT_COLUMNS} {_UNITS_OF} AND host = ? AND time_ns > ? AND time_ns <= ?"
                out += reduce_units(self._events(sql, [job_id, host, lo, hi]), cuts)
            elif second == last:  # two events
                out += [head, _packed(host, job_id, last)]
            else:  # the last one carries the units of all but the first
                t, seq, _fields = last.split(" ", 2)
                rest = total - float(head.fields.get("units", 0))
                out += [head, StoredJobEvent(host, job_id, "units", int(t), int(seq), {"units": rest})]
        return sorted(out, key=lambda e: (e.time_ns, e.host, e.event_seq))

    def _hosts_with(self, job_id: str, event: str) -> list[str]:
        """The hosts with ``event`` events (units, heartbeat) of ``job_id``: one lookup each
        along that kind's index."""
        sql = f"SELECT host FROM job_events WHERE job_id = ? AND event = '{event}' AND host > ? ORDER BY host LIMIT 1"
        hosts = [h for (h,) in self._rows(sql.replace("AND host > ? ", ""), [job_id])]
        while hosts and (more := self._rows(sql, [job_id, hosts[-1]])):
            hosts.append(more[0][0])
        return hosts

    def job_events_between(self, start_ns: int, end_ns: int, hosts: Collection[str]) -> list[StoredJobEvent]:
        ids = sorted(jobs_near(self._job_ids, start_ns, end_ns, hosts))
        events: list[StoredJobEvent] = []
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            sql = (  # along index job_events_marks, not past a long job's UNITS rows and heartbeats
                f"SELECT {_EVENT_COLUMNS} FROM job_events "
                f"WHERE job_id IN ({', '.join('?' * len(chunk))}) AND event IN ('open', 'close') AND {_MARKS}"
            )
            events += [
                StoredJobEvent(host, job, event, t, seq, json.loads(fields))
                for host, job, event, t, seq, fields in self._rows(sql, list(chunk))
            ]
        events += last_heard(events, self._last_heard)
        return sorted(events, key=lambda e: (e.time_ns, e.host, e.event_seq))

    def _last_heard(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Time of each (job, host)'s latest event: read backwards along job_events_job
        (``+host`` keeps the planner on that index), so one row per pair, not the job's events."""
        sql = "SELECT time_ns FROM job_events WHERE job_id = ? AND +host = ? ORDER BY time_ns DESC LIMIT 1"
        out: dict[tuple[str, str], int] = {}
        for job_id, host in pairs:
            for (t,) in self._rows(sql, [job_id, host]):
                out[job_id, host] = t
        return out

    def _job_ids(self, event: str, hosts: Collection[str], since_ns: int, until_ns: int) -> set[str]:
        """Jobs with an ``event`` on one of ``hosts`` in [since_ns, until_ns] (index job_events_host)."""
        out: set[str] = set()
        sql = "SELECT DISTINCT job_id FROM job_events WHERE host = ? AND event = ? AND time_ns BETWEEN ? AND ?"
        for host in hosts:
            out.update(job_id for (job_id,) in self._rows(sql, [host, event, since_ns, until_ns]))
        return out

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

    def close(self) -> None:
        with self._lock:
            self._db.close()
