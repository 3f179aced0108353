"""The collector process: open the store, serve gRPC (+ metrics), stop gracefully."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable

from prometheus_client import start_http_server

from wattline.collector.processes import ProcessLink
from wattline.collector.replay import ReplayError, Replaying, ReplayLog, ReplayMetrics, log_directory
from wattline.collector.server import CollectorServer, JobEventsHook
from wattline.collector.settings import CollectorSettings
from wattline.config import ConfigError, read_secret
from wattline.stores.base import Store
from wattline.stores.factory import open_store

log = logging.getLogger(__name__)


def store_from_settings(settings: CollectorSettings, read_only: bool = False) -> Store:
    """Open the configured store (``read_only``: see :func:`open_store`); secrets come from a
    file or the environment only."""
    token = read_secret(settings.influx_token_file, "WATTLINE_INFLUX_TOKEN", "InfluxDB token")
    return open_store(
        settings.store,
        api=None if settings.influx_api == "auto" else settings.influx_api,  # type: ignore[arg-type]
        database=settings.influx_database,
        org=settings.influx_org,
        bucket=settings.influx_bucket,
        token=token or "",
        username=settings.influx_username or None,
        password=read_secret(None, "WATTLINE_INFLUX_PASSWORD", "InfluxDB password"),
        read_only=read_only,
        tenant=settings.tenant,
    )


def with_replay_log(store: Store, settings: CollectorSettings) -> Store:
    """``store``, keeping what is written to it in a replay log where it acknowledges writes
    before they are durable (:mod:`.replay`); ConfigError (the store closed) when the log cannot
    be opened: the collector would acknowledge what a crash of the store may lose."""
    if store.durable_after_s <= 0:
        return store
    try:
        directory = log_directory(settings.replay_root(), settings.store)
        replay_log = ReplayLog(directory, store.durable_after_s, settings.replay_max_mb << 20)
    except (ConfigError, ReplayError) as exc:
        store.close()
        raise ConfigError(f"{exc} (collector.replay_dir)") from None
    log.info(
        "%s acknowledges writes before they are durable: each kept %g s in the replay log %s",
        store.kind,
        store.durable_after_s,
        replay_log.directory,
    )
    return Replaying(store, replay_log)


def run_collector(
    settings: CollectorSettings,
    stop: threading.Event,
    on_ready: Callable[[int], object] | None = None,
    on_tick: Callable[[], object] | None = None,
    on_stop: Callable[[], object] | None = None,
    on_job_events: JobEventsHook | None = None,
    link: ProcessLink | None = None,
) -> None:
    """Serve until ``stop`` is set; in-flight batches are written and acknowledged first.

    ``on_job_events``: see :class:`~wattline.collector.server.TelemetryService` (job summaries).
    ``link``: this is one of several processes (:mod:`wattline.collector.processes`): the
    port is shared, metrics and stream spans go to the supervisor."""
    # Credentials first: a bad key or a loose token file fails before anything is opened.
    credentials, token = settings.credentials()
    store = with_replay_log(store_from_settings(settings), settings)
    try:
        server = CollectorServer(
            store,
            settings.listen,
            workers=settings.workers,
            max_message_bytes=settings.max_message_mb << 20,
            max_batch_points=settings.max_batch_points,
            host_rate=settings.host_rate,
            host_burst=settings.host_burst,
            server_credentials=credentials,
            token=token,
            require_identity=settings.tls_client_ca is not None,
            on_job_events=on_job_events,
            reuse_port=link is not None,
            live=link,
        )
    except BaseException:
        store.close()
        raise
    if isinstance(store, Replaying):
        server.registry.register(ReplayMetrics(store.log))
    if settings.prometheus_port is not None:
        start_http_server(settings.prometheus_port, addr=settings.prometheus_addr, registry=server.registry)
    server.start()
    # What startup made (modules, the server, the store) lives as long as the process: out of
    # the cyclic GC's reach, a full collection no longer rescans it (under load, full
    # collections of that heap were most of the collector's GC time and its longest pauses).
    gc.freeze()
    security = "plaintext" if credentials is None else "mutual TLS" if settings.tls_client_ca else "TLS"
    log.info(
        "collector listening on %s (port %d, %s%s), writing to %s",
        settings.listen,
        server.port,
        security,
        ", bearer token" if token else "",
        store.kind,
    )
    if link is not None:
        link.ready(server.registry, server.port)
    if on_ready is not None:
        on_ready(server.port)
    try:
        while not stop.wait(1.0):
            if on_tick is not None:
                on_tick()
    finally:
        if on_stop is not None:
            on_stop()
        log.info("collector stopping: finishing in-flight batches")
        server.stop()
        store.close()
