"""Ship sealed batches to the collector over gRPC; fail over between addresses.

A batch leaves the spool only when a collector acknowledged it (after its write to
storage), oldest first. Errors a retry may fix (UNAVAILABLE: collector or storage down;
DEADLINE_EXCEEDED; RESOURCE_EXHAUSTED: busy or over the host's rate; UNAUTHENTICATED /
PERMISSION_DENIED: credentials being rotated) keep the batch, move to the next address
and back off (exponential with jitter, up to ``max_backoff_s``). A batch the collector
finds too large is split in two and retried. INVALID_ARGUMENT means the batch can never
be stored: it is dropped, counted and logged. After ``failback_s`` on a secondary
collector, the preferred one is tried again.

The uplink runs in its own thread: the sampler never waits for the network.

Cost (``bench/run``'s agent part): at 1 Hz a push's agent CPU is nearly all gRPC's per-call
machinery, the same as for an empty call; the batch's bytes add little. The channel
therefore sends no BDP pings (``grpc.http2.bdp_probe``: a PING round trip after each
response, tuning windows that a batch of a few kB never fills).

Counters (exported on the agent's ``/metrics``): ``sent_batches`` acknowledged pushes,
``failed_pushes``, ``resent_batches`` (pushes of a batch whose previous push failed; what an
earlier process left in the disk spool goes out as new batches), ``sent_bytes`` (serialized
batches, resends included), ``rejected_batches`` / ``rejected_points``, ``failovers``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from wattline import wire
from wattline.agent.spool.base import Spool
from wattline.security import bearer_metadata

log = logging.getLogger(__name__)

_FATAL = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}
_CREDENTIALS = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
#: Words of a RESOURCE_EXHAUSTED that mean "this batch is too large" (gRPC's, or the collector's).
_TOO_LARGE = ("larger than max",)


def channel_options(server_name: str | None = None) -> list[tuple[str, Any]]:
    """Channel settings: no transparent retries (the uplink retries), keepalive pings."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", 64 << 20),
        ("grpc.enable_retries", 0),
        ("grpc.http2.bdp_probe", 0),  # no PING round trip after each response (module docstring)
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


