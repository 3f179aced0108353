"""The embedded default back-end: one SQLite file (stdlib ``sqlite3``, WAL mode).

All of wattline's SQL lives in this module (the write path), its reads',
:mod:`.sqlite_reads`, and its schema's, :mod:`.sqlite_schema` (versions, migrations,
opening read-only). Tables mirror the InfluxDB schema and its
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
(see :mod:`wattline.stores.lineprotocol`) are refused here too, so every back-end
stores the same points. ``PRAGMA user_version`` holds the schema version.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.point_limits import MAX_TIME_NS, MIN_TIME_NS, LineProtocolError
from wattline.stores.base import IntervalSummary, JobSummary, Store, StoreUnavailable, WriteResult
from wattline.stores.lineprotocol import LineEncoder, describe, job_event_point
from wattline.stores.pointfields import sample_fields
from wattline.stores.schema import (
    ENERGY,
    JOB_EVENTS,
    host_tags,
    interval_point,
    job_event_tags,
    sample_tags,
    summary_points,
    unit_fields,
)
from wattline.stores.sqlite.reads import SqliteReads
from wattline.stores.sqlite.schema import (
    _EVENT_KEYS,
    _INSERT_ENERGY,
    _INSERT_JOB,
    _INSERT_SERIES,
    _MIGRATIONS,
    _SAMPLE_COLUMNS,
    SCHEMA_VERSION,
    GaugesTemplate,
    NotAStore,
    _gauges_template,
    _json,
    connect_read_only,
)
from wattline.text import clip

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


class SqliteStore(SqliteReads, Store):
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
                if not Path(self.path).exists():
                    self._create(timeout_s)
            self._db = self._connect(self.path, timeout_s)
            try:
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

    def _connect(self, path: str, timeout_s: float) -> sqlite3.Connection:
        """A writable connection to ``path`` (WAL, every commit on disk), its schema created or upgraded."""
        db = sqlite3.connect(path, timeout=timeout_s, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            self._migrate(db)
        except BaseException:
            db.close()
            raise
        return db

    def _create(self, timeout_s: float) -> None:
        """Make a new store appear whole: the schema is built in a file beside it and linked
        into place. A process killed while creating the store in place left a SQLite file
        without tables, which every reader then refused as "not a wattline store" (only a
        writer's next open repaired it). Another process creating it at the same moment wins
        the link; this one then opens theirs."""
        target = Path(self.path)
        building = target.with_name(f".{target.name}.creating-{os.getpid()}-{threading.get_ident()}")
        try:
            self._connect(str(building), timeout_s).close()  # the last close folds the WAL into the file
            os.link(building, target)
        except OSError:
            pass  # it exists now (theirs), or no hard links here: then it is created in place, as before
        finally:
            for suffix in ("", "-wal", "-shm"):
                building.with_name(building.name + suffix).unlink(missing_ok=True)

    def _migrate(self, db: sqlite3.Connection) -> None:
        """Create or upgrade the schema, in one transaction (safe against a concurrent opener)."""
        db.execute("BEGIN IMMEDIATE")
        try:
            (version,) = db.execute("PRAGMA user_version").fetchone()
            if version > SCHEMA_VERSION:
                raise StoreUnavailable(f"SQLite {self.path}: schema version {version} is newer than {SCHEMA_VERSION}")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {target}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

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
                # An extra unit kind's tags lead its fields: its row is no plain UNITS row (sqlite_schema).
                extra = _json(unit_fields(tags) | {k: v for k, v in fields.items() if k not in _EVENT_KEYS})
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

    #: A rewrite of an interval replaces its row (:meth:`write_intervals`).
    replaces_intervals = True

    def write_intervals(self, intervals: Sequence[IntervalSummary]) -> WriteResult:
        """Write (replace) each interval's one row, keyed by job id, tags and start; an interval
        whose values cannot be stored is refused (rejected) alone."""
        rows, result = [], WriteResult()
        for interval in intervals:
            try:
                self._checker.check(*interval_point(interval))
                rows.append((interval.job_id, _json(interval.tags), interval.start_ns, _json(interval.fields)))
            except (LineProtocolError, ValueError) as exc:
                result.rejected += 1
                result.reasons.append(f"interval of {clip(interval.job_id)}: {exc}")
        with self._lock:
            try:
                self._db.executemany("INSERT OR REPLACE INTO service_interval VALUES (?, ?, ?, ?)", rows)
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"SQLite {self.path}: {exc}") from exc
        result.written = len(rows)
        return result

    def close(self) -> None:
        with self._lock:
            self._db.close()
