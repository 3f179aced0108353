"""VictoriaMetrics (single node) as a full store: line protocol in (``POST /write``, the layout
of :mod:`.victoria_points`), the Prometheus API and ``/api/v1/export`` out
(:mod:`.series_reads` over :class:`~.series_api.Export`), job summaries kept one per job.

A write is acknowledged once VictoriaMetrics answered 2xx: it has then taken the rows
(they are searchable within about a second). It skips a line it cannot parse without
saying so, so every point is checked by the encoder first, and refused there with its reason.
Errors: connection failures, timeouts, 5xx, 401/403/429 raise :class:`StoreUnavailable`; any
other answer refuses the request's points, with VictoriaMetrics' message as the reason.

Run VictoriaMetrics with ``-dedup.minScrapeInterval=1ms`` (a resent point then replaces its
first copy, as in InfluxDB); reads need no ``-search.latencyOffset`` (:class:`~.series_api.Export`).
docs/storage.md says what the layout gives up.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Sequence

from wattline import wire
from wattline.stores.base import JobSummary, StoreUnavailable, WriteResult
from wattline.stores.influxdb.http import HttpClient, shorten
from wattline.stores.influxdb.linestore import LineProtocolStore
from wattline.stores.lineprotocol import EncodedBatch, LineEncoder
from wattline.stores.schema import JOB_SUMMARY, JOB_SUMMARY_HOST, SummaryPoint
from wattline.stores.series.api import Export, quote
from wattline.stores.series.points import SummaryStamps, batch_lines
from wattline.stores.series.reads import SeriesReads

log = logging.getLogger(__name__)

#: Largest request body (VictoriaMetrics' ``-maxInsertRequestSize`` is 32 MB by default).
MAX_BODY_BYTES = 4 << 20


def serves_prometheus_api(client: HttpClient) -> bool:
    """Whether the server answers the Prometheus API's build info (VictoriaMetrics, Prometheus,
    Mimir and Thanos do; VictoriaMetrics also answers InfluxDB's ``/ping``, without saying it
    is InfluxDB)."""
    status, _, data = client.request("GET", "/api/v1/status/buildinfo")
    try:
        return status == 200 and json.loads(data).get("status") == "success"
    except (ValueError, AttributeError):
        return False


class VictoriaStore(SeriesReads, LineProtocolStore):
    """Writes batches to, and reads reports from, one VictoriaMetrics single node."""

    kind = "victoriametrics"
    #: VictoriaMetrics answers a write once it is in memory and makes it durable later
    #: (docs/delivery.md, "What acknowledged means"): what it acknowledged this long before a
    #: SIGKILL may be gone after its restart.
    durable_after_s = 30.0

    def __init__(self, url: str, timeout_s: float = 10.0, encoder: LineEncoder | None = None, tenant: str = "") -> None:
        """``tenant`` (ACCOUNT or ACCOUNT:PROJECT): ``url`` is a cluster's, serving vminsert's
        ``/insert/<tenant>/influx/write``, vmselect's ``/select/<tenant>/prometheus/api/v1/…``
        and ``/delete/<tenant>/prometheus/api/v1/admin/tsdb/delete_series`` (vmauth routes
        them); empty: a single node, which serves them without the prefixes."""
        self.encoder = encoder or LineEncoder()
        self._http = HttpClient(url, timeout_s)
        self.url = self._http.url
        self._insert = f"/insert/{tenant}/influx" if tenant else ""
        self._api = Export(self._http, f"/select/{tenant}/prometheus" if tenant else "", "VictoriaMetrics")
        self._delete_at = f"/delete/{tenant}/prometheus" if tenant else ""
        self._stamps = SummaryStamps()
        if tenant:  # a cluster's durability is its replication's: vmauth shows no vmstorage's start
            self.durable_after_s = 0.0

    def __repr__(self) -> str:
        return f"VictoriaStore({self.url!r})"

    def started_ns(self) -> int | None:
        """A single node's start (its ``/metrics`` ``vm_app_start_timestamp``, whole seconds);
        None for a cluster (vmauth does not route to vmstorage's) or where it does not answer."""
        if self._insert:
            return None
        try:
            status, _headers, body = self._http.request("GET", "/metrics")
        except StoreUnavailable:
            return None
        for line in body.decode("utf-8", "replace").splitlines() if status == 200 else ():
            name, _, value = line.partition(" ")
            if name == "vm_app_start_timestamp":
                try:
                    return int(float(value) * 1e9)
                except ValueError:
                    return None
        return None

    def encode(self, batch: wire.pb.Batch) -> EncodedBatch:
        return batch_lines(self.encoder, batch)

    def summary_points(self, summary: JobSummary) -> list[SummaryPoint]:
        return self._stamps.points(summary)

    def write_lines(self, lines: Sequence[str]) -> WriteResult:
        """Write already-encoded points (several requests if the body would be too large)."""
        result = WriteResult()
        chunk: list[str] = []
        size = 0
        for line in lines:
            if chunk and size + len(line) >= MAX_BODY_BYTES:
                self._post(chunk, result)
                chunk, size = [], 0
            chunk.append(line)
            size += len(line) + 1
        if chunk:
            self._post(chunk, result)
        return result

    def _post(self, lines: list[str], result: WriteResult) -> None:
        status, _, data = self._http.request("POST", f"{self._insert}/write?precision=ns", "\n".join(lines).encode())
        if 200 <= status < 300:
            result.written += len(lines)
            return
        message = shorten(data.decode("utf-8", "replace").strip())
        if status >= 500 or status in (401, 403, 404, 429):
            raise StoreUnavailable(f"VictoriaMetrics {self.url} write answered {status}: {message}")
        log.warning("VictoriaMetrics %s refused %d points: %s", self.url, len(lines), message)
        result.rejected += len(lines)
        result.reasons.append(message)

    # -- job summaries (one series per job, about one sample) -------------------------------

    def write_summary(self, summary: JobSummary) -> WriteResult:
        """Write ``summary`` stamped now (:class:`~.victoria_points.SummaryStamps`), first
        deleting the job's stored summary series, so a job keeps about one sample. Two copies
        at one time stamp would not do: deduplication keeps the larger value per series (seen:
        a rewrite that read back half old, half new), and a delete misses a copy written a
        moment before (not searchable yet). A copy the delete missed is an older sample of the
        same series, read as older (:meth:`job_summary`); a reader between the delete and the
        write finds none."""
        self._delete(summary.job_id)
        return super().write_summary(summary)

    #: A second sample at an interval's time would sit beside the first (deduplication keeps the
    #: larger value), so an interval is written once, when it is final.
    replaces_intervals = False

    def _delete(self, job_id: str) -> None:
        match = f'{{__name__=~"({JOB_SUMMARY}|{JOB_SUMMARY_HOST})_.+",job_id={quote(job_id)}}}'
        body = urllib.parse.urlencode({"match[]": match}).encode()
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        path = f"{self._delete_at}/api/v1/admin/tsdb/delete_series"
        status, _, data = self._http.request("POST", path, body, form)
        if not 200 <= status < 300:
            raise StoreUnavailable(
                f"VictoriaMetrics {self.url} delete_series answered {status}: {shorten(data.decode())}"
            )

    def job_summary(self, job_id: str) -> JobSummary | None:
        """The stored summary of ``job_id`` (None when there is none): where the job holds
        several copies (a rewrite's delete missed one written a moment before, or one of the
        layout before #45), the newest computed; the others hold only older figures of the
        same job, so nothing is lost."""
        found = self.job_summaries_of(job_id)
        return found[-1] if found else None

    def close(self) -> None:
        self._http.close()
