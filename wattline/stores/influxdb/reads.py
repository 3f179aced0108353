"""What reports read from InfluxDB 1.x, in InfluxQL: the :class:`~.reader.Reader` queries and
the job summaries and service intervals, as :class:`InfluxV1Reads`, which
:class:`~.v1.InfluxV1Store` inherits (its database and connections)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from wattline.config import ConfigError
from wattline.stores.base import IntervalSummary, JobSummary
from wattline.stores.influxdb.influxql import InfluxQLClient, QueryError, quote_literal
from wattline.stores.influxdb.rows import (
    good_unit_rows,
    interval_points,
    reduce_unit_rows,
    stored_samples,
    unit_rows,
)
from wattline.stores.influxdb.rows import job_events as job_events_of
from wattline.stores.influxdb.rows import unit_events as unit_events_of
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

_READ_FIELDS = "energy_j, cumulative_j, start_ns, stream, healthy, utilization, energy_error_j, neuroncores_per_device"
_FIRST, _LAST = " ORDER BY time ASC LIMIT 1", " ORDER BY time DESC LIMIT 1"


class InfluxV1Reads(InfluxQLClient):
    """The :class:`~.reader.Reader` queries and the summaries' reads of one InfluxDB 1.x database."""

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
        of each host's rows (:func:`.rows.reduce_unit_rows`, no event object for a row
        the reduction drops); each host's units from its writer's totals where they say them
        (:meth:`.rows.UnitRows.from_totals`)."""
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

    # -- job summaries and service intervals ---------------------------------------------

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
