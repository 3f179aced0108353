"""The real ``influxd`` 1.x as the tests and the benchmarks run it: its config and reading
its query answers. Free of pytest: bench/wlbench imports it too (tests/ is on its path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_CONFIG = """\
reporting-disabled = true
bind-address = "127.0.0.1:{rpc_port}"
[meta]
  dir = "{root}/meta"
[data]
  dir = "{root}/data"
  wal-dir = "{root}/wal"
  wal-fsync-delay = "0s"
  query-log-enabled = false
{data}[monitor]
  store-enabled = false
[http]
  bind-address = "127.0.0.1:{port}"
  log-enabled = false
  pprof-enabled = false
{http}[continuous_queries]
  enabled = false
[logging]
  level = "warn"
"""

#: What the benchmarks add: room for a large ingest, no cap on a request body.
BENCH_EXTRA = {"data": '  cache-max-memory-size = "4g"\n', "http": "  max-body-size = 0\n"}


def influxd_config(root: Path, port: int, rpc_port: int, data: str = "", http: str = "") -> str:
    """The config of an ``influxd`` keeping its files under ``root`` and answering HTTP on
    ``port`` (loopback only); ``data``/``http``: extra lines for those sections."""
    return _CONFIG.format(root=root, port=port, rpc_port=rpc_port, data=data, http=http)


def query_rows(body: bytes) -> list[dict[str, Any]]:
    """Rows of every series of a ``/query`` answer (tags merged in); RuntimeError on an error."""
    rows: list[dict[str, Any]] = []
    for result in json.loads(body)["results"]:
        if "error" in result:
            raise RuntimeError(result["error"])
        for series in result.get("series", []):
            tags = series.get("tags", {})
            rows += [{**tags, **dict(zip(series["columns"], v, strict=True))} for v in series["values"]]
    return rows
