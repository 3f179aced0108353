"""``wattline agent``, ``wattline collector`` and ``wattline sources``."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from wattline import systemd
from wattline.agent import registry
from wattline.agent.counter import wrap_period_s
from wattline.agent.settings import AgentSettings
from wattline.agent.sources.base import Channel
from wattline.cli import panels
from wattline.cli.agent_entry import agent_settings, read_config, run_agent_command
from wattline.collector.settings import CollectorSettings
from wattline.config import build, help_of
from wattline.signals import set_on_signals

if TYPE_CHECKING:  # the daemons, stores and writers load in the commands that run them
    from wattline.agent.sampler import Sampler
    from wattline.collector.processes import ProcessLink
    from wattline.reports.summaries.intervals import IntervalWriter
    from wattline.reports.summaries.slurm_comment import AdminCommentWriter
    from wattline.reports.summaries.summary import SummaryWriter

log = logging.getLogger(__name__)

CONFIG_HELP = "TOML config file ([agent], [collector], [sources.NAME] tables); env WATTLINE_* and flags override it."


def _a(key: str) -> str:
    return help_of(AgentSettings, key)


def _c(key: str) -> str:
    return help_of(CollectorSettings, key)


INFLUX_API = typer.Option(None, "--influx-api", help=_c("influx_api"), rich_help_panel=panels.STORE)
INFLUX_DATABASE = typer.Option(None, "--influx-database", help=_c("influx_database"), rich_help_panel=panels.STORE)
INFLUX_ORG = typer.Option(None, "--influx-org", help=_c("influx_org"), rich_help_panel=panels.STORE)
INFLUX_BUCKET = typer.Option(None, "--influx-bucket", help=_c("influx_bucket"), rich_help_panel=panels.STORE)
INFLUX_TOKEN_FILE = typer.Option(
    None, "--influx-token-file", help=_c("influx_token_file"), rich_help_panel=panels.STORE
)
TENANT = typer.Option(None, "--tenant", help=_c("tenant"), rich_help_panel=panels.STORE)


def stop_event() -> threading.Event:
    """An event set by SIGTERM or SIGINT."""
    stop = threading.Event()
    set_on_signals(stop)
    return stop


def agent(
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, rich_help_panel=panels.STORE),
    host_id: str | None = typer.Option(None, help=_a("host_id"), rich_help_panel=panels.HOST),
    labels: list[str] | None = typer.Option(None, "--label", "-l", help=_a("labels"), rich_help_panel=panels.HOST),
    interval: float | None = typer.Option(None, "--interval", "-i", help=_a("interval"), rich_help_panel=panels.HOST),
    sysfs_root: Path | None = typer.Option(None, help=_a("sysfs_root"), rich_help_panel=panels.HOST),
    sources: list[str] | None = typer.Option(
        None, "--source", help=_a("sources") + " Repeat the flag.", rich_help_panel=panels.HOST
    ),
    collectors: list[str] | None = typer.Option(
        None, "--collector", help=_a("collectors") + " Repeat the flag.", rich_help_panel=panels.STORE
    ),
    batch_interval: float | None = typer.Option(None, help=_a("batch_interval"), rich_help_panel=panels.DELIVERY),
    prometheus_port: int | None = typer.Option(None, help=_a("prometheus_port"), rich_help_panel=panels.PROMETHEUS),
    prometheus_addr: str | None = typer.Option(None, help=_a("prometheus_addr"), rich_help_panel=panels.PROMETHEUS),
    push_timeout: float | None = typer.Option(None, help=_a("push_timeout"), rich_help_panel=panels.DELIVERY),
    failback: float | None = typer.Option(None, help=_a("failback"), rich_help_panel=panels.DELIVERY),
    spool_dir: str | None = typer.Option(None, help=_a("spool_dir"), rich_help_panel=panels.DELIVERY),
    spool_max_mb: float | None = typer.Option(None, help=_a("spool_max_mb"), rich_help_panel=panels.DELIVERY),
    spool_max_age: float | None = typer.Option(None, help=_a("spool_max_age"), rich_help_panel=panels.DELIVERY),
    outbox_dir: str | None = typer.Option(None, help=_a("outbox_dir"), rich_help_panel=panels.DELIVERY),
    edge_socket: str | None = typer.Option(None, help=_a("edge_socket"), rich_help_panel=panels.HOST),
    tls: bool | None = typer.Option(None, "--tls", help=_a("tls"), show_default=False, rich_help_panel=panels.SECURITY),
    tls_ca: Path | None = typer.Option(None, help=_a("tls_ca"), rich_help_panel=panels.SECURITY),
    tls_cert: Path | None = typer.Option(None, help=_a("tls_cert"), rich_help_panel=panels.SECURITY),
    tls_key: Path | None = typer.Option(None, help=_a("tls_key"), rich_help_panel=panels.SECURITY),
    tls_server_name: str | None = typer.Option(None, help=_a("tls_server_name"), rich_help_panel=panels.SECURITY),
    token_file: Path | None = typer.Option(None, help=_a("token_file"), rich_help_panel=panels.SECURITY),
) -> None:
    """Run the per-host agent: sample every source and stream to the collector."""
    run_agent_command(
        config,
        host_id=host_id,
        labels=labels,
        interval=interval,
        sysfs_root=sysfs_root,
        sources=sources,
        collectors=collectors,
        batch_interval=batch_interval,
        prometheus_port=prometheus_port,
        prometheus_addr=prometheus_addr,
        push_timeout=push_timeout,
        failback=failback,
        spool_dir=spool_dir,
        spool_max_mb=spool_max_mb,
        spool_max_age=spool_max_age,
        outbox_dir=outbox_dir,
        edge_socket=edge_socket,
        tls=tls,
        tls_ca=tls_ca,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_server_name=tls_server_name,
        token_file=token_file,
    )


def collector(
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, rich_help_panel=panels.STORE),
    listen: str | None = typer.Option(None, help=_c("listen"), rich_help_panel=panels.RECEIVING),
    store: str | None = typer.Option(None, help=_c("store"), rich_help_panel=panels.STORE),
    influx_api: str | None = INFLUX_API,
    influx_database: str | None = INFLUX_DATABASE,
    influx_org: str | None = INFLUX_ORG,
    influx_bucket: str | None = INFLUX_BUCKET,
    influx_token_file: Path | None = INFLUX_TOKEN_FILE,
    tenant: str | None = TENANT,
    prometheus_port: int | None = typer.Option(None, help=_c("prometheus_port"), rich_help_panel=panels.PROMETHEUS),
    prometheus_addr: str | None = typer.Option(None, help=_c("prometheus_addr"), rich_help_panel=panels.PROMETHEUS),
    workers: int | None = typer.Option(None, help=_c("workers"), rich_help_panel=panels.RECEIVING),
    processes: int | None = typer.Option(None, help=_c("processes"), rich_help_panel=panels.RECEIVING),
    max_message_mb: int | None = typer.Option(None, help=_c("max_message_mb"), rich_help_panel=panels.RECEIVING),
    max_batch_points: int | None = typer.Option(None, help=_c("max_batch_points"), rich_help_panel=panels.RECEIVING),
    host_rate: float | None = typer.Option(None, help=_c("host_rate"), rich_help_panel=panels.RECEIVING),
    host_burst: float | None = typer.Option(None, help=_c("host_burst"), rich_help_panel=panels.RECEIVING),
    tls_cert: Path | None = typer.Option(None, help=_c("tls_cert"), rich_help_panel=panels.SECURITY),
    tls_key: Path | None = typer.Option(None, help=_c("tls_key"), rich_help_panel=panels.SECURITY),
    tls_client_ca: Path | None = typer.Option(None, help=_c("tls_client_ca"), rich_help_panel=panels.SECURITY),
    token_file: Path | None = typer.Option(None, help=_c("token_file"), rich_help_panel=panels.SECURITY),
    insecure_listen: bool | None = typer.Option(
        None, "--insecure-listen", help=_c("insecure_listen"), show_default=False, rich_help_panel=panels.SECURITY
    ),
    summaries: bool | None = typer.Option(
        None, "--summaries/--no-summaries", help=_c("summaries"), show_default=False, rich_help_panel=panels.SUMMARIES
    ),
    summary_interval: float | None = typer.Option(None, help=_c("summary_interval"), rich_help_panel=panels.SUMMARIES),
    summary_wait: float | None = typer.Option(None, help=_c("summary_wait"), rich_help_panel=panels.SUMMARIES),
    summary_idle: str | None = typer.Option(None, help=_c("summary_idle"), rich_help_panel=panels.SUMMARIES),
    summary_share_rule: str | None = typer.Option(
        None, help=_c("summary_share_rule"), rich_help_panel=panels.SUMMARIES
    ),
    summary_price: float | None = typer.Option(None, help=_c("summary_price"), rich_help_panel=panels.SUMMARIES),
    summary_carbon_intensity: float | None = typer.Option(
        None, help=_c("summary_carbon_intensity"), rich_help_panel=panels.SUMMARIES
    ),
    summary_pue: float | None = typer.Option(None, help=_c("summary_pue"), rich_help_panel=panels.SUMMARIES),
    service_interval: float | None = typer.Option(None, help=_c("service_interval"), rich_help_panel=panels.SUMMARIES),
    replay_dir: str | None = typer.Option(None, help=_c("replay_dir"), rich_help_panel=panels.DELIVERY),
    replay_max_mb: int | None = typer.Option(None, help=_c("replay_max_mb"), rich_help_panel=panels.DELIVERY),
) -> None:
    """Run the collector: receive agents' batches over gRPC and write them to storage."""
    from wattline.collector.processes import Supervisor
    from wattline.stores.base import StoreUnavailable

    flags = dict(
        listen=listen,
        store=store,
        influx_api=influx_api,
        influx_database=influx_database,
        influx_org=influx_org,
        influx_bucket=influx_bucket,
        influx_token_file=influx_token_file,
        tenant=tenant,
        prometheus_port=prometheus_port,
        prometheus_addr=prometheus_addr,
        workers=workers,
        processes=processes,
        max_message_mb=max_message_mb,
        max_batch_points=max_batch_points,
        host_rate=host_rate,
        host_burst=host_burst,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_client_ca=tls_client_ca,
        token_file=token_file,
        insecure_listen=insecure_listen,
        summaries=summaries,
        summary_interval=summary_interval,
        summary_wait=summary_wait,
        summary_idle=summary_idle,
        summary_share_rule=summary_share_rule,
        summary_price=summary_price,
        summary_carbon_intensity=summary_carbon_intensity,
        summary_pue=summary_pue,
        service_interval=service_interval,
        replay_dir=replay_dir,
        replay_max_mb=replay_max_mb,
    )
    settings = build(CollectorSettings, "collector", read_config(config), flags=flags).validate()
    hooks: dict[str, Any] = dict(
        on_ready=lambda port: systemd.ready(f"listening on port {port}"),
        on_tick=systemd.watchdog,
        on_stop=systemd.stopping,
    )
    try:
        if settings.process_count() > 1:
            Supervisor(settings, collector_process, settings.process_count()).serve(stop_event(), **hooks)
        else:
            serve_collector(settings, stop_event(), **hooks)
    except StoreUnavailable as exc:
        raise RuntimeError(f"store {settings.store}: {exc}") from None


