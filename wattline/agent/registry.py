"""Which sources exist, how to build them, and what ``wattline sources`` tells the user.

:func:`discover` is the one discovery path; :class:`Discovery` runs it at start and again
later (periodically, or on request) so devices that appear are sampled and devices that
vanish are reported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from wattline.agent.counter import check_interval, wrap_period_s
from wattline.agent.sources.base import Channel, Note, Source, SourceUnavailable
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
    from wattline.agent.sources.neuron import NeuronOptions, NeuronSource

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


@dataclass(slots=True)
class SourceStatus:
    """Discovery outcome of one source, for ``wattline sources`` and the agent log."""

    name: str
    source: Source | None
    channels: list[Channel] = field(default_factory=list)
    reason: str = ""  #: why it is absent (one line), when source is None
    notes: list[Note] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.source is not None


def discover(
    names: list[str],
    root: Path,
    doc: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    current: Sequence[SourceStatus] = (),
) -> list[SourceStatus]:
    """Build and discover each enabled source; an absent or broken one is reported, not fatal.

    ``current`` (a previous discovery's outcome): a source present there is discovered again
    in place (it keeps what it holds, e.g. a running neuron-monitor), an absent one is built
    anew.
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
        statuses.append(SourceStatus(name, source, channels, notes=list(source.notes)))
    return statuses


def log_statuses(statuses: list[SourceStatus]) -> None:
    """One line per source: what it measures, or why it is absent."""
    for status in statuses:
        if status.available:
            qualities = sorted({ch.quality.value for ch in status.channels})
            log.info("source %s: %d channels (%s)", status.name, len(status.channels), ", ".join(qualities))
        else:
            log.info("source %s: absent: %s", status.name, status.reason)
        for note in status.notes:
            log.log(
                logging.WARNING if note.level == "warning" else logging.INFO, "source %s: %s", status.name, note.text
            )


Key = tuple[str, str, str]  # (source, component, device)


def _keyed(statuses: Sequence[SourceStatus]) -> dict[Key, Channel]:
    return {(ch.source, ch.component, ch.device): ch for s in statuses for ch in s.channels}


class Discovery:
    """The sources of one sampling process: found at start, found again when :meth:`due`.

    Refuses at start (ConfigError, sources closed) a sampling ``interval_s`` not shorter than
    a counter's shortest wrap period. Rediscovery runs every ``every_s`` seconds (0: only on
    :meth:`request`, e.g. from a SIGHUP handler) and logs one line per channel that appeared
    or vanished.
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
        self.statuses = discover(names, root, doc, env)
        if interval_s is not None:
            try:
                check_interval(interval_s, self.channels)
            except BaseException:
                self.close()
                raise
        log_statuses(self.statuses)
        self._next = clock() + every_s
        self._requested = False

    @property
    def sources(self) -> list[Source]:
        return [s.source for s in self.statuses if s.source is not None]

    @property
    def channels(self) -> list[Channel]:
        return [ch for s in self.statuses for ch in s.channels]

    def request(self) -> None:
        """Rediscover at the next :meth:`due` check (safe to call from a signal handler)."""
        self._requested = True

    def due(self) -> bool:
        """True when a rediscovery was requested or its period has passed."""
        return self._requested or (self.every_s > 0 and self._clock() >= self._next)

    def refresh(self) -> None:
        """Discover again now; log what appeared and what vanished."""
        self._requested = False
        self._next = self._clock() + self.every_s
        before = _keyed(self.statuses)
        self.statuses = discover(*self._args, current=self.statuses)
        after = _keyed(self.statuses)
        for key in sorted(after.keys() - before.keys()):
            log.info("rediscovery: %s %s %s appeared; sampled from now on", *key)
            period = wrap_period_s(after[key])
            if self.interval_s is not None and period is not None and self.interval_s >= period:
                log.warning(
                    "rediscovery: %s %s %s wraps in %.1f s, not more than the %g s interval: wraps may be lost",
                    *key,
                    period,
                    self.interval_s,
                )
        reasons = {s.name: s.reason for s in self.statuses if not s.available}
        for key in sorted(before.keys() - after.keys()):
            why = f" (source absent: {reasons[key[0]]})" if key[0] in reasons else ""
            log.warning("rediscovery: %s %s %s vanished; no longer read%s", *key, why)

    def close(self) -> None:
        """Close every source."""
        for source in self.sources:
            source.close()
