"""Which sources exist, how to build them, and what ``wattline sources`` tells the user."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
) -> list[SourceStatus]:
    """Build and discover each enabled source; an absent or broken one is reported, not fatal."""
    statuses: list[SourceStatus] = []
    rapl_cpu = False
    for name in names:
        cls, options_cls = source_class(name)
        options = build(options_cls, f"sources.{name}", doc, env)
        if name == "cpu_model" and hasattr(options, "rapl_present"):
            options.rapl_present = rapl_cpu
        source = typing.cast(Any, cls)(root, options)
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
