"""How :mod:`.series_reads` gets raw samples out of an engine that serves the Prometheus HTTP
API: one small interface, :class:`SeriesApi`, with two implementations.

- :class:`Export` (VictoriaMetrics): ``/api/v1/export`` gives a time range's raw samples, and
  MetricsQL's ``tlast_over_time``/``tfirst_over_time`` a series' edge sample's time stamp.
- :class:`RangeQuery` (Prometheus, Grafana Mimir, Thanos Query; :mod:`.prometheus`): only the
  query API. A range selector ``sel[RANGE]`` evaluated by ``/api/v1/query`` at an instant
  returns the raw samples of that range, so a time range is read that way; a range holding
  more samples than the engine loads for one query (Prometheus ``--query.max-samples``,
  50 million by default) is read in halves. A series' edge sample is found with a subquery
  (:meth:`RangeQuery.edges`).

Both read the raw samples exactly: millisecond time stamps and float64 values as stored.
"""

from __future__ import annotations

import abc
import json
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from wattline.stores.base import StoreUnavailable
from wattline.stores.influxdb.http import HttpClient, loads, shorten
from wattline.stores.schema import ENERGY, JOB_EVENTS, JOB_SUMMARY, JOB_SUMMARY_HOST
from wattline.stores.series.points import MS

Labels = tuple[tuple[str, str], ...]
#: Points of one measurement: labels (no metric name) -> ms time stamp -> field -> value.
Points = dict[Labels, dict[int, dict[str, float]]]
#: A series' edge sample lies in [lo_ns, hi_ns] (:meth:`SeriesApi.edges`).
Edge = tuple[dict[str, str], int, int]


class QueryError(ValueError):
    """The server refused a query, or answers not as the Prometheus API does; retrying cannot help."""


def quote(value: str) -> str:
    """A PromQL / MetricsQL string literal."""
    return json.dumps(value, ensure_ascii=False)


