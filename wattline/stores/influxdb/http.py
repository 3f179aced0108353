"""HTTP to InfluxDB (1.x and 2.x APIs alike): kept-alive connections and reading its errors.

Credentials go in a Basic ``Authorization`` header and never into messages; an error
message quotes at most :data:`MESSAGE_END_CHARS` of what the server said.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import http.client
import json
import re
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

from wattline.stores.base import StoreUnavailable


def loads(data: bytes) -> Any:
    """``json.loads`` with Python's cyclic garbage collector paused: a query's answer decodes
    to many small lists (a row each) and no cycle, yet allocating them sets off collections
    that walk the whole heap, so in a process holding many objects a large answer decodes
    much faster with it paused. Left alone where the collector is already off."""
    with _gc_paused():
        return json.loads(data)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class HttpClient:
    """Kept-alive HTTP/1.1 connections to one server, thread-safe."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        username: str | None = None,
        password: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """``headers``: sent with every request (a tenant's ``X-Scope-OrgID``)."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        if parts.username is not None and username is None:
            username, password = urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
        #: The URL without credentials, for messages.
        self.url = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._base = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._headers: dict[str, str] = dict(headers or {})
        if username is not None:
            token = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout_s)
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        """Status, headers and body; raises :class:`StoreUnavailable` when the server is unreachable.

        A kept-alive connection the server has closed meanwhile is retried once on a fresh
        one (safe: every write is idempotent).
        """
        all_headers = {**self._headers, **(headers or {})}
        for attempt in (0, 1):
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            reused = conn is not None
            if conn is None:
                conn = self._connect()
            try:
                conn.request(method, self._base + path, body=body, headers=all_headers)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise StoreUnavailable(f"{method} {self.url}{path.split('?')[0]}: {exc or type(exc).__name__}") from exc
            if resp.will_close:
                conn.close()
            else:
                with self._lock:
                    self._idle.append(conn)
            return resp.status, resp.headers, data
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


#: Characters kept at each end of a long server message (which may quote a whole bad line).
MESSAGE_END_CHARS = 120


def shorten(text: str) -> str:
    """``text`` with its middle cut when long: the start and the end (the reason) stay."""
    if len(text) <= 2 * MESSAGE_END_CHARS + 40:
        return text
    cut = len(text) - 2 * MESSAGE_END_CHARS
    return f"{text[:MESSAGE_END_CHARS]}...({cut} characters cut)...{text[-MESSAGE_END_CHARS:]}"


def error_message(body: bytes, headers: http.client.HTTPMessage | None = None) -> str:
    """InfluxDB's error text from a JSON ``{"error": ...}`` or ``{"message": ...}`` body
    (whole: :func:`shorten` it for messages and logs)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        for key in ("error", "message"):
            if isinstance(doc.get(key), str):
                return str(doc[key])
    if not text and headers is not None:
        text = headers.get("X-Influxdb-Error", "")
    return text


def rejected_points(message: str, sent: int) -> int | None:
    """How many of ``sent`` points a 4xx ``message`` refused; None if it names no point.

    InfluxDB 1.x writes the points it could and says ``partial write: <reason> dropped=N``
    (type conflicts, retention, limits) or lists one ``unable to parse`` per bad line.
    """
    match = re.search(r"dropped=(\d+)", message)
    dropped = int(match.group(1)) if match else 0
    unparsable = message.count("unable to parse")
    if dropped or unparsable:
        return min(sent, dropped + unparsable)
    return None


#: Fields a report reads back (reader.StoredSample).
