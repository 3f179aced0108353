"""InfluxQL over InfluxDB 1.x's ``/query``: quoting, the refusal (:class:`QueryError`), and
:class:`InfluxQLClient`, which sends statements and returns their series; the base of the
reads (:mod:`.reads`) and of :class:`~.v1.InfluxV1Store` (its database, URL and connections)."""

from __future__ import annotations

import urllib.parse
from typing import Any

from wattline.stores.base import StoreUnavailable
from wattline.stores.influxdb.http import HttpClient, error_message, loads, shorten


class QueryError(ValueError):
    """InfluxDB refused a query (syntax, unknown database...), or the server answers no
    InfluxQL at all (VictoriaMetrics); retrying cannot help."""


def quote_ident(name: str) -> str:
    """An InfluxQL identifier in double quotes."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quote_literal(value: str) -> str:
    """An InfluxQL string literal in single quotes (for ``WHERE tag = '...'``)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


class InfluxQLClient:
    """InfluxQL statements sent to one server, on its database or none (``CREATE DATABASE``)."""

    database: str
    url: str
    _http: HttpClient

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
