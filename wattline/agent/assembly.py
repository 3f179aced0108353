"""The agent's parts, built in one place: for the agent process and for ``wattline run``.

:func:`assemble` discovers the sources, names the host, opens the spool and wires the
sampler to it; :func:`make_uplink` ships a spool with the agent's collectors and
credentials. :class:`~wattline.agent.daemon.Agent` (``wattline agent``, ``python -m
wattline.agent``) and ``wattline run``'s embedded session and collector sink
(``wattline/jobs/wrappers/session.py``) are all built from these.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from wattline import __version__, wire
from wattline.agent import registry
from wattline.agent.sampler import Sampler
from wattline.agent.settings import AgentSettings
from wattline.agent.spool.base import Spool
from wattline.agent.spool.memory import MemorySpool
from wattline.agent.uplink import Uplink
from wattline.config import ConfigError
from wattline.security import channel_credentials, is_loopback, read_token

#: What the sampler hands its samples to (the spool's ``add_samples``, possibly wrapped).
SampleSink = Callable[[Sequence[wire.pb.Sample]], None]


def host_identity(settings: AgentSettings, statuses: list[registry.SourceStatus]) -> wire.pb.Host:
    """Host id (configured or hostname) and labels (sources' discoveries, then config)."""
    labels: dict[str, str] = {}
    for status in statuses:
        if status.source is not None:
            labels.update(status.source.host_labels())
    labels.update(settings.labels)
    return wire.Host(host_id=settings.host_id or socket.gethostname(), labels=labels, agent_version=__version__)


def spool_directory(settings: AgentSettings, env: Mapping[str, str] | None = None) -> Path | None:
    """Where the disk spool lives: ``spool_dir``, else ``$STATE_DIRECTORY/spool`` (systemd); None: memory."""
    if settings.spool_dir == "memory":
        return None
    if settings.spool_dir:
        return Path(settings.spool_dir).expanduser()
    state = (os.environ if env is None else env).get("STATE_DIRECTORY", "")
    first = state.split(":")[0]
    return Path(first) / "spool" if first else None


def memory_spool(settings: AgentSettings, host: wire.pb.Host) -> Spool:
    """The in-memory spool, bounded by the settings."""
    return MemorySpool(host, max_batch_samples=settings.batch_max_samples, max_batches=settings.spool_max_batches)


def open_spool(settings: AgentSettings, host: wire.pb.Host, env: Mapping[str, str] | None = None) -> Spool:
    """The disk spool when a directory is configured (or given by systemd), else the in-memory one."""
    directory = spool_directory(settings, env)
    if directory is None:
        return memory_spool(settings, host)
    from wattline.agent.spool.disk import DiskSpool  # here: an agent with the memory spool never loads it

    return DiskSpool(
        host,
        directory,
        max_batch_samples=settings.batch_max_samples,
        max_bytes=max(1, int(settings.spool_max_mb * 2**20)),
        max_age_s=settings.spool_max_age,
    )


@dataclass
class UplinkSecurity:
    """What the uplink needs to authenticate the collector and itself."""

    credentials: grpc.ChannelCredentials | None = None
    token: str | None = None
    server_name: str | None = None


def uplink_security(settings: AgentSettings) -> UplinkSecurity:
    """TLS credentials and token from the settings' files; refuses a token in clear text beyond loopback."""
    token = read_token(settings.token_file, "agent.token_file")
    credentials = None
    if settings.uses_tls:
        credentials = channel_credentials(settings.tls_ca, settings.tls_cert, settings.tls_key)
    elif token is not None:
        remote = [a for a in settings.collectors if not is_loopback(a)]
        if remote:
            raise ConfigError(
                f"option agent.token_file: the token would cross the network in clear text to {remote[0]}; "
                "enable TLS (agent.tls_ca, or agent.tls = true)"
            )
    return UplinkSecurity(credentials, token, settings.tls_server_name or None)


def make_uplink(spool: Spool, settings: AgentSettings, security: UplinkSecurity, **overrides: Any) -> Uplink:
    """An uplink shipping ``spool`` to the settings' collectors (``overrides``: Uplink keywords)."""
    options: dict[str, Any] = {
        "timeout_s": settings.push_timeout,
        "batch_interval_s": settings.batch_interval,
        "failback_s": settings.failback,
        "credentials": security.credentials,
        "token": security.token,
        "server_name": security.server_name,
        **overrides,
    }
    return Uplink(spool, settings.collectors, **options)


@dataclass
class Parts:
    """Discovered sources, the host they name, the spool and the sampler feeding it."""

    discovery: registry.Discovery
    host: wire.pb.Host
    spool: Spool
    sampler: Sampler


def assemble(
    settings: AgentSettings,
    doc: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    memory: bool = False,
    tap: Callable[[SampleSink], SampleSink] | None = None,
) -> Parts:
    """Discover, name the host, open the spool (``memory``: always in memory), wire the sampler.

    ``tap`` wraps the spool's ``add_samples`` (e.g. a live power meter). The sources are
    closed again if the spool cannot be opened.
    """
    discovery = registry.Discovery(
        settings.sources,
        settings.sysfs_root,
        doc,
        env,
        interval_s=settings.interval,
        every_s=settings.rediscover_interval,
    )
    host = host_identity(settings, discovery.statuses)
    try:
        spool = memory_spool(settings, host) if memory else open_spool(settings, host, env)
    except BaseException:
        discovery.close()
        raise
    sink: SampleSink = spool.add_samples if tap is None else tap(spool.add_samples)
    return Parts(discovery, host, spool, Sampler(discovery.sources, sink))
