"""The reference LayoutLM inference served over HTTP: a service that never ends, measured by
its own Prometheus metrics (``wattline workload layoutlm-serve``).

- ``POST /infer``: synthetic documents through the model of :mod:`.layoutlm_inference`
  (its :class:`~.layoutlm_inference.Engine`); an empty body is one document, a JSON body
  ``{"documents": N}`` is N (1 .. ``--max-batch``). Concurrent requests are batched
  (:class:`~.batcher.Batcher`). The answer: ``{"documents", "predictions", "batch"}`` (token
  labels predicted, and the size of the batch the request ran in).
- ``GET /metrics``: a registry of the service's own, ``model`` = ``layoutlm-SIZE``:
  ``layoutlm_requests_total{outcome}`` (``ok``: answered; ``error``: a bad request or a failed
  batch; ``refused``: arrived while stopping), ``layoutlm_documents_total`` (documents answered),
  ``layoutlm_request_latency_seconds`` (arrival to answer, answered requests) and
  ``layoutlm_in_flight_requests``. A request is counted just before its answer is written, so
  a client that has its answer finds it counted.
- ``GET /health``: 200 ``{"status": "serving"}``; 503 ``stopping`` or ``stopped``.

SIGTERM (or SIGINT) stops it gracefully: new requests are refused (503), the admitted ones
run at once without waiting for their batch to fill and are answered; then ``/metrics``
stays up ``--linger`` seconds (``/health`` says ``stopped``), so a last scrape sees the final
counts, and the listening socket closes. A restart on the same port thus loses no request a
client was answered and counts none twice.
"""

from __future__ import annotations

import itertools
import json
import signal
import socket
import socketserver
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any, TextIO
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from wattline.reference.batcher import Batcher
from wattline.reference.common import RANDOM_WEIGHTS, import_torch, import_transformers, set_threads
from wattline.reference.layoutlm_inference import Engine

WORKLOAD = "layoutlm-serve"
OUTCOMES = ("ok", "error", "refused")
#: The largest request body read: a JSON object with one count.
MAX_BODY = 4096


@dataclass(frozen=True)
class ServeSettings:
    """What ``wattline workload layoutlm-serve`` parsed; ``device`` is resolved (not ``auto``)."""

    size: str
    device: str
    dtype: str
    threads: int | None
    seed: int
    host: str
    port: int
    max_batch: int
    max_wait_ms: float
    linger_s: float


class Metrics:
    """The service's counters, histogram and gauge in a registry of its own."""

    def __init__(self, model: str) -> None:
        self.model, self.registry = model, CollectorRegistry()
        r = self.registry
        requests = Counter(
            "layoutlm_requests", "Inference requests by outcome (ok, error, refused).", ["model", "outcome"], registry=r
        )
        # every outcome from zero: a scraper sees a series' first increment as an increase
        self.outcome = {o: requests.labels(model=model, outcome=o) for o in OUTCOMES}
        self.documents = Counter("layoutlm_documents", "Documents in answered requests.", ["model"], registry=r).labels(
            model=model
        )
        self.latency = Histogram(
            "layoutlm_request_latency_seconds", "Answered requests: arrival to answer.", ["model"], registry=r
        ).labels(model=model)
        self.in_flight = Gauge(
            "layoutlm_in_flight_requests", "Requests admitted and not yet answered.", ["model"], registry=r
        ).labels(model=model)

    def counts(self) -> dict[str, float]:
        """Requests by outcome, as a scrape reads them."""
        read = self.registry.get_sample_value
        return {o: read("layoutlm_requests_total", {"model": self.model, "outcome": o}) or 0.0 for o in OUTCOMES}

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def parse_documents(body: bytes, max_batch: int) -> int:
    """Documents a request asks for: 1 for an empty body, else ``{"documents": N}``; ValueError otherwise."""
    if not body.strip():
        return 1
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("the body is not JSON") from None
    n = doc.get("documents", 1) if isinstance(doc, dict) else None
    if type(n) is not int or not 1 <= n <= max_batch:
        raise ValueError(f'"documents" must be an integer in 1..{max_batch}')
    return n


class Service:
    """Admission, batching, counting and the graceful stop, apart from HTTP."""

    def __init__(self, batcher: Batcher, metrics: Metrics, seq_len: int) -> None:
        self.batcher, self.metrics, self.seq_len = batcher, metrics, seq_len
        self.state = "serving"
        self._cond = threading.Condition()
        self._in_flight = 0

    def admit(self) -> bool:
        """Take a request in (it must be :meth:`release`\\ d after its answer is written), or
        count it refused when stopping."""
        with self._cond:
            if self.state != "serving":
                self.metrics.outcome["refused"].inc()
                return False
            self._in_flight += 1
        self.metrics.in_flight.inc()
        return True

    def release(self) -> None:
        self.metrics.in_flight.dec()
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def infer(self, body: bytes, arrived: float) -> tuple[int, dict[str, Any]]:
        """An admitted request's status and answer, counted by outcome before it is written."""
        try:
            documents = parse_documents(body, self.batcher.max_batch)
        except ValueError as exc:
            self.metrics.outcome["error"].inc()
            return 400, {"error": str(exc)}
        try:
            batch = self.batcher.submit(documents)
        except Exception as exc:
            self.metrics.outcome["error"].inc()
            return 500, {"error": f"{type(exc).__name__}: {exc}"}
        self.metrics.outcome["ok"].inc()
        self.metrics.documents.inc(documents)
        self.metrics.latency.observe(time.perf_counter() - arrived)
        return 200, {"documents": documents, "predictions": documents * self.seq_len, "batch": batch}

    def stop(self, linger_s: float) -> None:
        """Refuse new requests, answer the admitted ones, then keep /metrics up ``linger_s``."""
        with self._cond:
            self.state = "stopping"
        self.batcher.flush()
        with self._cond:
            self._cond.wait_for(lambda: self._in_flight == 0)
        self.batcher.close()
        with self._cond:
            self.state = "stopped"
        time.sleep(linger_s)


