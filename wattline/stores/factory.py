"""Choose and open a storage back-end from one URL.

- ``sqlite:///var/lib/wattline/energy.db`` (the path is the URL's path, as in ``file:``
  URLs; ``sqlite:relative.db`` is relative) or a plain path -> :class:`SqliteStore`;
- ``http(s)://host:port`` -> InfluxDB: ``GET /ping`` and its ``X-Influxdb-Version``
  header (``1.x`` -> :class:`InfluxV1Store`, ``2.x``/``3.x`` -> :class:`InfluxV2Store`),
  unless ``api="v1"`` or ``api="v2"`` forces one; a server whose ``/ping`` lacks that
  header but that serves the Prometheus API is VictoriaMetrics -> :class:`VictoriaStore`
  (written and read; forcing v1 or v2 writes it as InfluxDB, for no reads); a server that
  answers no ``/ping`` but serves the Prometheus API is Prometheus -> :class:`PrometheusStore`
  (remote write to ``/api/v1/write``); any other server must be given its API;
- ``http(s)://host:port`` with a ``tenant`` -> a VictoriaMetrics cluster (no detection): the
  URL serves vminsert's and vmselect's tenant paths;
- ``prometheus+http(s)://host:port[/prefix][?write=...]`` -> :class:`PrometheusStore`: Prometheus,
  Grafana Mimir, Thanos (no detection; a ``tenant`` is their ``X-Scope-OrgID``).
"""

from __future__ import annotations

import urllib.parse
from typing import Literal

from wattline.stores.base import Store
from wattline.stores.influxdb.http import HttpClient
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.sqlite.store import SqliteStore
from wattline.stores.victoria.store import VictoriaStore, serves_prometheus_api

Api = Literal["v1", "v2"]
#: What the server at a URL is: an InfluxDB API, VictoriaMetrics or Prometheus.
Kind = Literal["v1", "v2", "victoriametrics", "prometheus"]


def api_for_version(version: str) -> Api:
    """``v1`` or ``v2`` for an ``X-Influxdb-Version`` value ("1.8.10", "v2.7.4", "3.0.1")."""
    major = version.strip().lstrip("vV").split(".")[0]
    if major == "1":
        return "v1"
    if major in ("2", "3"):
        return "v2"
    raise ValueError(f"unsupported InfluxDB version {version!r}; set the API explicitly: v1 or v2")


def detect_api(url: str, timeout_s: float = 10.0) -> Kind:
    """The API of the server at ``url``, from its ``/ping`` (and, without an InfluxDB version
    there, whether it serves the Prometheus API: VictoriaMetrics answers ``/ping``, Prometheus
    does not).

    Raises :class:`StoreUnavailable` if it is unreachable, ValueError if it is neither.
    """
    client = HttpClient(url, timeout_s)
    try:
        status, headers, _ = client.request("GET", "/ping")
        version = headers.get("X-Influxdb-Version", "")
        if not version and serves_prometheus_api(client):
            return "victoriametrics" if 200 <= status < 300 else "prometheus"
    finally:
        client.close()
    if not 200 <= status < 300 or not version:
        raise ValueError(
            f"{url} is neither InfluxDB (/ping answered {status}, X-Influxdb-Version {version or 'absent'}) "
            "nor VictoriaMetrics or Prometheus (no Prometheus API); set the API explicitly: v1 or v2"
        )
    return api_for_version(version)


def open_store(
    url: str,
    *,
    database: str = "wattline",
    org: str = "",
    bucket: str = "wattline",
    token: str = "",
    username: str | None = None,
    password: str | None = None,
    retention_policy: str | None = None,
    api: Api | None = None,
    timeout_s: float = 10.0,
    read_only: bool = False,
    tenant: str = "",
) -> Store:
    """The store ``url`` names. 1.x uses ``database`` (+ credentials, retention policy),
    2.x/3.x ``org``/``bucket``/``token``. Raises ValueError for a URL or API it cannot use.

    ``read_only`` (reports): a SQLite store must exist and is opened for reading only
    (ConfigError when the path holds no wattline store); InfluxDB is only read anyway.
    ``tenant``: see the module's docstring.
    """
    scheme = urllib.parse.urlsplit(url).scheme.lower() if "://" in url or url.startswith("sqlite:") else ""
    if scheme in ("prometheus+http", "prometheus+https"):
        if api is not None:
            raise ValueError(f"influx_api {api} is for InfluxDB, not {url[:100]!r}")
        return _prometheus(url, timeout_s, tenant)
    if tenant and (scheme not in ("http", "https") or api is not None):
        raise ValueError(
            f"a tenant ({tenant[:100]!r}) is for a VictoriaMetrics cluster at an http(s) URL or a "
            f"prometheus+http(s) URL, not {url[:100]!r}{' with influx_api ' + api if api else ''}"
        )
    if tenant:
        return VictoriaStore(url, timeout_s, tenant=tenant)
    if scheme == "sqlite":
        path = urllib.parse.unquote(url[len("sqlite:") :].removeprefix("//"))
        if not path:
            raise ValueError(f"no path in {url!r}")
        return SqliteStore(path, read_only=read_only)
    if scheme == "":
        return SqliteStore(url, read_only=read_only)
    if scheme not in ("http", "https"):
        raise ValueError(
            f"unsupported store URL {url!r}: use sqlite:///path, a path, http(s):// or prometheus+http(s)://"
        )
    kind: Kind = detect_api(url, timeout_s) if api is None else api
    if kind == "victoriametrics":
        return VictoriaStore(url, timeout_s)
    if kind == "prometheus":
        return _prometheus(url, timeout_s, "")
    if kind == "v1":
        return InfluxV1Store(url, database, username, password, retention_policy, timeout_s)
    if kind == "v2":
        from wattline.stores.influxdb.v2 import InfluxV2Store  # influxdb_client is slow to import

        return InfluxV2Store(url, org, bucket, token, timeout_s)
    raise ValueError(f"unknown InfluxDB API {api!r}: use v1 or v2")


def _prometheus(url: str, timeout_s: float, tenant: str) -> Store:
    # Imported here: snappy and the remote-write code load only for a Prometheus store (an
    # embedded `wattline run` opens SQLite through this module).
    from wattline.stores.prometheus.store import PrometheusStore

    return PrometheusStore(url, timeout_s, tenant=tenant)
