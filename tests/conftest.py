"""Test session set-up: the real-server fixtures, and a private state and data home.

``wattline run`` keeps undelivered job events in ``$XDG_STATE_HOME/wattline/outbox`` and
the embedded store in ``$XDG_DATA_HOME/wattline``; every wattline process delivers the
outbox leftovers of dead ones to the collector it reaches. Tests point both at fresh
directories of their own, so a job a test left undelivered (a SIGKILLed wrapper, a
collector that never came up) never lands in another test's store, and nothing is written
to the home of whoever runs the tests.
"""

import os
import tempfile

from servers import influxd, victoria_metrics  # noqa: F401

_HOME = tempfile.mkdtemp(prefix="wattline-tests-")
os.environ["XDG_STATE_HOME"] = os.path.join(_HOME, "state")
os.environ["XDG_DATA_HOME"] = os.path.join(_HOME, "data")