class Uplink:
    """Delivers the spool's batches in order to the first collector that answers."""

    def __init__(
        self,
        spool: Spool,
        addresses: list[str],
        *,
        timeout_s: float = 10.0,
        batch_interval_s: float = 1.0,
        failback_s: float = 30.0,
        max_backoff_s: float = 10.0,
        credentials: grpc.ChannelCredentials | None = None,
        call_credentials: grpc.CallCredentials | None = None,
        token: str | None = None,
        server_name: str | None = None,
        quiet: bool = False,
    ) -> None:
        if not addresses:
            raise ValueError("no collector address")
        self.spool = spool
        self.addresses = addresses
        self.timeout_s = timeout_s
        self.batch_interval_s = batch_interval_s
        self.failback_s = failback_s
        self.max_backoff_s = max_backoff_s
        self._credentials = credentials
        if credentials is not None and call_credentials is not None:
            self._credentials = grpc.composite_channel_credentials(credentials, call_credentials)
        self._metadata = bearer_metadata(token)
        self._options = channel_options(server_name)
        #: Log failed pushes at DEBUG only (the caller reports ``last_error`` itself).
        self.quiet = quiet
        self._index = 0
        self._since_failover = 0.0
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        #: (stream id, seq) of the batch whose last push failed: pushing it again is a resend.
        self._failed_batch: tuple[str, int] | None = None
        self.connected = False
        self.sent_batches = 0
        self.sent_bytes = 0
        self.resent_batches = 0
        self.failed_pushes = 0
        self.rejected_batches = 0
        self.rejected_points = 0
        self.failovers = 0
        self.last_error = ""

    @property
    def address(self) -> str:
        return self.addresses[self._index]

    def _connect(self) -> Any:
        if self._stub is None:
            if self._credentials is None:
                self._channel = grpc.insecure_channel(self.address, options=self._options)
            else:
                self._channel = grpc.secure_channel(self.address, self._credentials, options=self._options)
            self._stub = wire.telemetry_stub(self._channel)
        return self._stub

    def _switch(self, index: int) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel, self._stub = None, None
        if index != self._index:
            self.failovers += 1
        self._index = index
        self._since_failover = time.monotonic()

    def push_once(self, timeout_s: float | None = None) -> bool:
        """Send the oldest pending batch (waiting at most ``timeout_s``, default the push
        timeout); True when it was acknowledged (or dropped as invalid, or split)."""
        batch = self.spool.peek()
        if batch is None:
            return False
        if self._index and time.monotonic() - self._since_failover > self.failback_s:
            log.info("trying preferred collector %s again", self.addresses[0])
            self._switch(0)
        self._count_send(batch, batch.ByteSize())
        try:
            ack = self._connect().Push(
                batch, timeout=timeout_s or self.timeout_s, wait_for_ready=False, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            details = (exc.details() if isinstance(exc, grpc.Call) else str(exc)) or ""
            return self._failed(batch, code, details)
        self.connected = True
        self.last_error = ""
        self.spool.ack(ack.seq, ack.stream_id or batch.stream_id)
        self.sent_batches += 1
        if ack.rejected:
            self.rejected_points += ack.rejected
            log.warning("collector refused %d points of batch %d: %s", ack.rejected, batch.seq, ack.message)
        return True

    def _count_send(self, batch: wire.pb.Batch, size: int) -> None:
        """Count one push of ``batch`` (``size`` bytes): a resend if it was pushed before."""
        self.sent_bytes += size
        if self._failed_batch == (batch.stream_id, batch.seq):
            self.resent_batches += 1

    def _failed(self, batch: wire.pb.Batch, code: grpc.StatusCode, details: str) -> bool:
        if code in _FATAL:
            log.error("collector refused batch %d for good (%s: %s); dropped", batch.seq, code.name, details)
            self.rejected_batches += 1
            self.spool.ack(batch.seq, batch.stream_id)
            return True
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and any(w in details for w in _TOO_LARGE):
            if self.spool.split_head():
                return True
            log.error(
                "collector %s refused batch %d as too large and it cannot be split (%s); dropped; "
                "raise collector.max_message_mb / max_batch_points",
                self.address,
                batch.seq,
                details,
            )
            self.rejected_batches += 1
            self.spool.ack(batch.seq, batch.stream_id)
            return True
        self.failed_pushes += 1
        self._failed_batch = (batch.stream_id, batch.seq)
        self.connected = False
        message = f"{self.address}: {code.name}: {details}"
        if message != self.last_error:
            level = logging.ERROR if code in _CREDENTIALS else logging.WARNING
            level = logging.DEBUG if self.quiet else level
            log.log(level, "collector %s", message)
        self.last_error = message
        self._switch((self._index + 1) % len(self.addresses))
        raise ConnectionError(message)

    def drain(self, until: float | None = None) -> None:
        """Send everything sealed so far (a push waits no later than the monotonic ``until``);
        raises ConnectionError on the first failure."""
        while self.push_once(None if until is None else max(0.05, until - time.monotonic())):
            if until is not None and time.monotonic() >= until:
                return

    def run(self, stop: threading.Event, between: Callable[[], object] | None = None) -> None:
        """Seal and send every ``batch_interval_s`` until ``stop``; back off on failures.

        ``between`` is called on this thread after each round a collector answered (the
        agent's look at its job-event outbox: no thread of its own waking up)."""
        backoff = 0.0
        while not stop.is_set():
            self.spool.seal()
            try:
                self.drain()
                backoff = 0.0
                if between is not None:
                    between()
                stop.wait(self.batch_interval_s)
            except ConnectionError:
                backoff = min(max(backoff * 2, 0.2), self.max_backoff_s)
                stop.wait(backoff * random.uniform(0.5, 1.0))

    def flush(self, deadline_s: float) -> bool:
        """Final delivery on shutdown; True when nothing is left unacknowledged."""
        self.spool.seal()
        end = time.monotonic() + deadline_s
        while self.spool.backlog() and time.monotonic() < end:
            try:
                self.drain(until=end)  # a shutdown's last push waits no longer than its deadline
            except ConnectionError:
                time.sleep(min(0.2, max(0.0, end - time.monotonic())))
        return self.spool.backlog() == 0

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
