"""One scrape of a server's Prometheus endpoint over HTTP(S), with the standard library only.

:func:`scrape` asks for the text exposition format (0.0.4), takes gzip, follows a redirect only
to the same scheme, host and port (Starlette apps, vLLM's among them, answer ``/metrics`` with a
redirect to ``/metrics/``), refuses a body over ``max_bytes`` (compressed or not) and ends by
about ``timeout_s``. Whatever goes wrong is a :class:`ScrapeError` of one line.
"""

from __future__ import annotations

import http.client
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from typing import IO

from wattline.text import clip, one_line

#: Largest exposition taken (bytes, after decompression): a server's /metrics is kilobytes to a
#: few megabytes; beyond this it is not an inference server's metrics page.
MAX_BYTES = 16 * 1024 * 1024
#: Text format 0.0.4 first; OpenMetrics is parsed too when a server sends it anyway.
ACCEPT = "text/plain;version=0.0.4;q=1.0,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1"
_CHUNK = 64 * 1024


class ScrapeError(Exception):
    """A scrape that gave no exposition to count: the message says why, on one line."""


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only within the scrape's scheme, host and port."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        old, new = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
        if (old.scheme, old.netloc) != (new.scheme, new.netloc):
            raise ScrapeError(f"{req.full_url} redirects to another origin ({clip(newurl)}): not followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def scrape(url: str, timeout_s: float, max_bytes: int = MAX_BYTES, context: ssl.SSLContext | None = None) -> str:
    """The exposition at ``url`` (http or https) as text; :class:`ScrapeError` when there is none.
    ``context`` checks an https server (None: the system's certificate authorities)."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ScrapeError(f"{clip(url)} is not an http or https URL")
    request = urllib.request.Request(url, headers={"Accept": ACCEPT, "Accept-Encoding": "gzip"})
    # No proxy: the holder scrapes a server on its own host or pod, which a proxy named in the
    # environment (https_proxy) would not reach.
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context), _SameOrigin()
    )
    deadline = time.monotonic() + timeout_s
    try:
        with opener.open(request, timeout=timeout_s) as response:
            gzipped = response.headers.get("Content-Encoding", "").strip().lower() == "gzip"
            body = _read(response, gzipped, max_bytes, deadline)
    except ScrapeError:
        raise
    except urllib.error.HTTPError as exc:
        raise ScrapeError(f"{url}: HTTP {exc.code} {one_line(str(exc.reason))}") from None
    except urllib.error.URLError as exc:
        raise ScrapeError(f"{url}: {one_line(str(exc.reason))}") from None
    except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, a broken response
        raise ScrapeError(f"{url}: {one_line(str(exc)) or type(exc).__name__}") from None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScrapeError(f"{url}: the exposition is not UTF-8 ({exc.reason} at byte {exc.start})") from None


def _read(response: http.client.HTTPResponse, gzipped: bool, max_bytes: int, deadline: float) -> bytes:
    """The body, decompressed, in chunks so that neither a large nor a slow one runs on."""
    inflate = _Inflate() if gzipped else None
    parts: list[bytes] = []
    size = received = 0
    while chunk := response.read1(_CHUNK):  # what has come, so that a slow body meets the deadline
        received += len(chunk)
        if time.monotonic() > deadline:
            raise ScrapeError("the response took longer than the timeout")
        if received > max_bytes:
            raise ScrapeError(f"the response is over {max_bytes} bytes: refused")
        if inflate is not None:
            chunk = inflate.more(chunk, max_bytes + 1 - size)
        size += len(chunk)
        if size > max_bytes:
            raise ScrapeError(f"the exposition is over {max_bytes} bytes: refused")
        parts.append(chunk)
    if inflate is not None and not inflate.ended:
        raise ScrapeError("the gzip body is cut short")
    return b"".join(parts)


class _Inflate:
    """A gzip body inflated as it comes, member after member (gzip allows several in a row)."""

    def __init__(self) -> None:
        self._member = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)

    @property
    def ended(self) -> bool:
        """True when the body so far ends a member: nothing is cut short."""
        return self._member.eof

    def more(self, data: bytes, limit: int) -> bytes:
        """What ``data`` inflates to, at most ``limit`` bytes (one past the cap: enough to know)."""
        out = b""
        try:
            while data and len(out) < limit:
                if self._member.eof:  # the next member begins
                    self._member = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
                out += self._member.decompress(data, limit - len(out))
                data = self._member.unused_data if self._member.eof else self._member.unconsumed_tail
        except zlib.error as exc:
            raise ScrapeError(f"the gzip body is broken ({exc})") from None
        return out
