"""Which sources exist, how to build them, and what ``wattline sources`` tells the user.

:func:`discover` is the one discovery path; :class:`Discovery` runs it at start and again
later (periodically, or on request) so devices that appear are sampled and devices that
vanish are reported. Given the sampling interval, discovery also sets aside the channels
whose counter can wrap within it (:class:`Unusable`): they are named, never sampled, and
the other channels go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from wattline.agent.counter import wrap_period_s, wrap_text, wraps_within
from wattline.agent.sources.base import Channel, Note, Reading, Source, SourceUnavailable
from wattline.config import ConfigError, build, table

log = logging.getLogger(__name__)

#: A source's class and its options dataclass, imported when first asked for: a module (and
#: what it imports, e.g. psutil) loads only for the sources a host runs.
Loaded = tuple[type[Source], type[Any]]


def _rapl() -> Loaded:
    from wattline.agent.sources.rapl import Options, RaplSource

    return RaplSource, Options


def _nvml() -> Loaded:
    from wattline.agent.sources.nvml import NvmlOptions, NvmlSource

    return NvmlSource, NvmlOptions


def _neuron() -> Loaded:
    from wattline.agent.sources.neuron import NeuronSource
    from wattline.agent.sources.neuron_config import NeuronOptions

    return NeuronSource, NeuronOptions


def _nic() -> Loaded:
    from wattline.agent.sources.nic import NicSource, Options

    return NicSource, Options


def _cpu_model() -> Loaded:
    from wattline.agent.sources.cpu_model import CpuModelSource, Options

    return CpuModelSource, Options


@dataclass(frozen=True, slots=True)
class Registered:
    """One row of the source table."""

    load: Callable[[], Loaded]
    #: A model that stands down (is not even built) when an earlier source measures this
    #: component, so a model is never reported beside a measurement of the same thing.
    stands_down_for: str = ""
    stand_down_reason: str = ""
    #: Options the source no longer has, with why: a config naming one gets a warning.
    retired: Mapping[str, str] = field(default_factory=dict)


#: Source name -> its row, in discovery order. RAPL comes before the CPU model so the model
#: can stand down when RAPL measures the CPU.
SOURCES: dict[str, Registered] = {
    "rapl": Registered(_rapl),
    "nvml": Registered(_nvml),
    "neuron": Registered(_neuron),
    "nic": Registered(_nic),
    "cpu_model": Registered(
        _cpu_model,
        stands_down_for="cpu_package",
        stand_down_reason="RAPL present: measured CPU energy is used instead",
        retired={"rapl_present": "the agent stands the model down itself when RAPL measures the CPU"},
    ),
}


def source_class(name: str) -> Loaded:
    """The Source subclass of source ``name`` and its options dataclass (imported lazily)."""
    if name not in SOURCES:
        raise ConfigError(f"option agent.sources: unknown source {name!r} (known: {', '.join(SOURCES)})")
    return SOURCES[name].load()


def _options(name: str, doc: Mapping[str, Any] | None, env: Mapping[str, str] | None, warn: bool) -> Any:
    """Source ``name``'s options from config; a retired option is dropped, with a warning when ``warn``."""
    row, section = SOURCES[name], f"sources.{name}"
    given = table(doc or {}, section)
    retired = [key for key in given if key in row.retired]
    for key in retired:
        if warn:
            log.warning("config [%s]: option %r is retired and ignored: %s", section, key, row.retired[key])
        del given[key]
    if retired:
        doc = {"sources": {**table(doc or {}, "sources"), name: given}}
    return build(source_class(name)[1], section, doc, env)


@dataclass(frozen=True, slots=True)
class Unusable:
    """A channel found but not sampled: its counter can wrap within the sampling interval."""

    channel: Channel
    interval_s: float

    @property
    def name(self) -> str:
        """``rapl package-0/dram``: the channel, for lists."""
        return f"{self.channel.source} {self.channel.device}"

    @property
    def brief(self) -> str:
        """``rapl package-0/dram (can wrap in 0.018 s)``: the channel and its wrap period."""
        return f"{self.name} (can wrap in {wrap_period_s(self.channel) or 0.0:.3g} s)"

    @property
    def why(self) -> str:
        """Why the channel gives no energy, one line: "its counter can wrap in 0.018 s ..."."""
        return (
            f"its counter can wrap in {wrap_text(self.channel)}, within the {self.interval_s:g} s sampling interval; "
            "not sampled (sample more often to measure it)"
        )