def serve_collector(
    settings: CollectorSettings, stop: threading.Event, link: ProcessLink | None = None, **hooks: Any
) -> None:
    """One collector process: ingest (:func:`run_collector`, ``hooks`` its callbacks) and
    its job summaries' writer."""
    from wattline.collector.daemon import run_collector
    from wattline.reports.summaries.slurm_comment import AdminCommentWriter

    writer: SummaryWriter | None = None
    comments: AdminCommentWriter | None = None
    intervals: IntervalWriter | None = None
    settings.credentials()  # a bad key or token file: its own error, before the summary writer opens the store
    try:
        writer = summary_writer(settings)
        intervals = interval_writer(settings, writer)
        if writer is not None and settings.slurm_admin_comment:
            comments = AdminCommentWriter(timeout_s=settings.slurm_admin_comment_timeout).start()
            writer.on_closed = comments.offer
        elif settings.slurm_admin_comment:
            log.warning("slurm AdminComment off: it is written from job summaries, which are off")
        tells = [w.job_events for w in (writer, intervals) if w is not None]

        def on_job_events(jobs: list[tuple[str, bool]]) -> None:
            for tell in tells:
                tell(jobs)

        run_collector(settings, stop, on_job_events=on_job_events if tells else None, link=link, **hooks)
    finally:
        if intervals is not None:
            intervals.stop()
            intervals.store.close()
        if writer is not None:
            writer.stop()
            writer.reader.close()  # type: ignore[attr-defined]
        if comments is not None:
            comments.stop()


