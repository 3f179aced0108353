"""Waiting for an observable state (a stored row, a count, a file) instead of sleeping a guess
at how long it takes: the suite runs on busy machines (xdist workers beside CPU hogs), where
any fixed guess is sometimes short. A sleep stays only where time itself is the point (a
lease running out, a job's own run time, a window in which something must NOT happen)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from wattline.stores.reader import Reader, StoredSample

T = TypeVar("T")

#: Long enough for a loaded machine; a wait that passes returns as soon as its state is there.
TIMEOUT_S = 60.0
POLL_S = 0.05


def wait_until(check: Callable[[], T], what: str | Callable[[], str], timeout_s: float = TIMEOUT_S) -> T:
    """``check()``'s first truthy value, polled every :data:`POLL_S`; the test fails naming
    ``what`` (a callable: called then, e.g. for a log's tail) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s:g} s: {what() if callable(what) else what}")
        time.sleep(POLL_S)


def wait_sampled(
    reader: Reader,
    host: str,
    since_ns: int,
    timeout_s: float = TIMEOUT_S,
    refresh: Callable[[], object] = lambda: None,
) -> list[StoredSample]:
    """Wait until ``reader`` holds samples of ``host`` ending at or after ``since_ns``, of every
    series the host had before it (an agent's batches reached the store that far); the first
    such sample of each series. ``refresh``: called before each look (e.g. a flush that makes
    what a store took searchable)."""

    def reached() -> list[StoredSample]:
        refresh()
        after = reader.first_after(host, since_ns)
        before = {s.series for s in reader.last_before(host, since_ns)}
        return after if after and before <= {s.series for s in after} else []

    return wait_until(reached, f"samples of {host} stored up to {since_ns} ns", timeout_s)
