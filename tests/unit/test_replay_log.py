"""The collector's replay log (issue #43): what it wrote to a store that acknowledges before a
write is durable is kept until it is, and written again where the store lost it.

A real SQLite store stands for such a store: the test says when it "started" and makes it lose
what it acknowledged (rows deleted, as a VictoriaMetrics killed before its flush loses them);
the log must put back exactly those, keep one copy of the rest, drop what the store has had
long enough, survive a killed collector, and stay within its bound. The end-to-end kill of real
engines is tests/e2e/test_store_crash.py's.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

import pytest
from servers import make_batch

from wattline.collector.replay import SUFFIX, Replaying, ReplayLog
from wattline.segments import segment_numbers
from wattline.stores.sqlite.store import SqliteStore

S = 10**9
WINDOW_S = 5.0


class ForgetfulSqlite(SqliteStore):
    """SQLite whose start time the test sets (None: down), with a durability window."""

    durable_after_s = WINDOW_S
    started: int | None = 1

    def started_ns(self) -> int | None:
        return self.started


def rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM energy").fetchone()[0])


def lose_after(path: Path, t_ns: int) -> None:
    """The store loses every sample ending after ``t_ns`` (what it had not made durable)."""
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM energy WHERE time_ns > ?", (t_ns,))


def batches(n: int, t0: int) -> list:
    """``n`` batches of 4 one-second samples each, one after the other from ``t0``."""
    return [make_batch(seq=i + 1, t0=t0 + 4 * i * S) for i in range(n)]


def test_a_store_that_restarted_gets_back_what_it_lost_and_keeps_one_copy(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    store = ForgetfulSqlite(db)
    replay_log = ReplayLog(tmp_path / "log", WINDOW_S, 1 << 20)
    writing = Replaying(store, replay_log, check_s=0)  # the test looks
    try:
        t0 = 10**18
        for b in batches(6, t0):
            assert writing.write(b).rejected == 0
        written = rows(db)
        replay_log.check(store, 0)  # first look: the store's start noted
        lose_after(db, t0 + 2 * S)
        assert rows(db) < written
        store.started = 2  # it restarted
        replay_log.check(store, 1)
        assert rows(db) == written and replay_log.replayed == 6  # every kept batch again, one copy
        replay_log.check(store, 1)
        assert replay_log.replayed == 6  # once
    finally:
        writing.close()


def test_records_go_once_the_store_had_them_a_window_and_not_while_it_is_down(tmp_path: Path) -> None:
    store = ForgetfulSqlite(tmp_path / "w.db")
    replay_log = ReplayLog(tmp_path / "log", WINDOW_S, 1 << 20)
    try:
        now = time.time_ns()
        for b in batches(3, 10**18):
            store.write(b)
            replay_log.record([b], now)
        replay_log.check(store, now)  # the store's start noted; the window not passed: kept
        kept = replay_log.kept_bytes
        assert kept > 0
        store.started = None  # down: nothing may go, however long
        replay_log.check(store, now + 100 * S)
        assert replay_log.kept_bytes == kept
        store.started = 1  # up and the same a window after the writes: gone
        replay_log.check(store, now + int(WINDOW_S * S) + S)
        assert replay_log.kept_bytes == 0 and segment_numbers(replay_log.directory, SUFFIX) == []
    finally:
        store.close()
        replay_log.close()


def test_a_killed_collectors_log_is_written_again_after_a_store_restart(tmp_path: Path) -> None:
    """The collector dies (its log on disk, a torn last record), the store restarts and loses
    the last writes; the next collector's log finds the restart and writes them again."""
    db = tmp_path / "w.db"
    store = ForgetfulSqlite(db)
    replay_log = ReplayLog(tmp_path / "log", WINDOW_S, 1 << 20)
    writing = Replaying(store, replay_log, check_s=0)  # the test looks
    t0 = 10**18
    for b in batches(4, t0):
        writing.write(b)
    replay_log.check(store, 0)
    written = rows(db)
    os.close(replay_log._lock_fd)  # its lock goes with the process
    [number] = segment_numbers(replay_log.directory, SUFFIX)
    with (replay_log.directory / f"seg-{number:016d}{SUFFIX}").open("ab") as seg:
        seg.write(b"\x00\x00\x01\x00torn")
    lose_after(db, t0 + S)
    store.started = 7
    again = ReplayLog(tmp_path / "log", WINDOW_S, 1 << 20)
    again.check(store, 0)
    assert rows(db) == written and again.replayed == 4
    again.close()


