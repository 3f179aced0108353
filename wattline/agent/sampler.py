"""One tick: every source read once, each stamped when it is read, Samples out.

The sampler never waits on the network or storage: it hands samples to a sink (the
spool) that only appends to memory or a local file.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from wattline import wire
from wattline.agent.clock import StampClock
from wattline.agent.counter import Delta, EnergyCounter
from wattline.agent.encoding import EncodedSamples, SampleHead, encode_sample, energy_fields, stamp_fields
from wattline.agent.registry import Discovery
from wattline.agent.sources.base import Channel, Reading, Source

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (source, component, device)

#: Waits up to this long sleep (a cheaper wake-up than Event.wait, which takes a lock and a
#: condition each time); longer ones wait on the stop event. Either way stop is seen within
#: this long.
SLEEP_MAX_S = 0.25
#: A channel's failed reads are logged at most once in this many seconds.
GAP_LOG_S = 60.0
#: Status of a channel that a rediscovery no longer found.
VANISHED = "vanished: no longer found by discovery"


@dataclass(slots=True)
class ChannelState:
    """What the agent knows of one channel now (for Prometheus and ``sources``)."""

    channel: Channel
    counter: EnergyCounter
    last_end_ns: int | None = None
    last: Delta | None = None
    utilization: float | None = None
    gauges: dict[str, float] = field(default_factory=dict)
    healthy: bool = True
    status: str = ""
    #: The channel's constant sample bytes (source, component, device, quality), encoded once.
    head: SampleHead | None = None
    #: ``start_ns`` field of the next sample: last_end_ns, encoded when it was the end.
    start_field: bytes = b""
    #: Monotonic time (s) of the last "read failed" log line: at most one per GAP_LOG_S.
    gap_logged_s: float = -math.inf


@dataclass(slots=True)
class SourceRead:
    """How the last read of one source went (``wattline_source_read_*`` on /metrics)."""

    seconds: float = 0.0  #: how long ``Source.read()`` took
    ok: bool = False  #: it raised nothing and none of its channels' readings failed


def _any_failed(readings: Sequence[Reading]) -> bool:
    """True when a reading carries an error."""
    for reading in readings:  # noqa: SIM110 - any() would build a generator on every tick
        if reading.error is not None:
            return True
    return False


class Sampler:
    """Reads all sources on each :meth:`tick` and emits ``wire.Sample`` lists."""

    def __init__(
        self,
        sources: Sequence[Source],
        sink: Callable[[Sequence[wire.pb.Sample]], None],
        clock: StampClock | None = None,
    ) -> None:
        self.sources = list(sources)
        self.sink = sink
        self.clock = clock or StampClock()
        self.channels: dict[Key, ChannelState] = {}
        #: id(channel) -> (channel, state): skips building and hashing the key on every read.
        self._by_channel: dict[int, tuple[Channel, ChannelState]] = {}
        self.source_errors: dict[str, str] = {}
        #: Source name -> its last read; entries are updated in place (nothing allocated per read).
        self.reads: dict[str, SourceRead] = {}
        self.ticks = 0
        self.samples_emitted = 0
        self.tick_seconds = 0.0  #: wall time spent inside tick()
        self.last_tick_monotonic = time.monotonic()
        self._lock = threading.Lock()  #: channel states (ticks, snapshots, set_sources)
        #: One tick at a time: the loop's and an edge tick on request (another thread) would
        #: otherwise fold a channel's readings out of order, and a rediscovery closes sources.
        self._tick_lock = threading.Lock()

    def tick(self, final: bool = False) -> EncodedSamples:
        """Read every source once and emit the samples of the intervals that closed.

        The samples go to the sink (and are returned) already encoded (:mod:`.encoding`):
        a sink that is not a spool sees a sequence of ``wire.Sample``. ``final`` (the last
        tick, at stop): a counter whose read fails gives its gap up, said as an unhealthy
        interval, rather than holding it for a read that never comes.
        """
        with self._tick_lock:
            samples = self._tick(final, one_stamp=False)[0]
            # Edge ticks leave it: requests must not keep a wedged loop looking alive (the watchdog).
            self.last_tick_monotonic = time.monotonic()
            return samples

    def edge_tick(self) -> int:
        """A tick now whose samples all end at one time stamp, returned: a job's edge falls
        on a sample boundary of every channel, so its energy there is read, not apportioned.
        Safe beside :meth:`run`'s loop (ticks never interleave)."""
        with self._tick_lock:
            stamp = self._tick(False, one_stamp=True)[1]
        assert stamp is not None
        return stamp

    def _tick(self, final: bool, one_stamp: bool) -> tuple[EncodedSamples, int | None]:
        """The tick; ``one_stamp``: every source's readings get the stamp taken after the last
        read (returned), else each source its own, taken right after its read."""
        started = time.perf_counter()
        parts: list[bytes] = []
        held: list[list[Reading]] = []
        reads = self.reads
        for source in self.sources:
            began = time.perf_counter()
            try:
                readings = source.read()
            except Exception as exc:  # one broken source never stops the others
                self._read(reads, source.name, began, False)
                if self.source_errors.get(source.name) != str(exc):
                    log.error("source %s failed: %s", source.name, exc)
                self.source_errors[source.name] = str(exc) or type(exc).__name__
                continue
            self._read(reads, source.name, began, not _any_failed(readings))
            if self.source_errors:
                self.source_errors.pop(source.name, None)
            if one_stamp:
                held.append(readings)
            else:
                self._fold_all(readings, self.clock.now(), final, parts)
        stamp = None
        if one_stamp:
            now = self.clock.now()
            stamp = now[1]
            for readings in held:
                self._fold_all(readings, now, final, parts)
        self.ticks += 1
        samples = EncodedSamples(b"".join(parts), len(parts))
        if parts:
            self.samples_emitted += len(parts)
            self.sink(samples)
        self.tick_seconds += time.perf_counter() - started
        return samples, stamp

    @staticmethod
    def _read(reads: dict[str, SourceRead], name: str, began: float, ok: bool) -> None:
        """Record source ``name``'s read that began at ``began`` (perf_counter s)."""
        seconds = time.perf_counter() - began
        read = reads.get(name)
        if read is None:
            read = reads[name] = SourceRead()
        read.seconds, read.ok = seconds, ok

    def last_reads(self) -> list[tuple[str, SourceRead]]:
        """Each source read so far (and still read) with its last read."""
        return list(self.reads.items())  # one C-level copy: safe beside a tick adding a source

    def _fold_all(self, readings: Iterable[Reading], now: tuple[int, int], final: bool, parts: list[bytes]) -> None:
        """Fold one source's readings stamped ``now`` (monotonic ns, stamp ns) into ``parts``."""
        mono_ns, stamp_ns = now
        mono_s = mono_ns / 1e9
        # The stamp is this interval's end and the channels' next start: encoded once per source.
        end, start = stamp_fields(stamp_ns)
        fold = self._fold
        with self._lock:
            for reading in readings:
                data = fold(reading, mono_s, stamp_ns, end, start, final)
                if data is not None:
                    parts.append(data)

    def _state(self, ch: Channel) -> ChannelState:
        entry = self._by_channel.get(id(ch))
        if entry is not None and entry[0] is ch:
            return entry[1]
        key = (ch.source, ch.component, ch.device)
        state = self.channels.get(key)
        if state is None:
            head = SampleHead(ch.source, ch.component, ch.device, ch.quality.wire)
            state = self.channels[key] = ChannelState(ch, EnergyCounter(ch), head=head)
        self._by_channel[id(ch)] = (ch, state)  # holds ch, so its id is not reused meanwhile
        return state

    def _fold(
        self, reading: Reading, mono_s: float, stamp_ns: int, end: bytes, start: bytes, final: bool = False
    ) -> bytes | None:
        """Fold one reading into its channel's state; the encoded sample of the interval it closed."""
        entry = self._by_channel.get(id(reading.channel))
        state = entry[1] if entry is not None and entry[0] is reading.channel else self._state(reading.channel)
        counter = state.counter
        delta = counter.update(reading, mono_s, final)
        if counter.gap_reads:  # a failed read: the counter holds its last good value, nothing closes
            if counter.gap_reads == 1 and mono_s - state.gap_logged_s >= GAP_LOG_S:
                state.gap_logged_s = mono_s
                ch = reading.channel
                log.warning(
                    "%s %s %s: read failed (%.100s); the next good read counts the whole gap",
                    ch.source,
                    ch.component,
                    ch.device,
                    reading.error,
                )
            state.healthy, state.status = False, reading.error or ""
            return None
        start_ns, state.last_end_ns = state.last_end_ns, stamp_ns
        start_field, state.start_field = state.start_field, start
        utilization = state.utilization = reading.utilization
        gauges = reading.gauges
        if gauges:
            state.gauges = gauges
        if reading.error is not None:
            state.healthy, state.status = False, reading.error
        elif delta is None:
            state.healthy, state.status = True, ""
        else:
            state.healthy, state.status = delta.healthy, delta.status
        if delta is None or start_ns is None:
            return None
        state.last = delta
        head = state.head
        assert head is not None
        return encode_sample(
            head,
            start_field,
            end,
            energy_fields(delta.energy_j, delta.power_w, delta.cumulative_j),
            delta.healthy,
            delta.status,
            utilization,
            delta.energy_error_j,
            gauges,
        )

    def set_sources(self, sources: Sequence[Source], channels: Iterable[Channel]) -> None:
        """Read ``sources`` from the next tick on (after a rediscovery); ``channels`` are theirs.

        A channel that is back under its key (source, component, device) keeps its state and
        cumulative energy; one that is gone is marked "vanished" and its baselines dropped, so
        if it comes back its first read is a new baseline (its energy meanwhile is unknown).
        """
        current = {(ch.source, ch.component, ch.device): ch for ch in channels}
        with self._lock:
            self.sources = list(sources)
            self._by_channel = {}
            for key, state in self.channels.items():
                ch = current.get(key)
                if ch is None:
                    if state.status != VANISHED:
                        state.counter.forget()
                        state.last_end_ns, state.healthy, state.status = None, False, VANISHED
                    continue
                if ch != state.channel:  # e.g. a new power limit: bounds follow the new channel
                    state.channel = state.counter.channel = ch
                    state.head = SampleHead(ch.source, ch.component, ch.device, ch.quality.wire)
                self._by_channel[id(ch)] = (ch, state)
            names = {src.name for src in self.sources}
            for table in (self.source_errors, self.reads):
                for name in [n for n in table if n not in names]:
                    del table[name]

    def snapshot(self) -> list[ChannelState]:
        """A consistent copy of every channel's state."""
        with self._lock:
            return [
                ChannelState(
                    s.channel,
                    s.counter,
                    s.last_end_ns,
                    s.last,
                    s.utilization,
                    dict(s.gauges),
                    s.healthy,
                    s.status,
                    s.head,
                    s.start_field,
                )
                for s in self.channels.values()
            ]

    def rediscover(self, discovery: Discovery) -> None:
        """Discover the sources again and read what was found from the next tick on.

        A rediscovery that breaks is logged and sampling goes on with the sources it had.
        """
        with self._tick_lock:  # refresh closes sources a tick may be reading
            try:
                discovery.refresh()
            except Exception:
                log.exception("rediscovery failed; sampling goes on with the sources found before")
                return
            self.set_sources(discovery.sources, discovery.channels)

    def run(self, interval_s: float, stop: threading.Event, discovery: Discovery | None = None) -> None:
        """Tick every ``interval_s`` on the monotonic clock until ``stop`` is set.

        Ticks are scheduled on a fixed grid; a tick that overran skips the missed slots
        rather than bunching up (the counters make the energy exact either way). ``stop`` is
        seen within SLEEP_MAX_S. With ``discovery``, sources are found again between ticks
        whenever it is due (periodically, or on request: SIGHUP).
        """
        next_at = time.monotonic()
        while not stop.is_set():
            self.tick()
            if discovery is not None and discovery.due():
                self.rediscover(discovery)
            next_at += interval_s
            now = time.monotonic()
            if now > next_at:
                next_at = now + interval_s - ((now - next_at) % interval_s)
            delay = next_at - now
            if delay <= SLEEP_MAX_S:
                time.sleep(delay)
            else:
                stop.wait(delay)