def collector_process(settings: CollectorSettings, link: ProcessLink) -> None:
    """The body of each of several collector processes (``--processes``)."""
    from wattline.stores.base import StoreUnavailable

    try:
        serve_collector(settings, link.stop, link=link)
    except StoreUnavailable as exc:
        raise RuntimeError(f"store {settings.store}: {exc}") from None


def summary_writer(settings: CollectorSettings) -> SummaryWriter | None:
    """The job summaries' writer (floor 4) for the collector (floor 3), started; None when
    summaries are off or the store cannot be read back (said in one log line).

    It reads and writes through a store of its own (a second connection), so a summary
    never waits for ingest's connection nor ingest for it."""
    from wattline.collector.daemon import store_from_settings
    from wattline.reports.model import ReportSettings
    from wattline.reports.summaries.summary import SummaryWriter
    from wattline.stores.base import StoreUnavailable
    from wattline.stores.reader import SummaryStore

    if not settings.summaries:
        return None
    store = store_from_settings(settings)
    if not isinstance(store, SummaryStore):
        log.warning(
            "job summaries off: a %s store cannot be read back by reports (use the InfluxDB 1.x API, VictoriaMetrics, "
            "Prometheus or SQLite)",
            store.kind,
        )
        store.close()
        return None
    try:
        create = getattr(store, "create_database", None)
        if create is not None:  # InfluxDB 1.x: as ingest does before its first write
            create()
        store.job_events("wattline-summary-probe")
    except ValueError as exc:  # a server that answers no InfluxQL: no summary could ever be read or computed
        log.warning("job summaries off: %s", str(exc)[:300])
        store.close()
        return None
    except StoreUnavailable as exc:  # down for now: each summary is retried
        log.warning("job summaries: store not readable yet (%s); retried per job", str(exc)[:300])
    policy = ReportSettings(
        settings.summary_price,
        settings.summary_carbon_intensity,
        settings.summary_pue,
        settings.summary_idle,
        share_rule=settings.summary_share_rule,
    )
    return SummaryWriter(
        store,
        store.write_summary,
        policy,
        running_every_s=settings.summary_interval,
        wait_s=settings.summary_wait,
    ).start()