def test_the_log_is_bounded_and_says_what_it_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A store down long: the log holds at most its bound (and the segment being written), the
    oldest records dropped, counted and said."""
    bound = 8192
    store = ForgetfulSqlite(tmp_path / "w.db")
    replay_log = ReplayLog(tmp_path / "log", WINDOW_S, bound)
    writing = Replaying(store, replay_log, check_s=0)  # the test looks
    try:
        with caplog.at_level(logging.ERROR):
            for b in batches(60, 10**18):
                writing.write(b)
        assert replay_log.dropped > 0 and replay_log.kept_bytes <= bound + bound // 8 + 2048
        said = [
            r.getMessage() for r in caplog.records if "replay log" in r.getMessage() and "dropped" in r.getMessage()
        ]
        assert said and all("\n" not in m for m in said)
    finally:
        writing.close()


def test_collectors_of_one_store_take_a_slot_each_and_adopt_what_dead_ones_left(tmp_path: Path) -> None:
    """Three live collectors (``--processes 3``, or three on one machine) keep a log each; two
    die with records kept, the store restarts and loses them; the next collector takes the first
    free slot and adopts the other: both written again (an adopted slot's records always are:
    whether the store restarted since its collector looked is not known)."""
    db = tmp_path / "w.db"
    store = ForgetfulSqlite(db)
    live, *dead = (ReplayLog(tmp_path / "log", WINDOW_S, 1 << 20) for _ in range(3))
    assert len({live.directory, *(d.directory for d in dead)}) == 3
    t0 = 10**18
    for i, replay_log in enumerate(dead):
        writing = Replaying(store, replay_log, check_s=0)
        for b in batches(3, t0 + 100 * i * S):
            writing.write(b)
        replay_log.check(store, 0)  # its fsync; the store's start noted
        os.close(replay_log._lock_fd)  # its collector dies
    lose_after(db, 0)
    store.started = 2
    again = ReplayLog(tmp_path / "log", WINDOW_S, 1 << 20)
    assert again.directory == dead[0].directory and segment_numbers(dead[1].directory, SUFFIX) == []
    again.check(store, 0)
    assert again.replayed == 6 and rows(db) == 6 * 4
    again.close()
    live.close()
    store.close()


def test_the_replay_metrics_say_what_is_kept_replayed_and_dropped(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from wattline.collector.replay import ReplayMetrics

    store = ForgetfulSqlite(tmp_path / "w.db")
    replay_log = ReplayLog(tmp_path / "log", WINDOW_S, 8192)
    registry = CollectorRegistry()
    registry.register(ReplayMetrics(replay_log))
    writing = Replaying(store, replay_log, check_s=0)
    try:
        for b in batches(60, 10**18):
            writing.write(b)
        store.started = 2
        replay_log.check(store, 0)
        kept = registry.get_sample_value("wattline_collector_replay_log_bytes")
        replayed = registry.get_sample_value("wattline_collector_replay_batches_total", {"outcome": "replayed"})
        dropped = registry.get_sample_value("wattline_collector_replay_batches_total", {"outcome": "dropped"})
        assert kept == replay_log.kept_bytes > 0
        assert dropped == replay_log.dropped > 0
        assert replayed == 60 - dropped  # every batch still kept went again, none dropped did
    finally:
        writing.close()
