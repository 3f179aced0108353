"""A running job's lease: a KIND_HEARTBEAT event every ``wire.heartbeat_s()`` seconds.

``wattline run`` and the Job API (when it opens its own job) start one after the open
event and stop it before the close. If the process dies without a close (SIGKILL, OOM
killer, a lost node), the heartbeats stop; readers then take the job as abandoned at its
last event once ``wire.lease_ns()`` has passed (see :mod:`wattline.jobs.jobs_view`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from wattline import wire
from wattline.jobs.events import EventBuilder

log = logging.getLogger(__name__)


class Heartbeat:
    """Sends ``builder.heartbeat()`` through ``send`` every ``period_s`` from a daemon thread."""

    def __init__(
        self, builder: EventBuilder, send: Callable[[list[wire.pb.JobEvent]], None], period_s: float | None = None
    ) -> None:
        self.builder = builder
        self.send = send
        self.period_s = wire.heartbeat_s() if period_s is None else period_s
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wattline-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        """No heartbeat after this returns (the close comes next)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.send([self.builder.heartbeat()])
                self.sent += 1
            except Exception as exc:  # a failed renewal must never stop the job itself
                log.warning("job %s: heartbeat not sent: %s", self.builder.spec.job_id, exc)
