"""The collector's replay log: what it wrote to a store that acknowledges a write before the
write is durable, kept on disk until it is, and written again where the store lost it.

VictoriaMetrics answers a write once the write is in its memory and makes it durable seconds
later (docs/delivery.md, "What acknowledged means"): killed in between, it loses what the
collector had acknowledged, and the agents had dropped from their spools on that word. So for
a store that says so (:attr:`~.stores.base.Store.durable_after_s` above 0), every group the
collector commits is appended to this log before its batches are acknowledged
(:class:`Replaying`), in segment files of CRC-checked records (:mod:`wattline.segments`): a
``write`` each (a killed collector keeps them), an ``fsync`` every :data:`CHECK_S` (a power cut
loses at most that).

Every :data:`CHECK_S` the log asks the store when it started (:meth:`~.stores.base.Store.started_ns`).
A record is dropped once the store was seen up, the same process, ``durable_after_s`` after
the record was written; where the store's start time changed (it restarted, and may have lost
what it had not made durable), every record kept is written again (the store keeps one copy
of a point written twice) and kept for another window. Bounded: at most ``max_bytes`` on disk
(a store down that long); beyond, the oldest segments are dropped, said in one line and
counted. One directory per store URL (named by its hash), a slot in it per live collector
process (a lock held while it lives); a collector adopts what dead ones left in the others.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from wattline import wire
from wattline.segments import encode_record, scan, segment_name, segment_numbers, sync_files, write_record
from wattline.stores.base import Store, StoreUnavailable, WriteResult

log = logging.getLogger(__name__)

MAGIC, SUFFIX = b"WLREPLY1", ".wlr"
#: Seconds between two looks at the store (and fsyncs of the log).
CHECK_S = 1.0
#: A new segment at least this often, so records are dropped about when they may be.
SEGMENT_S = 2.0
#: Batches written again in one store write.
REPLAY_GROUP = 64
#: A segment holds at most this part of the log's bound.
SEGMENTS = 8
#: Most collector processes with a log of one store on one machine.
SLOTS = 64


class ReplayError(RuntimeError):
    """The log cannot be used (its directory not writable, or held by another process)."""


@dataclass(slots=True)
class _Segment:
    number: int
    size: int
    kept_since_ns: int  #: its newest record's write, or its last replay: its window runs from here


class ReplayLog:
    """One store's replay log in ``directory`` (see the module doc)."""

    def __init__(self, directory: Path, window_s: float, max_bytes: int) -> None:
        """The log of one store in ``directory`` (:func:`log_directory`): this process takes
        the first slot (``p0``, ``p1``, …) no live collector holds, and adopts what dead ones
        left in the others."""
        self.window_ns, self.max_bytes = int(window_s * 1e9), max_bytes
        self.replayed = self.dropped = 0  #: batches written again; batches dropped by the bound
        self._lock = threading.Lock()
        self.directory, self._lock_fd = _take_slot(directory)
        self._segments: list[_Segment] = []
        try:
            adopted = _adopt(directory, self.directory)
            for number in segment_numbers(self.directory, SUFFIX):  # what a killed collector left
                path = self.directory / segment_name(number, SUFFIX)
                data = path.read_bytes()
                records, end = scan(data) if data.startswith(MAGIC) else ([], 0)
                if records:  # a torn last record is cut off
                    os.truncate(path, end)
                    self._segments.append(_Segment(number, end, max(r[2] for r in records)))
                else:
                    path.unlink()
        except OSError as exc:
            os.close(self._lock_fd)
            raise ReplayError(f"replay log {self.directory}: {exc.strerror or exc}") from None
        self._started = self._read_started()
        self._inherited = bool(self._segments)
        #: records of another slot's dead collector, whose store start this log never noted
        self._adopted = adopted
        self._fd: int | None = None
        self._opened_ns = 0
        self._unsynced: list[int] = []  #: segments closed by size, not yet fsynced

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    def record(self, batches: Sequence[wire.pb.Batch], now_ns: int) -> None:
        """Append ``batches`` (committed to the store at ``now_ns``); OSError where they could not be."""
        payloads = [encode_record(b.SerializeToString(), now_ns) for b in batches]
        with self._lock:
            if self._fd is not None and self._segments[-1].size >= self.max_bytes // SEGMENTS:
                self._unsynced.append(self._fd)  # a new segment, so the bound can drop the oldest;
                self._fd = None  # fsynced at the next look
            segment = self._current(now_ns)
            for payload in payloads:
                assert self._fd is not None
                write_record(self._fd, payload, segment.size)
                segment.size += len(payload)
            segment.kept_since_ns = now_ns
            self._bound()

    def check(self, store: Store, now_ns: int) -> None:
        """One look at the store: write everything kept again where it restarted, else drop what
        it has had long enough; and make what was appended durable."""
        self._sync(rotate=now_ns - self._opened_ns >= SEGMENT_S * 1e9)
        started = store.started_ns()
        if started is None:  # down, or not saying: keep everything
            return
        if self._adopted or (started != self._started and (self._started is not None or self._inherited)):
            # it restarted; or a killed collector's records whose store's start was not noted
            self._replay(store, now_ns)
        self._inherited = self._adopted = False
        self._save_started(started)
        with self._lock:
            closed = self._segments[:-1] if self._fd is not None else self._segments
            for segment in [s for s in closed if s.kept_since_ns + self.window_ns <= now_ns]:
                self._remove(segment)

    def close(self) -> None:
        self._sync(rotate=True)
        os.close(self._lock_fd)

    # -- internals -------------------------------------------------------------------------

    def _replay(self, store: Store, now_ns: int) -> None:
        """Write every record kept again (StoreUnavailable: the next look tries again)."""
        self._sync(rotate=True)
        with self._lock:
            segments = list(self._segments)
        count = 0
        for segment in segments:
            try:
                data = (self.directory / segment_name(segment.number, SUFFIX)).read_bytes()
            except FileNotFoundError:  # dropped by the bound meanwhile (said there)
                continue
            batches = [wire.Batch.FromString(payload) for *_, payload in scan(data)[0]]
            for i in range(0, len(batches), REPLAY_GROUP):
                store.write_group(batches[i : i + REPLAY_GROUP])
            segment.kept_since_ns = now_ns
            count += len(batches)
        self.replayed += count
        log.warning(
            "%s restarted (its start time changed): %d batches it acknowledged within %g s before may be lost, "
            "written again from the replay log %s",
            store.kind,
            count,
            self.window_ns / 1e9,
            self.directory,
        )

    def _current(self, now_ns: int) -> _Segment:
        if self._fd is None:
            number = (self._segments[-1].number + 1) if self._segments else 1
            path = self.directory / segment_name(number, SUFFIX)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
            os.write(self._fd, MAGIC)
            self._segments.append(_Segment(number, len(MAGIC), now_ns))
            self._opened_ns = now_ns
        return self._segments[-1]

    def _detach(self, rotate: bool) -> tuple[list[int], bool]:
        """Under the lock: the descriptors to fsync (the open segment's, a copy; those rotated
        since the last look), closing the open segment if ``rotate``; whether one was closed."""
        fds, self._unsynced = self._unsynced, []
        closed = bool(fds)
        if self._fd is not None:
            fds.append(self._fd if rotate else os.dup(self._fd))
            if rotate:
                self._fd, closed = None, True
        return fds, closed

    def _sync(self, rotate: bool) -> None:
        """fsync what was appended (outside the lock: records go on meanwhile)."""
        with self._lock:
            fds, closed = self._detach(rotate)
        if fds:
            sync_files(self.directory, fds, sync_dir=closed)

    def _bound(self) -> None:
        """Drop the oldest segments beyond ``max_bytes`` (said, counted)."""
        while len(self._segments) > 1 and sum(s.size for s in self._segments) > self.max_bytes:
            oldest = self._segments[0]
            data = (self.directory / segment_name(oldest.number, SUFFIX)).read_bytes()
            lost = len(scan(data)[0])
            self.dropped += lost
            self._remove(oldest)
            log.error(
                "replay log %s full (%d MiB): %d batches dropped, lost if the store loses them too",
                self.directory,
                self.max_bytes >> 20,
                lost,
            )

    def _remove(self, segment: _Segment) -> None:
        self._segments.remove(segment)
        try:
            (self.directory / segment_name(segment.number, SUFFIX)).unlink()
        except OSError as exc:
            log.error("replay log %s: %s not removed: %s", self.directory, segment.number, exc.strerror)

    def _read_started(self) -> int | None:
        try:
            return int(json.loads((self.directory / "store.json").read_text())["started_ns"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _save_started(self, started_ns: int) -> None:
        if started_ns == self._started:
            return
        tmp = self.directory / "store.json.tmp"
        tmp.write_text(json.dumps({"started_ns": started_ns}) + "\n")
        os.replace(tmp, self.directory / "store.json")
        self._started = started_ns


class Replaying(Store):
    """``store``, with each committed group appended to ``replay_log`` before it is
    acknowledged, and the log looked after by a thread of its own (see the module doc)."""

    def __init__(self, store: Store, replay_log: ReplayLog, check_s: float = CHECK_S) -> None:
        """``check_s``: seconds between the thread's looks (0: no thread; the caller looks)."""
        self.store, self.log, self.check_s = store, replay_log, check_s
        self.kind, self.max_concurrent_writes = store.kind, store.max_concurrent_writes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wattline-replay", daemon=True)
        self._look()  # the store's start, before anything is written
        if check_s > 0:
            self._thread.start()

    def write(self, batch: wire.pb.Batch) -> WriteResult:
        return self.write_group([batch])[0]

    def write_group(self, batches: Sequence[wire.pb.Batch]) -> list[WriteResult]:
        results = self.store.write_group(batches)
        try:
            self.log.record(batches, time.time_ns())
        except OSError as exc:  # not kept: not acknowledged (the agents send it again)
            raise StoreUnavailable(f"replay log {self.log.directory}: {exc.strerror or exc}") from exc
        return results

    def started_ns(self) -> int | None:
        return self.store.started_ns()

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            self._look()

    def _look(self) -> None:
        try:
            self.log.check(self.store, time.time_ns())
        except StoreUnavailable as exc:  # the next look tries again
            log.debug("replay log: %s", exc)
        except Exception:  # a bug here must not end the collector's writes
            log.exception("replay log: look failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.log.close()
        self.store.close()


def log_directory(root: Path, store_url: str) -> Path:
    """The directory of the logs of the store at ``store_url`` under ``root`` (a slot per live collector)."""
    return root / hashlib.sha256(store_url.encode()).hexdigest()[:16]


def _take_slot(directory: Path) -> tuple[Path, int]:
    """The first slot of ``directory`` no live process holds, and its lock (held while this lives)."""
    try:
        for slot in range(SLOTS):
            path = directory / f"p{slot}"
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return path, fd
    except OSError as exc:
        raise ReplayError(f"replay log {directory}: {exc.strerror or exc}") from None
    raise ReplayError(f"replay log {directory}: {SLOTS} live collectors hold a slot each")


def _adopt(directory: Path, mine: Path) -> bool:
    """Move into ``mine`` the segments of every slot of ``directory`` that no live process
    holds (a collector that died, or ran with more ``--processes``); True if there were any."""
    adopted = False
    for other in sorted(p for p in directory.glob("p*") if p != mine and p.is_dir()):
        fd = os.open(other / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live collector's
            numbers = segment_numbers(mine, SUFFIX)
            after = numbers[-1] if numbers else 0
            for i, number in enumerate(segment_numbers(other, SUFFIX), start=after + 1):
                os.rename(other / segment_name(number, SUFFIX), mine / segment_name(i, SUFFIX))
                adopted = True
        finally:
            os.close(fd)
    if adopted:
        log.warning("replay log %s: took over what dead collectors left in %s", mine, directory)
    return adopted


class ReplayMetrics:
    """The replay log's figures as Prometheus metrics (a custom collector: read at scrape)."""

    def __init__(self, replay_log: ReplayLog) -> None:
        self.log = replay_log

    def collect(self) -> Iterator[Metric]:
        kept = GaugeMetricFamily(
            "wattline_collector_replay_log_bytes", "Bytes the replay log keeps (written, not yet durable in the store)."
        )
        kept.add_metric([], self.log.kept_bytes)
        yield kept
        batches = CounterMetricFamily(
            "wattline_collector_replay_batches",
            "Batches of the replay log written again after the store restarted (replayed), or dropped by its bound.",
            labels=["outcome"],
        )
        batches.add_metric(["replayed"], self.log.replayed)
        batches.add_metric(["dropped"], self.log.dropped)
        yield batches