@dataclass(slots=True)
class SourceStatus:
    """Discovery outcome of one source, for ``wattline sources`` and the agent log."""

    name: str
    source: Source | None
    channels: list[Channel] = field(default_factory=list)  #: the channels sampled
    reason: str = ""  #: why it is absent (one line), when source is None
    notes: list[Note] = field(default_factory=list)
    unusable: list[Unusable] = field(default_factory=list)  #: channels found, not sampled

    @property
    def available(self) -> bool:
        return self.source is not None

    @property
    def sampled(self) -> Source | None:
        """What the sampler reads: the source, less its unusable channels' readings."""
        if self.source is None or not self.unusable:
            return self.source
        return _Without(self.source, frozenset(_key(u.channel) for u in self.unusable))


class _Without(Source):
    """A source whose readings of some channels are dropped before the sampler sees them,
    so an unusable channel never has a counter, a sample or a joule."""

    def __init__(self, inner: Source, skip: frozenset[tuple[str, str, str]]) -> None:
        super().__init__(inner.root)
        self.name, self.notes, self.inner, self.skip = inner.name, inner.notes, inner, skip

    def discover(self) -> list[Channel]:
        return [ch for ch in self.inner.discover() if _key(ch) not in self.skip]

    def read(self) -> list[Reading]:
        return [r for r in self.inner.read() if _key(r.channel) not in self.skip]

    def close(self) -> None:
        self.inner.close()

    def host_labels(self) -> dict[str, str]:
        return self.inner.host_labels()

    def details(self) -> dict[str, Any]:
        return self.inner.details()

    def __getattr__(self, name: str) -> Any:
        # What only some sources offer (e.g. per-process use) is the wrapped source's.
        return getattr(self.inner, name)


def discover(
    names: list[str],
    root: Path,
    doc: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    current: Sequence[SourceStatus] = (),
    interval_s: float | None = None,
) -> list[SourceStatus]:
    """Build and discover each enabled source; an absent or broken one is reported, not fatal.

    ``current`` (a previous discovery's outcome): a source present there is discovered again
    in place (it keeps what it holds, e.g. a running neuron-monitor), an absent one is built
    anew. ``interval_s`` (the sampling interval): channels whose counter can wrap within it
    are set aside as unusable; a source left with none is absent (closed), saying why.
    """
    statuses: list[SourceStatus] = []
    present = {s.name: s.source for s in current if s.source is not None}
    for name in names:
        cls = source_class(name)[0]
        row = SOURCES[name]
        source = present.get(name)
        if row.stands_down_for and any(ch.component == row.stands_down_for for s in statuses for ch in s.channels):
            if source is not None:
                source.close()
            statuses.append(SourceStatus(name, None, reason=row.stand_down_reason))
            continue
        if source is None:
            build_source = cast(Callable[[Path, Any], Source], cls)
            source = build_source(root, _options(name, doc, env, warn=not current))
        try:
            channels = source.discover()
        except SourceUnavailable as exc:
            source.close()
            statuses.append(SourceStatus(name, None, reason=str(exc), notes=list(source.notes)))
            continue
        except Exception as exc:  # a broken source must not stop the others
            log.exception("source %s failed during discovery", name)
            source.close()
            statuses.append(SourceStatus(name, None, reason=f"discovery failed: {exc}", notes=list(source.notes)))
            continue
        unusable = (
            [] if interval_s is None else [Unusable(ch, interval_s) for ch in channels if wraps_within(interval_s, ch)]
        )
        if unusable and len(unusable) == len(channels):
            source.close()
            reason = f"every channel unusable at the {interval_s:g} s interval"
            statuses.append(SourceStatus(name, None, reason=reason, notes=list(source.notes), unusable=unusable))
            continue
        usable = [ch for ch in channels if not any(u.channel is ch for u in unusable)]
        statuses.append(SourceStatus(name, source, usable, notes=list(source.notes), unusable=unusable))
    return statuses