class Handler(BaseHTTPRequestHandler):
    """The three paths; HTTP/1.1 keep-alive, so a client reuses its connection."""

    protocol_version = "HTTP/1.1"
    # the answer's headers and body are two writes: with Nagle the body would wait for the
    # client's delayed acknowledgement of the headers
    disable_nagle_algorithm = True
    server: Server

    def do_GET(self) -> None:
        service = self.server.service
        path = urlsplit(self.path).path
        if path == "/metrics":
            self._send(200, service.metrics.exposition(), CONTENT_TYPE_LATEST)
        elif path == "/health":
            self._json(200 if service.state == "serving" else 503, {"status": service.state})
        else:
            self._json(404, {"error": f"no {path}: GET /metrics, GET /health, POST /infer"})

    def do_POST(self) -> None:
        arrived = time.perf_counter()
        service = self.server.service
        path = urlsplit(self.path).path
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY or "Transfer-Encoding" in self.headers:
            # the body cannot be skipped reliably: answer and close the connection
            self.close_connection = True
            self._json(400, {"error": f"a request body needs a Content-Length of at most {MAX_BODY}"})
            return
        body = self.rfile.read(length)
        if path != "/infer":
            self._json(404, {"error": f"no {path}: POST /infer"})
        elif not service.admit():
            self._json(503, {"error": "the service is stopping"})
        else:
            try:
                self._json(*service.infer(body, arrived))
            finally:
                service.release()

    def _json(self, status: int, doc: dict[str, Any]) -> None:
        self._send(status, json.dumps(doc).encode(), "application/json")

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        if self.server.service.state != "serving":
            self.close_connection = True  # a client reconnects, to whichever process serves then
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """No access log: one line per request would cost more than a tiny model's batch."""


class Server(socketserver.ThreadingTCPServer):
    """A thread per connection; IPv4 or IPv6 as the host resolves."""

    allow_reuse_address = True  # a restart binds the same port at once
    daemon_threads = True  # idle keep-alive connections do not hold the exit
    request_queue_size = 128  # a load generator's burst of connections waits in the backlog

    def __init__(self, host: str, port: int, service: Service) -> None:
        self.service = service
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        super().__init__((host, port), Handler)

    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://[{host}]:{port}" if self.address_family == socket.AF_INET6 else f"http://{host}:{port}"


def log(message: str) -> None:
    print(f"[{WORKLOAD}] {message}", file=sys.stderr, flush=True)


def serve(settings: ServeSettings, out: TextIO = sys.stdout) -> int:
    """Build the model, serve until SIGTERM / SIGINT, stop gracefully; the exit status.

    Ready, it prints one line on ``out``: ``listening on http://HOST:PORT``.
    """
    torch = import_torch()
    import_transformers()
    threads = set_threads(torch, settings.threads)
    s = settings
    engine = Engine(s.size, s.device, s.dtype, s.max_batch, s.seed)
    # Neuron runs the shape it was traced for: every batch is padded to --max-batch there
    shape = (lambda n: s.max_batch) if s.device == "neuron" else (lambda n: n)
    for size in sorted({shape(1), shape(s.max_batch)}):
        engine.prepare(size)  # the first requests do not pay for tracing or caches
    index = itertools.count()

    def run(documents: int) -> None:
        engine.infer(shape(documents), next(index))

    metrics = Metrics(f"layoutlm-{s.size}")
    batcher = Batcher(run, s.max_batch, s.max_wait_ms / 1000, worker_context=engine.context)
    service = Service(batcher, metrics, engine.seq_len)
    try:
        server = Server(s.host, s.port, service)
    except OSError as exc:
        raise OSError(f"cannot listen on {s.host} port {s.port}: {exc.strerror or exc}") from None
    stopping: list[int] = []
    # the handler only records the signal: the main thread acts on it
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    log(
        f"LayoutLM-{s.size} ({RANDOM_WEIGHTS}): {engine.parameters / 1e6:.1f} M parameters, device {s.device}, "
        f"{s.dtype}, {threads} CPU threads; batches up to {s.max_batch} documents, waiting up to {s.max_wait_ms:g} ms"
    )
    print(f"listening on {server.url()}", file=out, flush=True)
    while not stopping:
        time.sleep(0.1)
    log(f"{signal.Signals(stopping[0]).name}: answering the requests in flight, refusing new ones")
    service.stop(s.linger_s)
    server.shutdown()
    server.server_close()
    n = metrics.counts()
    log(f"stopped: {n['ok']:g} requests answered, {n['error']:g} errors, {n['refused']:g} refused")
    return 0
