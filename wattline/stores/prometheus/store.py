"""Prometheus, Grafana Mimir and Thanos as a full store: Prometheus remote write in
(:mod:`.remote_write`, the layout of :mod:`.victoria_points`), the Prometheus query API out
(:mod:`.series_reads` over :class:`~.series_api.RangeQuery`: no ``/api/v1/export``).

URL (README "A fleet"): ``prometheus+http(s)://HOST:PORT[/PREFIX][?write=W]``: the query API
is at ``PREFIX/api/v1/…``; remote write goes to ``W`` (a path on the same host, or a whole
URL), else to ``PREFIX/api/v1/write`` (Prometheus run with ``--web.enable-remote-write-receiver``).
Mimir: ``prometheus+http://mimir:8080/prometheus?write=/api/v1/push``; Thanos:
``prometheus+http://query:10902?write=http://receive:19291/api/v1/receive``. A ``tenant``
is sent as ``X-Scope-OrgID``.

A write is acknowledged once the engine answered 2xx: it has then appended the samples (they
are searchable at once). Every read asks for what was acknowledged before it
(:data:`READ_HEADERS`): Mimir's ingest storage otherwise answers from ingesters that may not
have consumed the latest writes yet, and a query-frontend's results cache from an answer
computed before them.

Errors: connection failures, timeouts, 5xx, 401/403/404/429 raise
:class:`StoreUnavailable` (retried); any other answer, and a 5xx that names a sample it
refuses (Prometheus 2.42 answers "too old sample" with 500), is a refusal. A refusal does
not say which samples (Prometheus refuses a request whole, Mimir keeps the others), so the
points are read back: those stored as sent are written (a resend), the rest are sent once
more, and what is still not stored then is rejected with the engine's reason, never
acknowledged as written (:meth:`PrometheusStore._write_points`).

Run the engine with an out-of-order window at least as long as agents hold unacknowledged
batches (Prometheus ``storage.tsdb.out_of_order_time_window``, Mimir
``-ingester.out-of-order-time-window``, Thanos Receive ``--tsdb.out-of-order.time-window``):
a resend, or a job event that arrives after a later one of its series, is then taken (the
engine keeps one sample per series and millisecond). Without it the engine refuses them:
a resend reads back as stored, a late event is rejected with its reason.

Job summaries: a point is stamped when it is written (a sample cannot be replaced in place
here, and one older than the engine's window is refused), the summary's own time in the
field :data:`~.victoria_points.TIME_MS`; every rewrite is kept, as a newer sample of the
job's one series (#45), and the latest computed is the summary.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Sequence

from wattline import wire
from wattline.point_limits import LineProtocolError
from wattline.stores.base import IntervalSummary, JobSummary, Store, StoreUnavailable, WriteResult
from wattline.stores.influxdb.http import HttpClient, shorten
from wattline.stores.lineprotocol import LineEncoder, describe
from wattline.stores.prometheus.remote_write import HEADERS, SeriesSample, point_samples, unescape_name, write_request
from wattline.stores.reader import JOB_LOOKBACK_NS
from wattline.stores.schema import SummaryPoint, interval_point
from wattline.stores.series.api import Points, RangeQuery, quote
from wattline.stores.series.points import MS, SummaryStamps, batch_points
from wattline.stores.series.reads import NEAR_NS, SeriesReads

log = logging.getLogger(__name__)

#: Most samples in one remote-write request.
MAX_REQUEST_SAMPLES = 50_000
#: What a 5xx says when the engine refused a sample (no retry can store it).
SAMPLE_REFUSALS = ("too old sample", "out of bounds", "out of order sample", "duplicate sample for timestamp")
SCHEMES = ("prometheus+http", "prometheus+https")
#: Sent with every read: Mimir answers it with strong read consistency (every write
#: acknowledged before the query is seen) and bypasses its query-frontend's results cache;
#: Prometheus and Thanos read the head their remote write appended to, and ignore both.
READ_HEADERS = {"X-Read-Consistency": "strong", "Cache-Control": "no-store"}


class Refused(Exception):
    """The engine refused a request's samples (its message)."""


