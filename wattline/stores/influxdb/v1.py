"""InfluxDB 1.x back-end: ``POST /write`` of our line protocol, InfluxQL ``/query``.

Kept-alive ``http.client`` connections (a small pool, so the collector's threads write
in parallel), no extra dependency. The database is created (``CREATE DATABASE``,
idempotent) before the first write, and again if a write answers "database not found".

Credentials (arguments, or ``http://user:password@host`` in the URL) go in a Basic
``Authorization`` header and never into messages.

Errors: connection failures, timeouts, 5xx, 401/403/404 and unexpected answers raise
:class:`StoreUnavailable`; a 400 naming unparsable or refused points (``partial write:
... dropped=N``, field type conflicts) counts those points as rejected, with InfluxDB's
message as the reason; the other points of the batch are written.
"""

from __future__ import annotations

import dataclasses
import logging
import urllib.parse
from collections.abc import Collection, Sequence
from typing import Any

from wattline.config import ConfigError
from wattline.stores.base import IntervalSummary, JobSummary, StoreUnavailable, WriteResult
from wattline.stores.influxdb.http import HttpClient, error_message, loads, rejected_points, shorten
from wattline.stores.influxdb.linestore import LineProtocolStore
from wattline.stores.influxdb.rows import (
    good_unit_rows,
    interval_points,
    reduce_unit_rows,
    stored_samples,
    unit_rows,
)
from wattline.stores.influxdb.rows import job_events as job_events_of
from wattline.stores.influxdb.rows import unit_events as unit_events_of
from wattline.stores.lineprotocol import LineEncoder
from wattline.stores.reader import (
    MAX_INTERVAL_NS,
    StoredJobEvent,
    StoredSample,
    UnitCuts,
    evidence_ns,
    heard,
    jobs_near,
    units_from_totals,
)
from wattline.stores.schema import JOB_SUMMARY, JOB_SUMMARY_HOST, SERVICE_INTERVAL

log = logging.getLogger(__name__)

#: Largest request body; a bigger batch goes out in several requests (InfluxDB's
#: default ``max-body-size`` is 25 MB).
MAX_BODY_BYTES = 4 << 20


class QueryError(ValueError):
    """InfluxDB refused a query (syntax, unknown database...), or the server answers no
    InfluxQL at all (VictoriaMetrics); retrying cannot help."""


_READ_FIELDS = "energy_j, cumulative_j, start_ns, stream, healthy, utilization, energy_error_j, neuroncores_per_device"
_FIRST, _LAST = " ORDER BY time ASC LIMIT 1", " ORDER BY time DESC LIMIT 1"


def quote_ident(name: str) -> str:
    """An InfluxQL identifier in double quotes."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quote_literal(value: str) -> str:
    """An InfluxQL string literal in single quotes (for ``WHERE tag = '...'``)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


