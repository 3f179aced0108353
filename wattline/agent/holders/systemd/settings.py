"""The ``[systemd]`` table: services held by systemd units named in the agent's config
(docs/services.md, "A service held by a systemd unit").

Each entry of ``services`` names a unit and how its server counts its units, in the grammar
of ``wattline run --metrics/--count/--preset`` (:mod:`wattline.served_specs`)::

    [[systemd.services]]
    unit = "vllm.service"
    job = "vllm-a100"            # its job id (default: systemd:<unit>)
    metrics = "http://127.0.0.1:8000/metrics"
    preset = "vllm"              # or count = "requests=vllm:request_success_total"

The agent reads the table on every start and loads the watcher only where a service is named.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from wattline.config import ConfigError, build, option
from wattline.text import clip

if TYPE_CHECKING:
    from wattline.served_specs import Spec

#: A system unit's name as systemd spells it (systemd.unit(5)): no path, a ``.service`` suffix.
_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]{1,247}\.service")
#: The keys of one service entry.
KEYS = ("unit", "job", "name", "kind", "metrics", "count", "preset")
KINDS = ("inference", "training", "other")


@dataclass(frozen=True, slots=True)
class UnitService:
    """One service of the config: the unit that holds it, its job and what it counts where."""

    unit: str
    job_id: str
    name: str
    kind: str
    metrics: str
    specs: tuple[Spec, ...]  #: its unit specs, the job's own first
    latencies: tuple[Spec, ...] = ()  #: its latency histograms' specs

    @property
    def spec(self) -> Spec:
        """The job's own unit."""
        return self.specs[0]


@dataclass
class SystemdSettings:
    """The ``[systemd]`` table (env ``WATTLINE_SYSTEMD_*``; ``services`` only in the file)."""

    services: list[dict[str, str]] = option(
        [],
        "Services held by systemd units, one table each ([[systemd.services]]): unit (NAME.service), metrics "
        "(the server's Prometheus URL), count (unit specs NAME=METRIC{MATCHERS}, one a line: the first is the "
        "job's unit) or preset (vllm, triton, tgi, torchserve: every unit and latency histogram it names), and "
        "optionally job (its job id, default systemd:UNIT), name and kind (inference, training, "
        "other). The unit's job is open while its cgroup system.slice/UNIT holds processes. In the file only.",
    )
    poll_interval: float = option(5.0, "Seconds between two looks at the units' cgroups and scrapes of their metrics.")
    grace: float = option(
        300.0,
        "Seconds a stopped unit's job stays open: a unit back within it (a restart) goes on in the same job; "
        "past it the job closes at the unit's stop.",
    )

    def validate(self) -> SystemdSettings:
        if not 0.1 <= self.poll_interval <= 60:
            raise ConfigError(f"option systemd.poll_interval: {self.poll_interval} s out of range (0.1..60)")
        if not 0 <= self.grace <= 86400:
            raise ConfigError(f"option systemd.grace: {self.grace} s out of range (0..86400)")
        self.parsed()
        return self

    def parsed(self) -> list[UnitService]:
        """The services, checked; ConfigError (one line) naming the first bad entry."""
        out: list[UnitService] = []
        for number, entry in enumerate(self.services, 1):
            try:
                service = unit_service(entry)
            except ValueError as exc:
                raise ConfigError(f"option systemd.services, entry {number}: {exc}") from None
            for other in out:
                if service.unit == other.unit or service.job_id == other.job_id:
                    same = "unit" if service.unit == other.unit else "job"
                    raise ConfigError(f"option systemd.services, entry {number}: the same {same} as an earlier entry")
            out.append(service)
        return out


def unit_service(entry: Mapping[str, str]) -> UnitService:
    """One entry's service; ValueError (one line) when it asks badly."""
    from wattline.served_specs import service_specs  # only where a service is named

    unknown = sorted(set(entry) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown key {clip(unknown[0])} (known: {', '.join(KEYS)})")
    unit = entry.get("unit", "")
    if not _UNIT.fullmatch(unit):
        raise ValueError(f"unit {clip(unit)}: expected a system unit's name, NAME.service")
    count, name = entry.get("count"), entry.get("preset")
    if (count is None) == (name is None):
        raise ValueError(
            f"give one of count (a unit spec) and preset (a known server): {'both' if count else 'neither'} given"
        )
    specs, latencies = service_specs(count, name)
    metrics = entry.get("metrics", "")
    where = urlsplit(metrics)
    if where.scheme not in ("http", "https") or not where.hostname:
        raise ValueError(
            f"metrics {clip(metrics)}: expected the server's http(s) URL, e.g. http://127.0.0.1:8000/metrics"
        )
    kind = entry.get("kind", "other")
    if kind not in KINDS:
        raise ValueError(f"kind {clip(kind)}: expected one of {', '.join(KINDS)}")
    job_id = entry.get("job") or f"systemd:{unit}"
    if len(job_id) > 200 or not job_id.isprintable():
        raise ValueError(f"job {clip(job_id)}: at most 200 printable characters")
    title = entry.get("name") or unit.removesuffix(".service")
    return UnitService(unit, job_id, title, kind, metrics, specs, latencies)


def systemd_settings(doc: Mapping[str, Any]) -> SystemdSettings | None:
    """The ``[systemd]`` table's settings where it names a service, else None; ConfigError on bad ones."""
    settings = build(SystemdSettings, "systemd", doc).validate()
    return settings if settings.services else None
