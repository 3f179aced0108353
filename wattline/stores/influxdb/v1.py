"""InfluxDB 1.x back-end: ``POST /write`` of our line protocol; its InfluxQL reads are
:mod:`.reads` (over :mod:`.influxql`'s ``/query``).

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

import logging
import urllib.parse
from collections.abc import Sequence

from wattline.stores.base import JobSummary, StoreUnavailable, WriteResult
from wattline.stores.influxdb.http import HttpClient, error_message, rejected_points, shorten
from wattline.stores.influxdb.influxql import QueryError, quote_ident, quote_literal
from wattline.stores.influxdb.linestore import LineProtocolStore
from wattline.stores.influxdb.reads import InfluxV1Reads
from wattline.stores.lineprotocol import LineEncoder
from wattline.stores.schema import JOB_SUMMARY, JOB_SUMMARY_HOST

log = logging.getLogger(__name__)

#: Largest request body; a bigger batch goes out in several requests (InfluxDB's
#: default ``max-body-size`` is 25 MB).
MAX_BODY_BYTES = 4 << 20


class InfluxV1Store(InfluxV1Reads, LineProtocolStore):
    """Writes batches to one InfluxDB 1.x database (timestamps in ns); reads it as
    :class:`~.reads.InfluxV1Reads` does."""

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