class InfluxV1Store(LineProtocolStore):
    """Writes batches to one InfluxDB 1.x database (timestamps in ns)."""

    kind = "influxdb1"

    def __init__(
        self,
        url: str,
        database: str,
        username: str | None = None,
        password: str | None = None,
        retention_policy: str | None = None,
        timeout_s: float = 10.0,
        encoder: LineEncoder | None = None,
    ) -> None:
        if not database:
            raise ValueError("InfluxDB database name is empty")
        self.database = database
        self.retention_policy = retention_policy
        self.encoder = encoder or LineEncoder()
        self._http = HttpClient(url, timeout_s, username, password)
        self.url = self._http.url
        params = {"db": database, "precision": "ns"}
        if retention_policy:
            params["rp"] = retention_policy
        self._write_path = "/write?" + urllib.parse.urlencode(params)
        self._created = False

    def __repr__(self) -> str:
        return f"InfluxV1Store({self.url!r}, database={self.database!r})"

    def write_lines(self, lines: Sequence[str]) -> WriteResult:
        """Write already-encoded points (several requests if the body would be too large)."""
        result = WriteResult()
        if not lines:
            return result
        if not self._created:
            self.create_database()
        chunk: list[str] = []
        size = 0
        for line in lines:
            if chunk and size + len(line) >= MAX_BODY_BYTES:
                self._post(chunk, result)
                chunk, size = [], 0
            chunk.append(line)
            size += len(line) + 1
        self._post(chunk, result)
        return result

    def _post(self, lines: list[str], result: WriteResult) -> None:
        body = "\n".join(lines).encode()
        for attempt in (0, 1):
            status, headers, data = self._http.request("POST", self._write_path, body)
            if 200 <= status < 300:
                result.written += len(lines)
                return
            full = error_message(data, headers)
            message = shorten(full)
            if status == 404 and "database not found" in message and attempt == 0:
                self.create_database()
                continue
            rejected = rejected_points(full, len(lines)) if status == 400 else None
            if rejected is None:
                raise StoreUnavailable(f"InfluxDB {self.url} write answered {status}: {message}")
            log.warning("InfluxDB %s refused %d of %d points: %s", self.url, rejected, len(lines), message)
            result.written += len(lines) - rejected
            result.rejected += rejected
            result.reasons.append(message)
            return

    def create_database(self) -> None:
        """``CREATE DATABASE`` (a no-op when it exists).

        A refusal (a user without admin rights) is only logged: the database may exist.
        """
        try:
            self._query(f"CREATE DATABASE {quote_ident(self.database)}", None)
        except QueryError as exc:
            log.warning("InfluxDB %s: cannot create database %r: %s", self.url, self.database, exc)
        self._created = True

    def check_readable(self) -> None:
        """ConfigError when the database a report would read does not exist (its queries would
        just find nothing), or the server answers no InfluxQL (VictoriaMetrics)."""
        try:
            self.query("SELECT time_ns FROM job_events LIMIT 1")
        except QueryError as exc:
            if "database not found" in str(exc):
                raise ConfigError(
                    f"InfluxDB {self.url} has no database {self.database[:100]!r} (--influx-database)"
                ) from None
            if "answers no InfluxQL" in str(exc):
                raise ConfigError(str(exc)) from None
            raise RuntimeError(f"InfluxDB {self.url}: {exc}") from None

    def query(self, influxql: str) -> list[dict[str, Any]]:
        """Run InfluxQL on this database; every row of every series as a dict (series tags merged in).

        Times are integer ns (``epoch=ns``); numbers are as InfluxDB's JSON gives them (a
        float field holding 3.0 comes back as ``3``). Raises :class:`QueryError` for a
        refused query, :class:`StoreUnavailable` when the server is unreachable or failing.
        """
        return self._query(influxql, self.database)

    def _query(self, influxql: str, database: str | None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for statement in self._statements(influxql, database):
            for series in statement:
                tags = series.get("tags", {})
                columns = series["columns"]
                rows.extend({**tags, **dict(zip(columns, values, strict=True))} for values in series.get("values", []))
        return rows

    def _statements(self, influxql: str, database: str | None) -> list[list[dict[str, Any]]]:
        """Per statement of ``influxql`` (several may be sent at once, ``;``-separated): its
        series as InfluxDB's JSON gives them (``tags``, ``columns``, ``values``)."""
        params = {"q": influxql, "epoch": "ns"}
        if database is not None:
            params["db"] = database
        body = urllib.parse.urlencode(params).encode()
        status, headers, data = self._http.request(
            "POST", "/query", body, {"Content-Type": "application/x-www-form-urlencoded"}
        )
        if status >= 500 or status == 401:
            raise StoreUnavailable(
                f"InfluxDB {self.url} query answered {status}: {shorten(error_message(data, headers))}"
            )
        if status != 200:
            raise QueryError(shorten(f"{influxql!r}: {error_message(data, headers)}"))
        out: list[list[dict[str, Any]]] = []
        for result in loads(data).get("results", []):
            if "error" in result:
                raise QueryError(shorten(f"{influxql!r}: {result['error']}"))
            series = result.get("series", [])
            if not influxql.lstrip().upper().startswith("SHOW") and any(s.get("name") == "databases" for s in series):
                # VictoriaMetrics answers every /query with a database list (for Grafana's "test").
                raise QueryError(
                    f"{self.url} answers no InfluxQL (VictoriaMetrics answers every query with its database list): "
                    "reports, job summaries and the dashboards read from InfluxDB 1.x (or SQLite)"
                )
            out.append(series)
        return out

    # -- Reader (what reports need; see reader.py) -----------------------------------

    def job_events(self, job_id: str | None = None, every: bool = True) -> list[StoredJobEvent]:
        where = f"job_id = {quote_literal(job_id)} AND " if job_id is not None else ""
        if not every:
            if job_id is None:
                raise ValueError("job_events(every=False) reads one job")
            return self._marks(job_id)
        # UNITS events (most of a long job's events) with only their two fields; the others
        # with every field. GROUP BY keeps the tags out of each row.
        others = f"SELECT * FROM job_events WHERE {where}event != 'units' GROUP BY *"
        found, series = self._statements(f"{self._units_query(where)}; {others}", self.database)
        events = units_from_totals(job_events_of(series) + unit_events_of(found))
        return sorted(events, key=lambda e: (e.time_ns, e.host, e.event_seq))

    def unit_events(self, job_id: str, cuts: UnitCuts) -> list[StoredJobEvent]:
        """Every UNITS row of the job (units and time_ns; event_seq where an older version
        wrote rows that do not give it), reduced here as :func:`reduce_units` does, by slices
        of each host's rows (:func:`.influx_rows.reduce_unit_rows`, no event object for a row
        the reduction drops); each host's units from its writer's totals where they say them
        (:meth:`.influx_rows.UnitRows.from_totals`)."""
        where = f"job_id = {quote_literal(job_id)} AND "
        (found,) = self._statements(self._units_query(where, "units, units_total, time_ns", "seq_block"), self.database)
        read = unit_rows(found)
        if read is None:
            (found,) = self._statements(self._units_query(where), self.database)
            read = unit_rows(found)
            assert read is not None
        hosts = {host: rows.from_totals() for host, rows in read.items()}
        if not all(good_unit_rows(rows) for rows in hosts.values()):  # the view says what is wrong
            every = [e for host, rows in hosts.items() for e in reduce_unit_rows(job_id, host, rows, None)]
            return sorted(every, key=lambda e: (e.time_ns, e.host, e.event_seq))
        out = [e for host, rows in hosts.items() for e in reduce_unit_rows(job_id, host, rows, cuts.instants)]
        return sorted(out, key=lambda e: (e.time_ns, e.host, e.event_seq))

    def _marks(self, job_id: str) -> list[StoredJobEvent]:
        """The events but UNITS and heartbeats, and a heartbeat at each host's first and last:
        ``min``/``max(time_ns)`` (the true time), else the point time of ``first``/``last``
        (points written before time_ns existed)."""
        where = f"job_id = {quote_literal(job_id)} AND "
        beats = f"FROM job_events WHERE {where}event = 'heartbeat' GROUP BY host"
        series, *kinds = self._statements(
            f"SELECT * FROM job_events WHERE {where}event != 'units' AND event != 'heartbeat' GROUP BY *; "
            f"SELECT min(time_ns) {beats}; SELECT max(time_ns) {beats}; "
            f"SELECT first(event_seq) {beats}; SELECT last(event_seq) {beats}",
            self.database,
        )
        times: dict[tuple[str, int], int] = {}
        for k, (found, column) in enumerate(zip(kinds, ("min", "max", "time", "time"), strict=True)):
            for one in found:
                i = one["columns"].index(column)
                for values in one.get("values", []):
                    if values[i] is not None:
                        times.setdefault((one["tags"]["host"], k % 2), int(values[i]))  # the true time first
        heard = sorted({(t, host) for (host, _), t in times.items()})
        events = job_events_of(series) + [StoredJobEvent(host, job_id, "heartbeat", t, 0) for t, host in heard]
        return sorted(events, key=lambda e: (e.time_ns, e.host, e.event_seq))

    @staticmethod
    def _units_query(where: str, fields: str = "units, units_total, event_seq, time_ns", by: str = "job_id") -> str:
        return f"SELECT {fields} FROM job_events WHERE {where}event = 'units' GROUP BY host, {by}"

    def job_events_between(self, start_ns: int, end_ns: int, hosts: Collection[str]) -> list[StoredJobEvent]:
        ids = sorted(jobs_near(self._job_ids, start_ns, end_ns, hosts))
        events: list[StoredJobEvent] = []
        for i in range(0, len(ids), 100):
            which = " OR ".join(f"job_id = {quote_literal(job_id)}" for job_id in ids[i : i + 100])
            (series,) = self._statements(
                f"SELECT * FROM job_events WHERE ({which}) AND (event = 'open' OR event = 'close') GROUP BY *",
                self.database,
            )
            events += job_events_of(series)
        events += heard(events, self._last_heard, self._first_heard)
        return sorted(events, key=lambda e: (e.time_ns, e.host, e.event_seq))

    def _first_heard(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Each (job, host)'s earliest evidence: ``min(time_ns)`` (else the point time of
        ``first()``: points written before time_ns existed), or its first USE event's period
        start if earlier."""
        out: dict[tuple[str, str], int] = {}
        ids = sorted({job_id for job_id, _ in pairs})
        for i in range(0, len(ids), 100):
            which = " OR ".join(f"job_id = {quote_literal(job_id)}" for job_id in ids[i : i + 100])
            first, true, use = self._statements(
                f"SELECT first(event_seq) FROM job_events WHERE ({which}) GROUP BY host, job_id; "
                f"SELECT min(time_ns) FROM job_events WHERE ({which}) GROUP BY host, job_id; "
                f"SELECT time_ns, period_ns FROM job_events WHERE ({which}) AND event = 'use' "
                "GROUP BY host, job_id LIMIT 1",
                self.database,
            )
            for series_list, column in ((first, "time"), (true, "min")):  # the true time wins
                for series in series_list:
                    i_value = series["columns"].index(column)
                    for values in series.get("values", []):
                        if values[i_value] is not None:
                            out[series["tags"]["job_id"], series["tags"]["host"]] = int(values[i_value])
            for e in job_events_of(use):
                key = (e.job_id, e.host)
                out[key] = min(out.get(key, e.time_ns), evidence_ns(dataclasses.replace(e, event="use")))
        return {pair: out[pair] for pair in pairs if pair in out}

    def _last_heard(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Time of each (job, host)'s latest event, one row each: ``max(time_ns)`` (the true
        event time), else the point time of ``last()`` (points written before time_ns existed)."""
        out: dict[tuple[str, str], int] = {}
        ids = sorted({job_id for job_id, _ in pairs})
        for i in range(0, len(ids), 100):
            which = " OR ".join(f"job_id = {quote_literal(job_id)}" for job_id in ids[i : i + 100])
            last, true = self._statements(
                f"SELECT last(event_seq) FROM job_events WHERE ({which}) GROUP BY host, job_id; "
                f"SELECT max(time_ns) FROM job_events WHERE ({which}) GROUP BY host, job_id",
                self.database,
            )
            for series_list, column in ((last, "time"), (true, "max")):  # the true time wins
                for series in series_list:
                    i_value = series["columns"].index(column)
                    for values in series.get("values", []):
                        if values[i_value] is not None:
                            out[series["tags"]["job_id"], series["tags"]["host"]] = int(values[i_value])
        return {pair: out[pair] for pair in pairs if pair in out}

    def _job_ids(self, event: str, hosts: Collection[str], since_ns: int, until_ns: int) -> set[str]:
        """Jobs with an ``event`` on one of ``hosts`` in [since_ns, until_ns]: one row per job."""
        which = " OR ".join(f"host = {quote_literal(host)}" for host in sorted(hosts))
        rows = self.query(
            f"SELECT last(event_seq) FROM job_events WHERE event = {quote_literal(event)} AND ({which}) "
            f"AND time >= {since_ns} AND time <= {until_ns} GROUP BY job_id"
        )
        return {row["job_id"] for row in rows}

    def samples(self, host: str, start_ns: int, end_ns: int) -> list[StoredSample]:
        condition = f"time > {start_ns} AND time < {end_ns + MAX_INTERVAL_NS} AND start_ns < {end_ns}"
        return sorted(self._read(host, condition, ""), key=lambda s: s.end_ns)

    def first_after(self, host: str, t_ns: int) -> list[StoredSample]:
        return self._read(host, f"time >= {t_ns}", _FIRST)

    def last_before(self, host: str, t_ns: int) -> list[StoredSample]:
        return self._read(host, f"time <= {t_ns}", _LAST)

    def around(self, host: str, instants: Sequence[int]) -> list[tuple[list[StoredSample], list[StoredSample]]]:
        """Every instant's two edge queries in one request (``;``-separated statements)."""
        if not instants:
            return []
        statements = []
        for t in instants:
            statements += [self._select(host, f"time <= {t}", _LAST), self._select(host, f"time >= {t}", _FIRST)]
        found = [stored_samples(host, series) for series in self._statements("; ".join(statements), self.database)]
        return [(found[2 * i], found[2 * i + 1]) for i in range(len(instants))]

    @staticmethod
    def _select(host: str, condition: str, tail: str) -> str:
        return (
            f"SELECT {_READ_FIELDS} FROM energy WHERE host = {quote_literal(host)} AND {condition} "
            f"GROUP BY source, component, device, quality{tail}"
        )

    def _read(self, host: str, condition: str, tail: str) -> list[StoredSample]:
        return [
            sample
            for series in self._statements(self._select(host, condition, tail), self.database)
            for sample in stored_samples(host, series)
        ]

    # -- job summaries (one point per job, rewritten in place) ---------------------------

    def write_summary(self, summary: JobSummary) -> WriteResult:
        """Write ``summary``; first delete the job's stored points when the new ones would not
        overwrite them all (another start time, a field or host no longer there, or several
        points: two collectors raced), so one point per job remains however its figures change."""
        if not self._created:
            self.create_database()
        found = self._summaries(summary.job_id)
        old = found[0] if len(found) == 1 else None
        if len(found) > 1 or (
            old is not None
            and (
                old.time_ns != summary.time_ns
                or old.tags != summary.tags
                or not set(old.fields) <= set(summary.fields)
                or not set(old.hosts) <= set(summary.hosts)
            )
        ):
            job = quote_literal(summary.job_id)
            self._statements(
                f"DELETE FROM {JOB_SUMMARY} WHERE job_id = {job}; DELETE FROM {JOB_SUMMARY_HOST} WHERE job_id = {job}",
                self.database,
            )
        return super().write_summary(summary)

    def job_summary(self, job_id: str) -> JobSummary | None:
        """The stored summary of ``job_id`` (None when there is none)."""
        found = self._summaries(job_id)
        if len(found) > 1:
            raise QueryError(f"{len(found)} job_summary points for job {job_id[:100]!r}; expected one")
        return found[0] if found else None

    def _summaries(self, job_id: str) -> list[JobSummary]:
        """Every stored ``job_summary`` point of ``job_id`` (one, unless something went wrong)."""
        job = quote_literal(job_id)
        points, hosts = self._statements(
            f"SELECT * FROM {JOB_SUMMARY} WHERE job_id = {job} GROUP BY *; "
            f"SELECT energy_j FROM {JOB_SUMMARY_HOST} WHERE job_id = {job} GROUP BY host",
            self.database,
        )
        energy = {s["tags"]["host"]: float(v[1]) for s in hosts for v in s.get("values", []) if v[1] is not None}
        out = []
        for series in points:
            tags = {k: v for k, v in series["tags"].items() if k != "job_id" and v}
            for values in series.get("values", []):
                fields = {k: v for k, v in zip(series["columns"], values, strict=True) if v is not None}
                out.append(JobSummary(job_id, int(fields.pop("time")), tags, fields, energy))
        return out

    def service_intervals(self, job_id: str, start_ns: int, end_ns: int) -> list[IntervalSummary]:
        """The job's ``service_interval`` points starting in [start_ns, end_ns) (a rewrite is the same
        series and time: the newest form), its latency points left out."""
        query = f"SELECT * FROM {SERVICE_INTERVAL} WHERE job_id = {quote_literal(job_id)} AND latency = '' "
        (series,) = self._statements(f"{query}AND time >= {start_ns} AND time < {end_ns} GROUP BY *", self.database)
        return interval_points(job_id, series)

    def ping(self) -> str:
        """The server's ``X-Influxdb-Version`` header ("" when it sends none)."""
        status, headers, data = self._http.request("GET", "/ping")
        if status >= 300:
            raise StoreUnavailable(
                f"InfluxDB {self.url} /ping answered {status}: {shorten(error_message(data, headers))}"
            )
        return headers.get("X-Influxdb-Version", "")

    def close(self) -> None:
        self._http.close()
