"""InfluxDB 2.x/3.x (and VictoriaMetrics) back-end: ``/api/v2/write`` via ``influxdb_client``.

The lines come from our own encoder (:mod:`wattline.stores.lineprotocol`) and are
handed to the client's synchronous write API as records, so escaping lives in one place.
Errors map as for 1.x: connection failures, timeouts, 5xx, 401/403/404/413/429 raise
:class:`StoreUnavailable`; 400/422 count refused points as rejected (``dropped=N`` or
one ``unable to parse`` per line when InfluxDB names them, else the whole request, which
InfluxDB 2.x refuses whole on a malformed line). The token is never logged nor shown.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import urllib3
from influxdb_client.client.influxdb_client import InfluxDBClient
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.domain.write_precision import WritePrecision
from influxdb_client.rest import ApiException

from wattline.stores.base import StoreUnavailable, WriteResult
from wattline.stores.influxdb.http import error_message, rejected_points, shorten
from wattline.stores.influxdb.linestore import LineProtocolStore
from wattline.stores.lineprotocol import LineEncoder

log = logging.getLogger(__name__)

PRECISION: WritePrecision = WritePrecision.NS  # type: ignore[assignment]  # a str constant, typed as the class
#: Statuses that mean the points themselves were refused.
REJECTING_STATUSES = frozenset({400, 422})


def map_api_error(exc: ApiException, sent: int, url: str) -> WriteResult:
    """The :class:`WriteResult` of a write that raised ``exc``, or :class:`StoreUnavailable`."""
    status = int(exc.status or 0)
    body = exc.body if isinstance(exc.body, bytes | str) else b""
    full = error_message(body.encode() if isinstance(body, str) else body) or str(exc.reason or "")
    message = shorten(full)
    if status not in REJECTING_STATUSES:
        raise StoreUnavailable(f"InfluxDB {url} write answered {status or 'no response'}: {message}") from exc
    rejected = rejected_points(full, sent)
    if rejected is None:
        rejected = sent
    return WriteResult(written=sent - rejected, rejected=rejected, reasons=[message])


class InfluxV2Store(LineProtocolStore):
    """Writes batches to one InfluxDB 2.x/3.x bucket (or any ``/api/v2/write`` server)."""

    kind = "influxdb2"

    def __init__(
        self,
        url: str,
        org: str,
        bucket: str,
        token: str,
        timeout_s: float = 10.0,
        encoder: LineEncoder | None = None,
    ) -> None:
        if not bucket:
            raise ValueError("InfluxDB bucket name is empty")
        self.url = url
        self.org = org
        self.bucket = bucket
        self.encoder = encoder or LineEncoder()
        self._client = InfluxDBClient(url=url, token=token, org=org, timeout=int(timeout_s * 1000), retries=False)
        self._write_api = self._client.write_api(write_options=SYNCHRONOUS)

    def __repr__(self) -> str:
        return f"InfluxV2Store({self.url!r}, org={self.org!r}, bucket={self.bucket!r})"

    def write_lines(self, lines: Sequence[str]) -> WriteResult:
        """Write already-encoded points in one request."""
        if not lines:
            return WriteResult()
        try:
            self._write_api.write(bucket=self.bucket, org=self.org, record=list(lines), write_precision=PRECISION)
        except ApiException as exc:
            result = map_api_error(exc, len(lines), self.url)
            log.warning(
                "InfluxDB %s refused %d of %d points: %s", self.url, result.rejected, len(lines), result.reasons[0]
            )
            return result
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise StoreUnavailable(f"InfluxDB {self.url} write failed: {exc or type(exc).__name__}") from exc
        return WriteResult(written=len(lines))

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]