def parse_url(url: str) -> tuple[str, str]:
    """(query API base URL, remote-write URL) of a ``prometheus+http(s)://`` store URL."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in SCHEMES:
        raise ValueError(f"not a prometheus+http(s) URL: {url[:100]!r}")
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    if set(query) - {"write"} or len(query.get("write", [])) > 1:
        raise ValueError(f"{url[:100]!r}: the one URL parameter is write=PATH or write=URL")
    base = parts._replace(scheme=parts.scheme.lower().removeprefix("prometheus+"), query="", fragment="").geturl()
    write = query.get("write", [""])[0]
    target = urllib.parse.urljoin(base, write) if write else base.rstrip("/") + "/api/v1/write"
    if urllib.parse.urlsplit(target).scheme not in ("http", "https"):
        raise ValueError(f"{url[:100]!r}: write={write[:100]!r} is neither a path nor an http(s) URL")
    return base, target


class PrometheusStore(SeriesReads, Store):
    """Writes batches to, and reads reports from, an engine that takes remote write and serves
    the Prometheus query API."""

    kind = "prometheus"
    #: A write is searchable once acknowledged (above).
    search_lag_s = 0.0

    def __init__(self, url: str, timeout_s: float = 10.0, tenant: str = "", encoder: LineEncoder | None = None) -> None:
        """``url``: ``prometheus+http(s)://...`` (:func:`parse_url`), or a plain http(s) URL of
        Prometheus itself. ``tenant``: sent as ``X-Scope-OrgID``."""
        if not url.lower().startswith(SCHEMES):
            url = "prometheus+" + url
        base, target = parse_url(url)
        headers = {"X-Scope-OrgID": tenant} if tenant else {}
        self.encoder = encoder or LineEncoder()  # the checks every store makes
        self._http = HttpClient(base, timeout_s, headers={**headers, **READ_HEADERS})
        self._push = HttpClient(target, timeout_s, headers={**headers, **HEADERS})
        self.url = self._http.url
        self._api = RangeQuery(self._http, "", "Prometheus", NEAR_NS, unescape_name)
        self._stamps = SummaryStamps()

    def __repr__(self) -> str:
        return f"PrometheusStore({self.url!r})"

    # -- writes ----------------------------------------------------------------------------

    def _checked(self, point: SummaryPoint) -> tuple[SummaryPoint, list[SeriesSample]]:
        self.encoder.check(*point)  # refuses what line protocol refuses: every store keeps the same points
        return point, point_samples(point)

    def write(self, batch: wire.pb.Batch) -> WriteResult:
        return self.write_group([batch])[0]

    def write_group(self, batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
        """All batches' points in as few requests as :data:`MAX_REQUEST_SAMPLES` allows; after a
        refusal, each batch again alone, so each is charged its own refusals."""
        results = []
        groups: list[list[tuple[SummaryPoint, list[SeriesSample]]]] = []
        seen: dict[tuple[tuple[tuple[str, str], ...], int], float] = {}
        for batch in batches:
            points, refused = batch_points(batch, self._checked)
            kept = []
            for point, samples in points:
                if any(seen.get((series, ms), value) != value for series, ms, value in samples):
                    where = f"{point[0]} {describe(point[1])} at {point[3]}"
                    refused.append(f"{where}: another point of its series holds that millisecond")
                    continue
                seen.update(((series, ms), value) for series, ms, value in samples)
                kept.append((point, samples))
            groups.append(kept)
            results.append(WriteResult(rejected=len(refused), reasons=refused))
        if len(batches) > 1:
            try:
                self._send([p for group in groups for p in group])
            except Refused:
                pass  # each batch alone, below
            else:
                for result, group in zip(results, groups, strict=True):
                    result.written += len(group)
                return results
        for result, group in zip(results, groups, strict=True):
            self._write_points(group, result)
        return results

    def _write_points(self, points: list[tuple[SummaryPoint, list[SeriesSample]]], result: WriteResult) -> None:
        """Write ``points`` into ``result``: a refusal is followed by a read back, and the points
        not stored are sent once more; those still not stored then are rejected."""
        for attempt in (0, 1):
            try:
                self._send(points)
            except Refused as exc:
                stored = self._stored(points)
                result.written += sum(stored)
                points = [p for p, ok in zip(points, stored, strict=True) if not ok]
                if points and attempt == 1:
                    log.warning("%s %s refused %d points: %s", self._api.engine, self.url, len(points), exc)
                    result.rejected += len(points)
                    result.reasons.append(str(exc))
                if not points:
                    return
            else:
                result.written += len(points)
                return

    def _send(self, points: Sequence[tuple[SummaryPoint, list[SeriesSample]]]) -> None:
        """One request per :data:`MAX_REQUEST_SAMPLES`; raises :class:`Refused` after all were sent
        when any was refused."""
        refusals: list[str] = []
        chunk: list[SeriesSample] = []
        for i, (_, samples) in enumerate(points):
            chunk += samples
            if len(chunk) >= MAX_REQUEST_SAMPLES or i == len(points) - 1:
                refusals += self._post(chunk)
                chunk = []
        if refusals:
            raise Refused("; ".join(dict.fromkeys(refusals)))

    def _post(self, samples: list[SeriesSample]) -> list[str]:
        """The engine's refusal of ``samples``, if it refused them."""
        status, _, data = self._push.request("POST", "", write_request(samples))
        if 200 <= status < 300:
            return []
        message = shorten(data.decode("utf-8", "replace").strip())
        refused = status < 500 and status not in (401, 403, 404, 429)
        if not refused and not any(s in message.lower() for s in SAMPLE_REFUSALS):
            raise StoreUnavailable(f"{self._api.engine} {self._push.url} remote write answered {status}: {message}")
        return [f"{status} {message}"]

    def _stored(self, points: Sequence[tuple[SummaryPoint, list[SeriesSample]]]) -> list[bool]:
        """Whether each point is stored as it was sent (read back by its host, else its job id)."""
        spans: dict[tuple[str, str, str], tuple[int, int]] = {}
        for (measurement, tags, _, time_ns), _samples in points:
            key = (measurement, *(("host", tags["host"]) if "host" in tags else ("job_id", tags["job_id"])))
            lo, hi = spans.get(key, (time_ns, time_ns))
            spans[key] = (min(lo, time_ns), max(hi, time_ns))
        found: dict[str, Points] = defaultdict(dict)
        for (measurement, label, value), (lo, hi) in spans.items():
            selector = f'{{__name__=~"{measurement}_.+",{label}={quote(value)}}}'
            for name, per in self._api.raw([selector], lo, hi).items():
                found[name].update(per)
        out = []
        for (measurement, tags, fields, time_ns), _ in points:
            labels = tuple(sorted((k, v) for k, v in tags.items() if v))
            have = found[measurement].get(labels, {}).get(time_ns // MS)
            numbers = {k: float(v) for k, v in fields.items() if not isinstance(v, str)}
            out.append(have is not None and all(have.get(k) == v for k, v in numbers.items()))
        return out

    # -- job summaries ---------------------------------------------------------------------

    def write_summary(self, summary: JobSummary) -> WriteResult:
        """Write ``summary``'s points stamped now (:class:`~.victoria_points.SummaryStamps`)."""
        try:
            points = [self._checked(point) for point in self._stamps.points(summary)]
        except LineProtocolError as exc:  # no retry can store it
            return WriteResult(rejected=1, reasons=[f"job summary of {summary.job_id[:100]!r}: {exc}"])
        result = WriteResult()
        self._write_points(points, result)
        return result

    #: Prometheus refuses a second value at a sample's time, and a sample older than its series'
    #: newest: an interval is written once, when it is final, in time order.
    replaces_intervals = False

    def write_intervals(self, intervals: Sequence[IntervalSummary]) -> WriteResult:
        """Write service intervals (:func:`interval_point`), each refused alone if line protocol would refuse it."""
        points, result = [], WriteResult()
        for interval in intervals:
            try:
                points.append(self._checked(interval_point(interval)))
            except LineProtocolError as exc:
                result.rejected += 1
                result.reasons.append(f"interval of {interval.job_id[:100]!r}: {exc}")
        if points:
            self._write_points(points, result)
        return result

    def job_summary(self, job_id: str) -> JobSummary | None:
        """The latest summary of ``job_id`` written within the last 31 days (None when there is none)."""
        found = self.job_summaries_of(job_id, time.time_ns() - JOB_LOOKBACK_NS)
        return found[-1] if found else None

    def close(self) -> None:
        self._http.close()
        self._push.close()
