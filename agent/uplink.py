"""Ship sealed batches to the collector over gRPC; fail over between addresses.

A batch leaves the spool only when the collector acknowledged it (after its write to
storage). Errors that a retry may fix (UNAVAILABLE, DEADLINE_EXCEEDED,
RESOURCE_EXHAUSTED...) keep the batch and move to the next address with back-off;
INVALID_ARGUMENT means the batch can never be stored: it is dropped and counted.
After ``failback_s`` on a secondary collector, the preferred one is tried again.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc

from wattline import wire
from wattline.agent.spool import Spool

log = logging.getLogger(__name__)

_FATAL = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}


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
        self._index = 0
        self._since_failover = 0.0
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self.connected = False
        self.sent_batches = 0
        self.failed_pushes = 0
        self.rejected_batches = 0
        self.last_error = ""

    @property
    def address(self) -> str:
        return self.addresses[self._index]

    def _connect(self) -> Any:
        if self._stub is None:
            options = [("grpc.max_send_message_length", 64 << 20), ("grpc.enable_retries", 0)]
            if self._credentials is None:
                self._channel = grpc.insecure_channel(self.address, options=options)
            else:
                self._channel = grpc.secure_channel(self.address, self._credentials, options=options)
            self._stub = wire.telemetry_stub(self._channel)
        return self._stub

    def _switch(self, index: int) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel, self._stub = None, None
        self._index = index
        self._since_failover = time.monotonic()

    def push_once(self) -> bool:
        """Send the oldest pending batch; True when it was acknowledged (or dropped as invalid)."""
        batch = self.spool.peek()
        if batch is None:
            return False
        if self._index and time.monotonic() - self._since_failover > self.failback_s:
            log.info("trying preferred collector %s again", self.addresses[0])
            self._switch(0)
        try:
            ack = self._connect().Push(batch, timeout=self.timeout_s, wait_for_ready=False)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            if code in _FATAL:
                log.error("collector refused batch %d for good (%s: %s); dropped", batch.seq, code.name, details)
                self.rejected_batches += 1
                self.spool.ack(batch.seq)
                return True
            self.failed_pushes += 1
            self.connected = False
            message = f"{self.address}: {code.name}: {details}"
            if message != self.last_error:
                log.warning("collector %s", message)
            self.last_error = message
            self._switch((self._index + 1) % len(self.addresses))
            raise ConnectionError(message) from None
        self.connected = True
        self.last_error = ""
        self.spool.ack(ack.seq)
        self.sent_batches += 1
        return True

    def drain(self) -> None:
        """Send everything sealed so far; raises ConnectionError on the first failure."""
        while self.push_once():
            pass

    def run(self, stop: threading.Event) -> None:
        """Seal and send every ``batch_interval_s`` until ``stop``; back off on failures."""
        backoff = 0.0
        while not stop.is_set():
            self.spool.seal()
            try:
                self.drain()
                backoff = 0.0
                stop.wait(self.batch_interval_s)
            except ConnectionError:
                backoff = min(max(backoff * 2, 0.2), self.max_backoff_s)
                stop.wait(backoff)

    def flush(self, deadline_s: float) -> bool:
        """Final delivery on shutdown; True when nothing is left unacknowledged."""
        self.spool.seal()
        end = time.monotonic() + deadline_s
        while self.spool.backlog() and time.monotonic() < end:
            try:
                self.drain()
            except ConnectionError:
                time.sleep(0.2)
        return self.spool.backlog() == 0

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
