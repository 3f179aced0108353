"""Options several commands share, each defined once, and their parsing.

A group of options that always go together (the store's, the report's) is added to a
command by a decorator: typer sees each option, the command gets one parsed value
(:func:`option_group`).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from wattline.cli import panels
from wattline.cli.agent_entry import read_config
from wattline.cli.daemons import (
    INFLUX_API,
    INFLUX_BUCKET,
    INFLUX_DATABASE,
    INFLUX_ORG,
    INFLUX_TOKEN_FILE,
    TENANT,
)
from wattline.collector.settings import CollectorSettings, check_tenant
from wattline.config import ConfigError, build
from wattline.reports.intensity import IntensitySeries, parse_intensity
from wattline.reports.model import DEFAULT_MODEL_SPLIT, ReportSettings
from wattline.reports.model_split import MODEL_SPLIT_HELP
from wattline.share_rules import DEFAULT_SHARE_RULE, SHARE_RULE_HELP, check_share_rule

if TYPE_CHECKING:  # stores, jobs and reports load in the commands that use them
    from wattline.jobs.wrappers.job_command import JobStore
    from wattline.stores.base import Store
    from wattline.stores.reader import OpenReader

STORE_HELP = (
    "Store to read/write: sqlite:///PATH or http://influxdb:8086 (default: $WATTLINE_STORE or the local SQLite file)."
)
CONFIG_HELP = "TOML config file ([agent], [collector], [sources.NAME] tables)."
JOB_HELP = "an id, a unique id prefix, a job name (its latest run) or latest (see `wattline jobs`)"

VERBOSE = typer.Option(
    False, "--verbose", "-v", help="Log each source's discovery, not one summary line.", rich_help_panel=panels.OUTPUT
)
PRICE = typer.Option(
    None, "--price", help="Instance price, USD per instance-hour (cost figures).", rich_help_panel=panels.REPORT
)
CARBON = typer.Option(
    None,
    "--carbon-intensity",
    help="Grid carbon intensity: gCO2 per kWh, or a CSV file time,gco2_per_kwh applied interval by interval.",
    rich_help_panel=panels.REPORT,
)
PUE = typer.Option(1.0, "--pue", help="Power usage effectiveness applied to CO2 (>= 1).", rich_help_panel=panels.REPORT)
IDLE = typer.Option(
    "none",
    "--idle",
    help="Idle policy: none (total energy) or subtract (above the pre-job baseline).",
    rich_help_panel=panels.REPORT,
)
SHARE = typer.Option(DEFAULT_SHARE_RULE, "--share-rule", help=SHARE_RULE_HELP, rich_help_panel=panels.REPORT)
MODEL_SPLIT = typer.Option(DEFAULT_MODEL_SPLIT, "--model-split", help=MODEL_SPLIT_HELP, rich_help_panel=panels.REPORT)
STORE = typer.Option(None, "--store", help=STORE_HELP, rich_help_panel=panels.STORE)
CONFIG = typer.Option(None, "--config", "-c", help=CONFIG_HELP, rich_help_panel=panels.STORE)
AS_JSON = typer.Option(False, "--json", help="Print JSON.", rich_help_panel=panels.OUTPUT)

Command = Callable[..., None]


def option_group(target: str, parse: Callable[..., Any], **options: tuple[Any, Any]) -> Callable[[Command], Command]:
    """A decorator: the command's parameter ``target`` (keyword-only, last) stands, for typer,
    as ``options`` (name: (type, typer.Option)); the command gets ``parse(**their values)``."""

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command)
        if target not in signature.parameters:
            raise TypeError(f"{command.__name__} has no parameter {target}")
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name != target:
                params.append(param)
                continue
            for name, (hint, option) in options.items():
                params.append(inspect.Parameter(name, param.kind, default=option, annotation=hint))

        @functools.wraps(command)
        def parsed(**values: Any) -> None:
            values[target] = parse(**{name: values.pop(name) for name in options})
            command(**values)

        parsed.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        parsed.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        return parsed

    return decorate


@dataclass
class StoreChoice:
    """The store a command reads (``run``: also writes): ``--store``, then the
    ``--influx-*`` flags over ``WATTLINE_COLLECTOR_*`` over the ``[collector]`` table of
    ``--config``, as for the collector."""

    store: str | None
    config: Path | None
    influx: dict[str, Any] = field(default_factory=dict)

    def settings(self) -> CollectorSettings:
        from wattline.reports.summaries.store import default_store_url

        flags = {"store": self.store or default_store_url(), **self.influx}
        settings = build(CollectorSettings, "collector", read_config(self.config), flags=flags)
        if settings.influx_api not in {"auto", "v1", "v2"}:
            raise ConfigError(f"option --influx-api: {settings.influx_api[:100]!r} is not auto, v1 or v2")
        check_tenant(settings.tenant, "--tenant", settings.store)
        return settings

    def open(self) -> Store:
        """The store, for writing (created when it is a new SQLite file)."""
        from wattline.collector.daemon import store_from_settings

        return store_from_settings(self.settings())

    def reader(self) -> OpenReader:
        """The store, read-only, for reports (:func:`reading.open_reader`)."""
        from wattline.reports.summaries import reading

        return reading.open_reader(self.settings())

    def job_store(self) -> JobStore:
        """Where a job run here writes its events and reads its report."""
        from wattline.jobs.wrappers.job_command import JobStore

        return JobStore(self.open, self.reader, named=self.store is not None)


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout."""
    typer.echo(json.dumps(data, indent=2))


def store_choice(store: str | None, config: Path | None, **influx: Any) -> StoreChoice:
    """A :class:`StoreChoice` from the command's options."""
    return StoreChoice(store, config, influx)


def report_settings(
    price: float | None, carbon_intensity: str | None, pue: float, idle: str, share_rule: str
) -> ReportSettings:
    """The report's settings; ``carbon_intensity`` is a number or a CSV file (:mod:`.carbon`)."""
    if idle not in {"none", "subtract"}:
        raise ConfigError(f"option --idle: {idle!r} is not none or subtract")
    check_share_rule(share_rule, "--share-rule")
    if pue < 1.0:
        raise ConfigError(f"option --pue: {pue} is below 1")
    if price is not None and price < 0:
        raise ConfigError(f"option --price: {price} is negative")
    carbon = parse_intensity(carbon_intensity)
    if isinstance(carbon, IntensitySeries):
        return ReportSettings(price, None, pue, idle, share_rule=share_rule, carbon_series=carbon)
    return ReportSettings(price, carbon, pue, idle, share_rule=share_rule)


#: ``--store``, ``--config`` and ``--influx-*``: the command gets ``choice: StoreChoice``.
store_options = option_group(
    "choice",
    store_choice,
    store=(str | None, STORE),
    config=(Path | None, CONFIG),
    influx_api=(str | None, INFLUX_API),
    influx_database=(str | None, INFLUX_DATABASE),
    influx_org=(str | None, INFLUX_ORG),
    influx_bucket=(str | None, INFLUX_BUCKET),
    influx_token_file=(Path | None, INFLUX_TOKEN_FILE),
    tenant=(str | None, TENANT),
)

#: ``--price``, ``--carbon-intensity``, ``--pue``, ``--idle``, ``--share-rule``: the command
#: gets ``rsettings: ReportSettings``.
report_options = option_group(
    "rsettings",
    report_settings,
    price=(float | None, PRICE),
    carbon_intensity=(str | None, CARBON),
    pue=(float, PUE),
    idle=(str, IDLE),
    share_rule=(str, SHARE),
)
