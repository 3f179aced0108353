"""One scrape over HTTP(S) (wattline/served_scrape.py), against a real local server that answers
as servers do and as broken ones do: gzip, redirects, oversized and slow bodies, errors, TLS."""

from __future__ import annotations

import gzip
import http.server
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pki import make_ca, make_cert
from servers import free_port

from wattline.served_scrape import ScrapeError, scrape

EXPOSITION = "# TYPE app_requests_total counter\napp_requests_total 3.0\n"
LIMIT = 4096  # the max_bytes these tests scrape with


class Handler(http.server.BaseHTTPRequestHandler):
    """Paths: /metrics (gzip when asked; echoes the Accept it got), /same and /other (redirects),
    /members, /big, /bomb, /empties, /cut, /slow, /error, /latin1."""

    def do_GET(self) -> None:
        host = self.headers["Host"]
        if self.path == "/metrics":
            body = (EXPOSITION + f"# accept: {self.headers['Accept']}\n").encode()
            gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
            self.answer(200, gzip.compress(body) if gzipped else body, {"Content-Encoding": "gzip"} if gzipped else {})
        elif self.path in ("/same", "/other"):
            target = (
                f"http://{host}/metrics" if self.path == "/same" else f"http://localhost:{host.split(':')[1]}/metrics"
            )
            self.answer(307, b"", {"Location": target})
        elif self.path == "/big":
            self.answer(200, b"#" * (LIMIT + 1))
        elif self.path == "/bomb":  # small on the wire, over the limit once inflated
            self.answer(200, gzip.compress(b"#" * (LIMIT * 100)), {"Content-Encoding": "gzip"})
        elif self.path == "/members":  # gzip allows several members in a row
            half = len(EXPOSITION) // 2
            body = gzip.compress(EXPOSITION[:half].encode()) + gzip.compress(EXPOSITION[half:].encode())
            self.answer(200, body, {"Content-Encoding": "gzip"})
        elif self.path == "/empties":  # over the limit on the wire, nothing once inflated
            self.answer(200, gzip.compress(b"") * (LIMIT // 10), {"Content-Encoding": "gzip"})
        elif self.path == "/cut":
            self.answer(200, gzip.compress(EXPOSITION.encode())[:-8], {"Content-Encoding": "gzip"})
        elif self.path == "/slow":  # each piece within the timeout, the whole not
            self.answer(200, None, {"Content-Length": "1000"})
            for _ in range(10):
                self.wfile.write(b"#" * 100)
                self.wfile.flush()
                time.sleep(0.1)
        elif self.path == "/error":
            self.answer(500, b"engine dead\n")
        else:
            self.answer(200, b"\xff\xfe not utf-8\n")

    def answer(self, status: int, body: bytes | None, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Type": "text/plain; version=0.0.4", **(headers or {})}.items():
            self.send_header(name, value)
        if body is not None:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up (the timeout tests) is no error here


@contextmanager
def serve(context: ssl.SSLContext | None = None) -> Iterator[str]:
    """A base URL served by :class:`Handler` (https with ``context``) until the block ends."""
    server = Server(("127.0.0.1", 0), Handler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"{'https' if context else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with serve() as url:
        yield url


def test_a_scrape_asks_for_the_text_format_and_takes_gzip(base: str) -> None:
    text = scrape(f"{base}/metrics", 5.0, LIMIT)
    assert text.startswith(EXPOSITION)
    assert "# accept: text/plain;version=0.0.4;q=1.0," in text


def test_a_body_of_several_gzip_members_is_read_whole(base: str) -> None:
    assert scrape(f"{base}/members", 5.0, LIMIT) == EXPOSITION


def test_a_redirect_is_followed_within_the_origin_only(base: str) -> None:
    assert scrape(f"{base}/same", 5.0, LIMIT).startswith(EXPOSITION)
    with pytest.raises(ScrapeError, match=r"redirects to another origin \('http://localhost:\d+/metrics'\)"):
        scrape(f"{base}/other", 5.0, LIMIT)


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/big", f"over {LIMIT} bytes: refused"),
        ("/bomb", f"the exposition is over {LIMIT} bytes: refused"),
        ("/empties", f"the response is over {LIMIT} bytes: refused"),
        ("/cut", "the gzip body is cut short"),
        ("/error", "HTTP 500 Internal Server Error"),
        ("/latin1", "the exposition is not UTF-8"),
    ],
)
def test_a_bad_answer_is_a_scrape_error_of_one_line(base: str, path: str, said: str) -> None:
    with pytest.raises(ScrapeError) as caught:
        scrape(f"{base}{path}", 5.0, LIMIT)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_slow_body_ends_at_about_the_timeout(base: str) -> None:
    began = time.monotonic()
    with pytest.raises(ScrapeError, match="took longer than the timeout"):
        scrape(f"{base}/slow", 0.35, LIMIT)
    assert time.monotonic() - began < 0.8  # the whole body takes 1 s


def test_no_server_and_no_http_url_are_scrape_errors() -> None:
    with pytest.raises(ScrapeError, match="Connection refused"):
        scrape(f"http://127.0.0.1:{free_port()}/metrics", 2.0)
    with pytest.raises(ScrapeError, match="is not an http or https URL"):
        scrape("file:///etc/passwd", 2.0)


def test_https_is_checked_against_the_context_given(tmp_path: Path) -> None:
    make_ca(tmp_path, "ca")
    make_cert(tmp_path, "server", "ca", "subjectAltName=IP:127.0.0.1\n")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "server.pem", tmp_path / "server.key")
    with serve(context) as url:
        assert scrape(f"{url}/metrics", 5.0, LIMIT, ssl.create_default_context(cafile=tmp_path / "ca.pem")).startswith(
            EXPOSITION
        )
        with pytest.raises(ScrapeError, match="CERTIFICATE_VERIFY_FAILED"):
            scrape(f"{url}/metrics", 5.0, LIMIT)
