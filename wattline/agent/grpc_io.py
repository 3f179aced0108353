"""Import gRPC for a wattline process with its client I/O on the calling thread.

gRPC (1.85) runs a client call's reads and writes on its EventEngine thread pool by
default: after each call the pool's threads keep waking up between pushes, and for an agent
that pushes a small batch every few seconds those wake-ups cost more CPU than the call
itself. With the ``event_engine_client`` experiment off, the thread that waits for the
answer polls the socket itself (gRPC's long-standing poller) and nothing wakes between
calls. ``bench/run``'s agent part (the ``floor+grpc`` yardstick) shows the difference.

gRPC reads ``GRPC_EXPERIMENTS`` once, when it is imported, so :func:`import_grpc` must run
before anything imports it: ``python -m wattline.agent`` and the ``wattline`` console script
(every command) call it first. It sets the variable only for that import (a command that
``wattline run`` starts does not inherit it), leaves a value the user set alone, and does
nothing once gRPC is imported. Libraries (the Job API in a user's process) never call it:
their process's gRPC stays as its owner set it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

#: The experiment switched off: the client's I/O on the EventEngine thread pool.
EXPERIMENTS = "-event_engine_client"
VARIABLE = "GRPC_EXPERIMENTS"


def import_grpc(environ: MutableMapping[str, str] | None = None) -> bool:
    """Import grpc with the client's I/O on the calling thread; True when this call chose it."""
    env = os.environ if environ is None else environ
    if "grpc" in sys.modules or VARIABLE in env:
        return False
    env[VARIABLE] = EXPERIMENTS
    try:
        import grpc  # noqa: F401  (reads GRPC_EXPERIMENTS now)
    finally:
        del env[VARIABLE]
    return True
