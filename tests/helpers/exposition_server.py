"""A local ``/metrics`` endpoint for tests: a server whose :meth:`ExpositionServer.text` the
test defines (the exposition it serves now, or None for a 503, as a restarting server answers)."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar


class ExpositionServer(ThreadingHTTPServer, ABC):
    """Serves GET with :meth:`text` (each test's subclass says what) on a free loopback port."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"

    @abstractmethod
    def text(self) -> str | bytes | None:
        """The exposition to serve (None: answer 503)."""


class _Handler(BaseHTTPRequestHandler):
    server: ExpositionServer

    def do_GET(self) -> None:
        text = self.server.text()
        body = b"restarting" if text is None else text if isinstance(text, bytes) else text.encode()
        self.send_response(200 if text is not None else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


Server = TypeVar("Server", bound=ExpositionServer)


@contextmanager
def serving(server: Server) -> Iterator[Server]:
    """``server`` answering on a thread of its own until the block ends."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