def interval_writer(settings: CollectorSettings, summaries: SummaryWriter | None) -> IntervalWriter | None:
    """The service intervals' writer, started, on a store connection of its own; None when
    ``service_interval`` is 0 or job summaries are off (it reads what they read)."""
    from wattline.collector.daemon import store_from_settings
    from wattline.reports.summaries.intervals import IntervalWriter
    from wattline.stores.reader import IntervalStore

    if summaries is None or not settings.service_interval > 0:
        return None
    store = store_from_settings(settings)
    if not isinstance(store, IntervalStore):
        log.warning("service intervals off: a %s store does not keep them", store.kind)
        store.close()
        return None
    return IntervalWriter(
        store,
        summaries.settings,
        every_s=settings.service_interval,
        wait_s=settings.summary_wait,
        recheck_every_s=settings.summary_interval,
    ).start()


def sources(
    config: Path | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP, rich_help_panel=panels.STORE),
    sysfs_root: Path | None = typer.Option(None, help=_a("sysfs_root"), rich_help_panel=panels.HOST),
    source_names: list[str] | None = typer.Option(None, "--source", help=_a("sources"), rich_help_panel=panels.HOST),
    interval: float | None = typer.Option(None, "--interval", "-i", help=_a("interval"), rich_help_panel=panels.HOST),
    sample: float = typer.Option(
        1.0, help="Seconds to sample before printing power (0: discovery only).", rich_help_panel=panels.HOST
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.", rich_help_panel=panels.OUTPUT),
) -> None:
    """List each energy source on this host: measured or estimated, and why any is missing."""
    from wattline.agent.sampler import Sampler

    settings, doc = agent_settings(config, sysfs_root=sysfs_root, sources=source_names, interval=interval)
    statuses = registry.discover(settings.sources, settings.sysfs_root, doc, interval_s=settings.interval)
    found = [s for s in (status.sampled for status in statuses) if s is not None]
    sampler = Sampler(found, lambda _samples: None)
    power: dict[tuple[str, str, str], float] = {}
    if sample > 0 and found:
        sampler.tick()
        time.sleep(sample)
        sampler.tick()
        power = {k: s.last.power_w for k, s in sampler.channels.items() if s.last is not None}
    report = sources_report(statuses, sampler, power)
    for source in found:
        source.close()
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    for entry in report:
        if not entry["available"]:
            typer.echo(f"{entry['source']:<10} absent    {entry['reason']}")
        for ch in entry["channels"]:
            watts = "" if ch["power_w"] is None else f"{ch['power_w']:10.2f} W"
            if not ch["usable"]:
                state = f"UNUSABLE: {ch['status']}"
            else:
                state = "ok" if ch["healthy"] else f"UNHEALTHY: {ch['status']}"
            label = "measured" if ch["quality"] != "model" else "ESTIMATE"
            typer.echo(
                f"{entry['source']:<10} {ch['quality']:<10} {label:<9} {ch['component']:<12} "
                f"{ch['device']:<24}{watts}  {state}"
            )
        for note in entry["notes"]:
            typer.echo(f"{entry['source']:<10} note      {note}")