def log_statuses(statuses: list[SourceStatus]) -> None:
    """One line per source: what it measures, or why it is absent."""
    for status in statuses:
        if status.available:
            qualities = sorted({ch.quality.value for ch in status.channels})
            log.info("source %s: %d channels (%s)", status.name, len(status.channels), ", ".join(qualities))
        else:
            log.info("source %s: absent: %s", status.name, status.reason)
        for u in status.unusable:
            log.warning("source %s: %s %s unusable: %s", status.name, u.channel.component, u.channel.device, u.why)
        for note in status.notes:
            log.log(
                logging.WARNING if note.level == "warning" else logging.INFO, "source %s: %s", status.name, note.text
            )


Key = tuple[str, str, str]  # (source, component, device)


def nothing_usable(unusable: Sequence[Unusable]) -> str:
    """The one line refusing an interval at which every channel found is unusable: it names
    the channel that wraps slowest (sampling faster than it measures at least that one)."""
    slowest = max(unusable, key=lambda u: wrap_period_s(u.channel) or 0.0)
    return (
        f"option agent.interval: {slowest.interval_s:g} s: every channel found can wrap within it, so nothing would be "
        f"measured; {slowest.name} wraps slowest, in {wrap_text(slowest.channel)}; sample more often"
    )


def _key(ch: Channel) -> Key:
    return ch.source, ch.component, ch.device


def _keyed(statuses: Sequence[SourceStatus]) -> dict[Key, Channel]:
    return {_key(ch): ch for s in statuses for ch in s.channels}


def _unusable(statuses: Sequence[SourceStatus]) -> dict[Key, Unusable]:
    return {_key(u.channel): u for s in statuses for u in s.unusable}


class Discovery:
    """The sources of one sampling process: found at start, found again when :meth:`due`.

    With a sampling ``interval_s``, channels whose counter can wrap within it are set aside
    (:attr:`unusable`, one warning line each) and the rest are sampled; only an interval at
    which no channel at all could be sampled is refused at start (ConfigError, sources
    closed). Rediscovery runs every ``every_s`` seconds (0: only on :meth:`request`, e.g.
    from a SIGHUP handler) and logs one line per channel that appeared or vanished.
    """

    def __init__(
        self,
        names: list[str],
        root: Path,
        doc: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        *,
        interval_s: float | None = None,
        every_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._args = (names, root, doc, env)
        self.interval_s, self.every_s, self._clock = interval_s, every_s, clock
        self.statuses = discover(names, root, doc, env, interval_s=interval_s)
        if self.unusable and not self.channels:
            self.close()
            raise ConfigError(nothing_usable(self.unusable))
        log_statuses(self.statuses)
        self._next = clock() + every_s
        self._requested = False

    @property
    def sources(self) -> list[Source]:
        """What the sampler reads (unusable channels' readings dropped)."""
        return [s for s in (status.sampled for status in self.statuses) if s is not None]

    @property
    def channels(self) -> list[Channel]:
        """The channels sampled."""
        return [ch for s in self.statuses for ch in s.channels]

    @property
    def unusable(self) -> list[Unusable]:
        """The channels found but not sampled at this interval."""
        return [u for s in self.statuses for u in s.unusable]

    def request(self) -> None:
        """Rediscover at the next :meth:`due` check (safe to call from a signal handler)."""
        self._requested = True

    def due(self) -> bool:
        """True when a rediscovery was requested or its period has passed."""
        return self._requested or (self.every_s > 0 and self._clock() >= self._next)

    def refresh(self) -> None:
        """Discover again now; log what appeared, what vanished and what is newly unusable."""
        self._requested = False
        self._next = self._clock() + self.every_s
        before, unusable_before = _keyed(self.statuses), _unusable(self.statuses)
        self.statuses = discover(*self._args, current=self.statuses, interval_s=self.interval_s)
        after, unusable = _keyed(self.statuses), _unusable(self.statuses)
        for key in sorted(after.keys() - before.keys()):
            log.info("rediscovery: %s %s %s appeared; sampled from now on", *key)
        for key in sorted(unusable.keys() - unusable_before.keys()):
            log.warning("rediscovery: %s %s %s unusable: %s", *key, unusable[key].why)
        reasons = {s.name: s.reason for s in self.statuses if not s.available}
        for key in sorted(before.keys() - after.keys() - unusable.keys()):
            why = f" (source absent: {reasons[key[0]]})" if key[0] in reasons else ""
            log.warning("rediscovery: %s %s %s vanished; no longer read%s", *key, why)

    def close(self) -> None:
        """Close every source."""
        for source in self.sources:
            source.close()
