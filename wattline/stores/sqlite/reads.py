"""What reports read from a SQLite store: the :class:`~.reader.Reader` queries and the job
summaries, as :class:`SqliteReads`, which :class:`~.sqlite.SqliteStore` inherits (its
connection, lock and path)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import sqlite3
import threading
from collections.abc import Collection, Sequence
from typing import Any

from wattline.stores.base import IntervalSummary, JobSummary, StoreUnavailable
from wattline.stores.reader import (
    StoredJobEvent,
    StoredSample,
    UnitCuts,
    counts_from_totals,
    evidence_ns,
    good_units,
    heard,
    jobs_near,
    reduce_units,
    units_from_totals,
    writer,
)
from wattline.stores.sqlite.schema import (
    _EVENT_COLUMNS,
    _READ_COLUMNS,
    _SERIES_KEY,
    _event_fields,
    _units_total,
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
#: Per span: its first two rows and its last.
_SPAN_EDGES = (
    f"(SELECT {_PACK} {_IN_SPAN} ORDER BY time_ns, event_seq LIMIT 1), "
    f"(SELECT {_PACK} {_IN_SPAN} ORDER BY time_ns, event_seq LIMIT 1 OFFSET 1), "
    f"(SELECT {_PACK} {_IN_SPAN} ORDER BY time_ns DESC, event_seq DESC LIMIT 1)"
)
#: ... and the sum of its units (inf when a row's units are not written as this store writes them).
_SPAN_SUM = (
    f"(SELECT SUM(CASE WHEN {_PLAIN_UNITS} THEN CAST(substr(fields, 10) AS REAL) "
    f"WHEN fields = '{{}}' THEN 0 ELSE 9e999 END) {_IN_SPAN})"
)
#: A host's writers of a job's UNITS events (their lowest and highest event_seq: one walk each
#: along the UNIQUE index, past the host's few other events at either end; min and max in one
#: SELECT would read every row) and the fields of its last UNITS event by event_seq.
_OF_UNITS = "FROM job_events WHERE host = ?1 AND job_id = ?2 AND event = 'units'"
_WRITERS = (
    f"SELECT (SELECT event_seq {_OF_UNITS} ORDER BY event_seq LIMIT 1), "
    f"(SELECT event_seq {_OF_UNITS} ORDER BY event_seq DESC LIMIT 1), "
    f"(SELECT fields {_OF_UNITS} ORDER BY event_seq DESC LIMIT 1)"
)
#: A host's UNITS rows in a span, packed, in order.
_SPAN = f"SELECT {_PACK} {_UNITS_OF} AND host = ? AND time_ns > ? AND time_ns <= ? ORDER BY time_ns, event_seq"


@functools.lru_cache(maxsize=8)
def _spans_query(n: int, summed: bool = True) -> str:
    """The statement of :meth:`SqliteStore.unit_events` for ``n`` spans (?1: the job id):
    per span its edges and (``summed``) its sum."""
    values = ", ".join(f"(?{3 * i + 2}, ?{3 * i + 3}, ?{3 * i + 4})" for i in range(n))
    columns = f"{_SPAN_EDGES}, {_SPAN_SUM}" if summed else f"{_SPAN_EDGES}, NULL"
    return f"WITH s(host, lo, hi) AS (VALUES {values}) SELECT {columns} FROM s"


def _packed(host: str, job_id: str, text: str) -> StoredJobEvent:
    t, seq, fields = text.split(" ", 2)
    return StoredJobEvent(host, job_id, "units", int(t), int(seq), _event_fields(fields))


def _total(text: str) -> float:
    """The ``units_total`` of a packed row (nan when it has none, so no difference of it adds up)."""
    value = _units_total(text.split(" ", 2)[2])
    return value if value is not None and good_units(value) else math.nan


def _one_instant(first: str, second: str) -> bool:
    """Whether two packed rows have one time."""
    return first.split(" ", 1)[0] == second.split(" ", 1)[0]


def _counted(event: StoredJobEvent, count: Any) -> StoredJobEvent:
    """``event`` counting ``count`` units (None: as stored)."""
    return event if count is None else dataclasses.replace(event, fields={**event.fields, "units": count})


def _stored(row: tuple[Any, ...]) -> StoredSample:
    """A row of ``_READ_COLUMNS`` as a StoredSample."""
    host, source, component, device, quality, start, end, energy, cumulative, stream, healthy, util, err, cores = row
    return StoredSample(
        *(host, source, component, device, quality, start, end, energy, cumulative, stream, bool(healthy), util, err),
        None if cores is None else int(cores),
    )


class SqliteReads:
    """The queries of :class:`~.sqlite.SqliteStore`, over its one connection behind its lock."""

    path: str
    _lock: threading.Lock
    _db: sqlite3.Connection

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

    def service_intervals(self, job_id: str, start_ns: int, end_ns: int) -> list[IntervalSummary]:
        """The job's ``service_interval`` points starting in [start_ns, end_ns), oldest first;
        its latency points (tag ``latency``) left out. A rewrite replaced its row: the newest form."""
        sql = (
            "SELECT tags, start_ns, fields FROM service_interval WHERE job_id = ? AND start_ns >= ? AND start_ns < ? "
            "AND json_extract(tags, '$.latency') IS NULL ORDER BY start_ns"
        )
        rows = self._rows(sql, [job_id, start_ns, end_ns])
        return [IntervalSummary(job_id, t, json.loads(tags), json.loads(fields)) for tags, t, fields in rows]

    # -- Reader (what reports need; see reader.py) -----------------------------------

    def job_events(self, job_id: str | None = None, every: bool = True) -> list[StoredJobEvent]:
        where, args = self._where(("job_id = ?", job_id))
        if every:  # UNITS events with their totals, for their units from totals
            sql = f"SELECT {_EVENT_COLUMNS} FROM job_events{where} ORDER BY time_ns, host, event_seq"
            return units_from_totals(self._events(sql, args, totals=True))
        if job_id is None:
            raise ValueError("job_events(every=False) reads one job")
        events = self._events(f"SELECT {_EVENT_COLUMNS} FROM job_events WHERE job_id = ? AND {_MARKS}", [job_id])
        beat = f"SELECT {_EVENT_COLUMNS} FROM job_events WHERE job_id = ? AND event = 'heartbeat' AND host = ? "
        for host in self._hosts_with(job_id, "heartbeat"):  # along job_events_beats
            first, last = (self._events(f"{beat}ORDER BY time_ns {d} LIMIT 1", [job_id, host]) for d in ("", "DESC"))
            events += first + (last if last != first else [])
        return sorted(events, key=lambda e: (e.time_ns, e.host, e.event_seq))

    def _events(self, sql: str, args: list[object], totals: bool = False) -> list[StoredJobEvent]:
        """The events of ``sql``'s rows; ``totals``: UNITS events with their ``units_total``."""
        out = []
        for host, job, event, t, seq, text in self._rows(sql, args):
            fields = _event_fields(text)
            if totals and event == "units" and (total := _units_total(text)) is not None:
                fields["units_total"] = total
            out.append(StoredJobEvent(host, job, event, t, seq, fields))
        return out

    def unit_events(self, job_id: str, cuts: UnitCuts) -> list[StoredJobEvent]:
        """Per host and span of ``cuts``, index lookups along job_events_units (its first rows,
        its last, :func:`reduce_units`), all in one statement: no row leaves SQLite but those,
        so a report's cost does not grow with the job's UNITS events. Where one writer wrote a
        host's UNITS events and each carries ``units_total`` (:meth:`_totalled`), their units
        come from the totals (:func:`counts_from_totals`: a span's the difference of two, and
        the units of events not stored count at the next stored one); else SQLite sums the
        span's rows."""
        bounds = [-(2**63), *cuts.instants, 2**63 - 1]
        edges = list(itertools.pairwise(bounds))
        hosts = self._hosts_with(job_id, "units")
        out: list[StoredJobEvent] = []
        totalled = [h for h in hosts if self._totalled(job_id, h)]
        found = self._span_rows(job_id, [(h, lo, hi) for h in totalled for lo, hi in edges], summed=False)
        summed = [h for h in hosts if h not in totalled]
        for i, host in enumerate(totalled):
            got = self._host_totals(job_id, host, edges, found[i * len(edges) : (i + 1) * len(edges)], cuts)
            if got is None:  # totals that do not add up: sum the rows
                summed.append(host)
            else:
                out += got
        found = self._span_rows(job_id, [(h, lo, hi) for h in summed for lo, hi in edges], summed=True)
        if any(total == math.inf for *_, total in found):  # units not as this store writes them
            return reduce_units(self._events(f"SELECT {_EVENT_COLUMNS} {_UNITS_OF}", [job_id]), cuts)
        for i, host in enumerate(summed):
            out += self._host_sums(job_id, host, edges, found[i * len(edges) : (i + 1) * len(edges)], cuts)
        return sorted(out, key=lambda e: (e.time_ns, e.host, e.event_seq))

    def _span_rows(self, job_id: str, spans: list[tuple[str, int, int]], summed: bool) -> list[tuple[Any, ...]]:
        found: list[tuple[Any, ...]] = []
        for i in range(0, len(spans), _SPANS_PER_QUERY):
            chunk = spans[i : i + _SPANS_PER_QUERY]
            found += self._rows(_spans_query(len(chunk), summed), [job_id, *itertools.chain.from_iterable(chunk)])
        return found

    def _totalled(self, job_id: str, host: str) -> bool:
        """Whether one writer (one event_seq base) wrote every UNITS event of ``job_id`` on ``host``
        and its last carries ``units_total``: then every one of them does, stamped in the order of
        their event_seq (see ``EventBuilder``). Three walks along the UNIQUE index."""
        ((low, high, last),) = self._rows(_WRITERS, [host, job_id])
        if last is None or writer(low) != writer(high):
            return False
        total = _units_total(last)
        return total is not None and good_units(total)

    def _host_totals(
        self, job_id: str, host: str, edges: list[tuple[int, int]], found: list[tuple[Any, ...]], cuts: UnitCuts
    ) -> list[StoredJobEvent] | None:
        """:func:`reduce_units` of ``host``'s UNITS events with their units from totals
        (:func:`counts_from_totals`), from each span's first two rows and its last: the first
        counts its total less the previous span's last, the last the rest of the span (its total
        less the first's). None when those totals do not add up."""
        out: list[StoredJobEvent] = []
        before = 0.0  # the writer's total before the span (0: nothing before its first event)
        for (lo, hi), (first, second, last, _) in zip(edges, found, strict=True):
            if first is None:
                continue
            if second is not None and _one_instant(first, second):  # events at one instant: read the span
                texts = [text for (text,) in self._rows(_SPAN, [job_id, host, lo, hi])]
                rows, totals = [_packed(host, job_id, t) for t in texts], [_total(t) for t in texts]
                counts = counts_from_totals([e.fields.get("units") for e in rows], totals, before)
                if counts is None:
                    return None
                out += reduce_units([_counted(e, c) for e, c in zip(rows, counts, strict=True)], cuts)
                before = totals[-1]
                continue
            texts = [first] if second is None else [first, last]
            events = [_packed(host, job_id, text) for text in texts]
            counts = counts_from_totals([e.fields.get("units") for e in events], [_total(t) for t in texts], before)
            if counts is None:
                return None
            out.append(_counted(events[0], counts[0]))
            if second is not None:  # the last carries the units of all but the first
                rest = counts[1] if second == last else _total(last) - _total(first)
                out.append(_counted(events[1], rest))
            before = _total(last)
        return out

    def _host_sums(
        self, job_id: str, host: str, edges: list[tuple[int, int]], found: list[tuple[Any, ...]], cuts: UnitCuts
    ) -> list[StoredJobEvent]:
        """:func:`reduce_units` of ``host``'s UNITS events from each span's first two rows, its last
        and its sum."""
        out: list[StoredJobEvent] = []
        for (lo, hi), (first, second, last, total) in zip(edges, found, strict=True):
            if first is None:
                continue
            head = _packed(host, job_id, first)
            if second is None:
                out.append(head)
            elif _one_instant(first, second):  # events at one instant: read the span
                sql = f"SELECT {_EVENT_COLUMNS} {_UNITS_OF} AND host = ? AND time_ns > ? AND time_ns <= ?"
                out += reduce_units(self._events(sql, [job_id, host, lo, hi]), cuts)
            elif second == last:  # two events
                out += [head, _packed(host, job_id, last)]
            else:  # the last one carries the units of all but the first
                rest = total - float(head.fields.get("units", 0))
                out += [head, _counted(_packed(host, job_id, last), rest)]
        return out

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
        events += heard(events, self._last_heard, self._first_heard)
        return sorted(events, key=lambda e: (e.time_ns, e.host, e.event_seq))

    def _first_heard(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Each (job, host)'s earliest evidence: its first event (along job_events_job, as
        :meth:`_last_heard`), or its first USE event's period start (along job_events_marks)."""
        first = "SELECT time_ns FROM job_events WHERE job_id = ? AND +host = ? ORDER BY time_ns LIMIT 1"
        use = (
            f"SELECT {_EVENT_COLUMNS} FROM job_events WHERE job_id = ? AND event = 'use' AND {_MARKS} "
            "AND +host = ? ORDER BY time_ns LIMIT 1"
        )
        out: dict[tuple[str, str], int] = {}
        for job_id, host in pairs:
            times = [t for (t,) in self._rows(first, [job_id, host])]
            times += [evidence_ns(e) for e in self._events(use, [job_id, host])]
            if times:
                out[job_id, host] = min(times)
        return out

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

    def around(self, host: str, instants: Sequence[int]) -> list[tuple[list[StoredSample], list[StoredSample]]]:
        return [(self.last_before(host, t), self.first_after(host, t)) for t in instants]

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