def _channel_entry(ch: Channel, power_w: float | None, healthy: bool, status: str) -> dict[str, Any]:
    return {
        "component": ch.component,
        "device": ch.device,
        "quality": ch.quality.value,
        "measured": ch.quality.measured,
        "power_w": power_w,
        "healthy": healthy,
        "status": status,
        "info": dict(ch.info),
    }


def sources_report(
    statuses: list[registry.SourceStatus], sampler: Sampler, power: dict[tuple[str, str, str], float]
) -> list[dict[str, Any]]:
    """The JSON shape of ``wattline sources --json``: a channel found but not sampled (its
    counter can wrap within the interval) has ``usable`` false, its wrap period and why."""
    report: list[dict[str, Any]] = []
    for status in statuses:
        channels = []
        for ch in status.channels:
            key = (ch.source, ch.component, ch.device)
            state = sampler.channels.get(key)
            entry = _channel_entry(ch, power.get(key), state.healthy if state else True, state.status if state else "")
            channels.append({**entry, "usable": True})
        for u in status.unusable:
            entry = _channel_entry(u.channel, None, False, u.why)
            channels.append({**entry, "usable": False, "wrap_period_s": wrap_period_s(u.channel)})
        report.append(
            {
                "source": status.name,
                "available": status.available,
                "reason": status.reason,
                "error": sampler.source_errors.get(status.name, ""),
                "channels": channels,
                "notes": [n.text for n in status.notes],
                "details": status.source.details() if status.source is not None else {},
            }
        )
    return report


def register(app: typer.Typer) -> None:
    """Add these commands to ``app``."""
    app.command(cls=panels.PanelCommand, rich_help_panel=panels.OPERATE)(agent)
    app.command(cls=panels.PanelCommand, rich_help_panel=panels.OPERATE)(collector)
    app.command(cls=panels.PanelCommand, rich_help_panel=panels.OPERATE)(sources)
