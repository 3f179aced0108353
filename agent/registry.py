"""Which sources exist, how to build them, and what ``wattline sources`` tells the user.

:func:`discover` is the one discovery path; :class:`Discovery` runs it at start and again
later (periodically, or on request) so devices that appear are sampled and devices that
vanish are reported.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wattline.agent.counter import check_interval, wrap_period_s
from wattline.agent.sources.base import Channel, Note, Source, SourceUnavailable
from wattline.config import ConfigError, build

log = logging.getLogger(__name__)

#: Source name -> module under wattline.agent.sources, in discovery order. RAPL comes
#: before the CPU model so the model can stand down when RAPL measures the CPU.
SOURCES: dict[str, str] = {
    "rapl": "rapl",
    "nvml": "nvml",
    "neuron": "neuron",
    "nic": "nic",
    "cpu_model": "cpu_model",
}


def source_class(name: str) -> tuple[type[Source], type[Any]]:
    """The Source subclass of source ``name`` and its options dataclass (imported lazily)."""
    if name not in SOURCES:
        raise ConfigError(f"option agent.sources: unknown source {name!r} (known: {', '.join(SOURCES)})")
    module = importlib.import_module(f"wattline.agent.sources.{SOURCES[name]}")
    for obj in vars(module).values():
        if isinstance(obj, type) and issubclass(obj, Source) and obj is not Source and obj.name == name:
            return obj, _options_type(obj)
    raise ImportError(f"module {module.__name__} defines no Source named {name!r}")


def _options_type(cls: type[Source]) -> type[Any]:
    hint = typing.get_type_hints(cls.__init__)["options"]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if not dataclasses.is_dataclass(hint):
        raise TypeError(f"{cls.__name__}: options must be a dataclass")
    return typing.cast(type[Any], hint)


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
    rapl_cpu = False
    for name in names:
        cls, options_cls = source_class(name)
        source = present.get(name)
        if source is None:
            source = typing.cast(Any, cls)(root, build(options_cls, f"sources.{name}", doc, env))
        options: Any = getattr(source, "options", None)
        if name == "cpu_model" and hasattr(options, "rapl_present"):
            options.rapl_present = rapl_cpu
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
        if name == "rapl":
            rapl_cpu = any(ch.component == "cpu_package" for ch in channels)
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