def seconds(t_ns: int, up: bool = False) -> str:
    """``t_ns`` as the seconds the Prometheus API takes, to the millisecond (rounded down, or up)."""
    ms = -(-t_ns // MS) if up else t_ns // MS
    return f"{ms // 1000}.{ms % 1000:03d}"


def split_name(name: str) -> tuple[str, str]:
    """(measurement, field) of a metric name; the measurements are wattline's own."""
    for measurement in (JOB_SUMMARY_HOST, JOB_SUMMARY, JOB_EVENTS, ENERGY):
        if name.startswith(measurement + "_"):
            return measurement, name[len(measurement) + 1 :]
    return "", name


class SeriesApi(abc.ABC):
    """The Prometheus HTTP API of one engine, under ``prefix`` at its URL, and how raw samples
    are read there."""

    #: Arguments every instant query carries (:meth:`instant`).
    instant_args: tuple[tuple[str, str], ...] = ()

    def __init__(self, http: HttpClient, prefix: str = "", engine: str = "") -> None:
        self._http = http
        self._prefix = prefix
        self.engine = engine
        self.url = http.url

    def get(self, path: str, params: list[tuple[str, str]]) -> bytes:
        status, _, data = self._http.request("GET", f"{self._prefix}{path}?{urllib.parse.urlencode(params)}")
        message = shorten(data.decode("utf-8", "replace").strip())
        if status >= 500 or status in (401, 403, 429):
            raise StoreUnavailable(f"{self.engine} {self.url} {path} answered {status}: {message}")
        if status != 200:
            raise QueryError(f"{self.url}{path} answered {status}: {message}")
        return data

    def _data(self, path: str, params: list[tuple[str, str]]) -> Any:
        """The ``data`` of a Prometheus API answer."""
        doc = loads(self.get(path, params))
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise QueryError(f"{self.url} answers {path} not as the Prometheus API does")
        return doc["data"]

    def instant(self, query: str, t_ns: int) -> list[tuple[dict[str, str], float]]:
        """An instant query's vector: (labels, value) per series."""
        found = self._data("/api/v1/query", [("query", query), ("time", seconds(t_ns)), *self.instant_args])
        return [(self.labels(r["metric"]), float(r["value"][1])) for r in found["result"]]

    def series(self, match: str, start_ns: int, end_ns: int) -> list[dict[str, str]]:
        """The labels of the series ``match`` selects with samples in [start_ns, end_ns] (at
        least: an engine may answer by block)."""
        params = [("match[]", match), ("start", seconds(max(start_ns, 0))), ("end", seconds(end_ns, up=True))]
        return [self.labels(found) for found in self._data("/api/v1/series", params)]

    def labels(self, found: dict[str, str]) -> dict[str, str]:
        """A series' labels as written (:class:`RangeQuery` undoes the escaping of names)."""
        return found

    @abc.abstractmethod
    def raw(self, matches: Sequence[str], start_ns: int | None = None, end_ns: int | None = None) -> dict[str, Points]:
        """Raw samples of the series ``matches`` select in [start_ns, end_ns] (ms precision;
        None: as far as the engine holds), by measurement ``{name: points}``."""

    @abc.abstractmethod
    def edges(self, selector: str, t_ns: int, before: bool, far_ns: int) -> list[Edge]:
        """Per series of ``selector``: where its last sample at or before ``t_ns`` (``before``),
        else its first after, within ``far_ns``, lies: (labels, lo_ns, hi_ns). Exact to the
        millisecond where the engine says (VictoriaMetrics), else a span that holds it."""


def _add(out: dict[str, Points], name: str, labels: dict[str, str], pairs: Any) -> None:
    measurement, field = split_name(name)
    per_time = out[measurement].setdefault(tuple(sorted(labels.items())), {})
    for t, value in pairs:
        per_time.setdefault(t, {})[field] = float(value)


#: A label no series has: a selector matches the same series with ``FRESH_LABEL!="<second>"``
#: added, under a key of its own each second (:meth:`Export.fresh`).
FRESH_LABEL = "wattline_read"


class Export(SeriesApi):
    """VictoriaMetrics: ``/api/v1/export`` and MetricsQL.

    VictoriaMetrics keeps the series a set of label filters selected in a cache. A new series
    (a job's open or close) is searchable a moment after VictoriaMetrics took it, but a set of
    filters asked for before that keeps its stale answer until the cache is reset, seconds
    later (docs/storage.md), so ``job_id!=""`` may show a job's close that ``job_id="J"`` does
    not yet. Every selector here carries a matcher that names the current second
    (:meth:`fresh`), so a stale answer lives at most that second.

    An instant query whose time lies within ``-search.latencyOffset`` of now (30 s by default,
    at least 1 s before 1.88) is evaluated at now minus that offset unless it carries
    ``nocache=1``; 1.79 takes no ``latency_offset`` argument (1.85.2 added it). So every
    instant query here carries ``nocache=1`` (it also skips the response cache); export and
    series lookups know no offset.
    """

    instant_args = (("nocache", "1"),)

    @staticmethod
    def fresh(selector: str) -> str:
        """``selector`` (``{...}`` or ``name{...}``) with a matcher every series passes,
        ``FRESH_LABEL!="<current second>"``."""
        if not selector.endswith("}"):
            raise ValueError(f"not a series selector: {selector[:100]!r}")
        comma = "" if selector.endswith("{}") else ","
        return f'{selector[:-1]}{comma}{FRESH_LABEL}!="{time.time_ns() // 10**9}"}}'

    def series(self, match: str, start_ns: int, end_ns: int) -> list[dict[str, str]]:
        return super().series(self.fresh(match), start_ns, end_ns)

    def raw(self, matches: Sequence[str], start_ns: int | None = None, end_ns: int | None = None) -> dict[str, Points]:
        params = [("match[]", self.fresh(m)) for m in matches]
        if start_ns is not None:
            params.append(("start", seconds(start_ns)))
        if end_ns is not None:
            params.append(("end", seconds(end_ns, up=True)))
        out: dict[str, Points] = defaultdict(dict)
        for line in self.get("/api/v1/export", params).splitlines():
            if not line.strip():
                continue
            try:
                doc = loads(line)
                labels = dict(doc["metric"])
                name = labels.pop("__name__")
                pairs = [(int(t), v) for t, v in zip(doc["timestamps"], doc["values"], strict=True)]
            except (ValueError, KeyError, TypeError):
                raise QueryError(f"{self.url} answers /api/v1/export not as VictoriaMetrics does") from None
            _add(out, name, labels, pairs)
        return out

    def edges(self, selector: str, t_ns: int, before: bool, far_ns: int) -> list[Edge]:
        far = f"{far_ns // MS}ms"
        selector = self.fresh(selector)
        if before:
            found = self.instant(f"tlast_over_time({selector}[{far}])", t_ns)
        else:
            found = self.instant(f"tfirst_over_time({selector}[{far}])", t_ns + far_ns)
        return [(labels, round(v * 1000) * MS, round(v * 1000) * MS + MS - 1) for labels, v in found]


#: Errors of a query that loaded more samples than the engine allows (Prometheus, Mimir,
#: Thanos): the range is read in halves instead.
TOO_MANY_SAMPLES = ("too many samples", "maximum number of samples", "max samples")
#: How far back a read with no start looks (a Prometheus API query needs a range).
HORIZON_NS = 10 * 366 * 86400 * 10**9
#: A read with no end reads up to this far past now (agents' clocks may run ahead).
AHEAD_NS = 86400 * 10**9


class RangeQuery(SeriesApi):
    """Prometheus, Mimir, Thanos: range selectors at an instant through ``/api/v1/query``.

    ``step_ns``: the subquery step of :meth:`edges`; the engine's lookback (Prometheus
    ``--query.lookback-delta``, 5 minutes by default) must be at least as long.
    ``unescape``: turns a label or metric name as stored back into the name written.
    """

    def __init__(
        self, http: HttpClient, prefix: str, engine: str, step_ns: int, unescape: Callable[[str], str]
    ) -> None:
        super().__init__(http, prefix, engine)
        self._step_ns = step_ns
        self._unescape = unescape

    def labels(self, found: dict[str, str]) -> dict[str, str]:
        return {self._unescape(k): v for k, v in found.items()}

    def raw(self, matches: Sequence[str], start_ns: int | None = None, end_ns: int | None = None) -> dict[str, Points]:
        end_ms = -(-(time.time_ns() + AHEAD_NS if end_ns is None else end_ns) // MS)
        start_ms = (end_ms * MS - HORIZON_NS if start_ns is None else start_ns) // MS
        out: dict[str, Points] = defaultdict(dict)
        for match in matches:  # a range vector takes no `or`: one query each
            self._range(out, match, start_ms, end_ms)
        return out

    def _range(self, out: dict[str, Points], match: str, start_ms: int, end_ms: int) -> None:
        """Samples of ``match`` in [start_ms, end_ms] into ``out``; in halves when too many."""
        # [start, end] whatever the engine's closure of the range (Prometheus 3 leaves its start out).
        query = f"{match}[{end_ms - start_ms + 1}ms]"
        try:
            found = self._data("/api/v1/query", [("query", query), ("time", seconds(end_ms * MS))])
        except QueryError as exc:
            if end_ms > start_ms and any(s in str(exc).lower() for s in TOO_MANY_SAMPLES):
                middle = (start_ms + end_ms) // 2
                self._range(out, match, start_ms, middle)
                self._range(out, match, middle + 1, end_ms)
                return
            raise
        if found.get("resultType") != "matrix":
            raise QueryError(f"{self.url} answers a range selector with {found.get('resultType')!r}, not a matrix")
        for series in found["result"]:
            labels = self.labels(series["metric"])
            name = labels.pop("__name__", "")
            pairs = [(ms, v) for t, v in series["values"] if start_ms <= (ms := round(float(t) * 1000)) <= end_ms]
            _add(out, name, labels, pairs)

    def edges(self, selector: str, t_ns: int, before: bool, far_ns: int) -> list[Edge]:
        """A subquery of ``timestamp(selector)`` every ``step_ns``: each step sees its series'
        latest sample within the lookback. So the greatest seen up to ``t_ns`` is the last
        sample up to the last step (callers read the step before ``t_ns`` themselves), and the
        least seen from ``t_ns`` on is at most a step past the first sample there."""
        found: dict[Labels, float] = {}
        lo, hi = (t_ns - far_ns, t_ns) if before else (t_ns, t_ns + far_ns)
        self._edges(found, selector, t_ns, lo // MS, hi // MS, before)
        out = []
        for labels, value in found.items():
            ms = round(value * 1000)
            out.append((dict(labels), ms * MS if before else max(t_ns, ms * MS - self._step_ns), ms * MS + MS - 1))
        return out

    def _edges(
        self, found: dict[Labels, float], selector: str, t_ns: int, lo_ms: int, hi_ms: int, before: bool
    ) -> None:
        """:meth:`edges` over the steps in [lo_ms, hi_ms] into ``found``; in halves when the
        subquery holds more points than the engine allows (series x steps)."""
        window, step = f"{hi_ms - lo_ms + 1}ms", f"{self._step_ns // MS}ms"
        if before:
            query = f"max_over_time(timestamp({selector})[{window}:{step}])"
        else:
            query = f"min_over_time((timestamp({selector}) >= {seconds(t_ns)})[{window}:{step}])"
        try:
            result = self.instant(query, hi_ms * MS)
        except QueryError as exc:
            if hi_ms - lo_ms > self._step_ns // MS and any(s in str(exc).lower() for s in TOO_MANY_SAMPLES):
                middle = (lo_ms + hi_ms) // 2
                self._edges(found, selector, t_ns, lo_ms, middle, before)
                self._edges(found, selector, t_ns, middle + 1, hi_ms, before)
                return
            raise
        pick = max if before else min
        for labels, value in result:
            key = tuple(sorted(labels.items()))
            found[key] = pick(found.get(key, value), value)
