"""``wattline agent`` without the CLI libraries: the agent's path from the console script.

The command users type starts the agent with no typer, click or rich in memory (about as
lean as ``python -m wattline.agent``): :func:`agent_command` reads ``[--log-level L] agent
OPTIONS`` itself, for exactly the options the typer command declares (a test keeps the two
equal). Anything else (``--help``, an unknown option, a value that does not convert, another
command) returns None and the full CLI takes over, so help and usage errors read as for any
command.

Also here, shared with the typer commands: merging the config file, environment and flags
into :class:`AgentSettings`, the log level, and the warning about unknown ``WATTLINE_*``
variables.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from wattline.agent import registry
from wattline.agent.holders.kube.settings import KubeSettings
from wattline.agent.holders.systemd.settings import SystemdSettings
from wattline.agent.settings import AgentSettings
from wattline.collector.settings import CollectorSettings
from wattline.config import ConfigError, build, check_tables, env_names, parse_pairs, read_toml, unknown_variables
from wattline.jobs.job_env import ENV_EVENTS, ENV_JOB_ID
from wattline.wire import ENV_HEARTBEAT

#: Variables read outside the settings tables: set by ``wattline run`` for its command (job
#: id, events file, heartbeat), the store of ``run``/``report``, log level and tracebacks,
#: secrets (never flags), the Grafana provisioning file, and the test and bench harnesses.
OTHER_VARIABLES = frozenset(
    {
        ENV_JOB_ID,
        ENV_EVENTS,
        ENV_HEARTBEAT,
        "WATTLINE_USE_PERIOD_S",  # jobs.wrappers.usage.ENV_USE_PERIOD (not imported: the agent's path stays lean)
        "WATTLINE_STORE",
        "WATTLINE_LOG_LEVEL",
        "WATTLINE_DEBUG",
        "WATTLINE_TOKEN",
        "WATTLINE_INFLUX_TOKEN",
        "WATTLINE_INFLUX_PASSWORD",
        "WATTLINE_INFLUX_URL",
        "WATTLINE_INFLUX_DATABASE",
        "WATTLINE_INFLUX_USER",
        "WATTLINE_PROMETHEUS_URL",  # the Grafana provisioning file's data source
        "WATTLINE_NVML_SCENARIO",
        "WATTLINE_PYTHON",
    }
)

#: Value conversions of the typer command's option types (click converts with the same calls).
CONVERT: dict[str, Callable[[str], Any]] = {"str": str, "float": float, "int": int, "path": Path, "list": str}

#: ``wattline agent``'s options: flag -> (parameter, kind); "list" repeats, "flag" takes no value.
AGENT_OPTIONS: dict[str, tuple[str, str]] = {
    "--config": ("config", "path"),
    "-c": ("config", "path"),
    "--host-id": ("host_id", "str"),
    "--label": ("labels", "list"),
    "-l": ("labels", "list"),
    "--interval": ("interval", "float"),
    "-i": ("interval", "float"),
    "--sysfs-root": ("sysfs_root", "path"),
    "--source": ("sources", "list"),
    "--collector": ("collectors", "list"),
    "--batch-interval": ("batch_interval", "float"),
    "--prometheus-port": ("prometheus_port", "int"),
    "--prometheus-addr": ("prometheus_addr", "str"),
    "--push-timeout": ("push_timeout", "float"),
    "--failback": ("failback", "float"),
    "--spool-dir": ("spool_dir", "str"),
    "--spool-max-mb": ("spool_max_mb", "float"),
    "--spool-max-age": ("spool_max_age", "float"),
    "--outbox-dir": ("outbox_dir", "str"),
    "--edge-socket": ("edge_socket", "str"),
    "--tls": ("tls", "flag"),
    "--tls-ca": ("tls_ca", "path"),
    "--tls-cert": ("tls_cert", "path"),
    "--tls-key": ("tls_key", "path"),
    "--tls-server-name": ("tls_server_name", "str"),
    "--token-file": ("token_file", "path"),
}


def known_tables() -> set[str]:
    """The tables a config file may hold (dotted)."""
    return {"agent", "collector", "kubernetes", "systemd", "sources", *(f"sources.{name}" for name in registry.SOURCES)}


def read_config(path: Path | None) -> dict[str, Any]:
    """The parsed ``--config`` file; an unknown table is a ConfigError naming the closest one."""
    doc = read_toml(path)
    if path is not None:
        check_tables(doc, known_tables(), path)
    return doc


def environment_warnings(env: Mapping[str, str] | None = None) -> list[str]:
    """One line per ``WATTLINE_*`` variable nothing reads (a warning, not an error: the
    environment is shared with every process of a job and a host, and a stray variable must
    not stop a user's command)."""
    env = os.environ if env is None else env
    known = set(OTHER_VARIABLES) | env_names(AgentSettings, "agent") | env_names(CollectorSettings, "collector")
    known |= env_names(KubeSettings, "kubernetes") | env_names(SystemdSettings, "systemd")
    if all(name in known for name in env if name.startswith("WATTLINE_")):
        return []
    for name in registry.SOURCES:  # imports every source module: only when needed
        known |= env_names(registry.source_class(name)[1], f"sources.{name}")
    return unknown_variables(env, known)


def start_logging(log_level: str) -> None:
    """Log to stderr at ``log_level`` (the root ``--log-level``), then warn of unknown variables."""
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise ConfigError(f"option --log-level: {log_level!r} is not debug, info, warning or error")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for line in environment_warnings():
        print(f"wattline: warning: {line}", file=sys.stderr, flush=True)


def agent_settings(config: Path | None, **flags: Any) -> tuple[AgentSettings, dict[str, Any]]:
    """Merge file, environment and flags into AgentSettings (+ the parsed file)."""
    doc = read_config(config)
    if flags.get("labels"):
        flags["labels"] = parse_pairs(flags["labels"], "--label")
    for key in ("sources", "collectors"):
        if not flags.get(key):
            flags[key] = None
    return build(AgentSettings, "agent", doc, flags=flags).validate(), doc


def run_agent_command(config: Path | None, **flags: Any) -> None:
    """``wattline agent``: settings from ``config``, the environment and ``flags``; run until stopped."""
    from wattline.agent.daemon import run_agent  # the daemon: only when it runs

    settings, doc = agent_settings(config, **flags)
    run_agent(settings, doc)


def parse_agent(argv: list[str]) -> tuple[str | None, dict[str, Any]] | None:
    """(root ``--log-level`` or None, the agent command's parameters) of ``[--log-level L] agent
    OPTIONS``; None for anything else, left to the full CLI."""
    log_level, rest = None, argv
    if rest[:1] == ["--log-level"] and len(rest) > 1:
        log_level, rest = rest[1], rest[2:]
    elif rest[:1] and rest[0].startswith("--log-level="):
        log_level, rest = rest[0].partition("=")[2], rest[1:]
    if rest[:1] != ["agent"]:
        return None
    params: dict[str, Any] = {}
    tokens = iter(rest[1:])
    for token in tokens:
        name, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        if name not in AGENT_OPTIONS:
            return None
        dest, kind = AGENT_OPTIONS[name]
        if kind == "flag":
            if eq:
                return None
            params[dest] = True
            continue
        if not eq:
            value = next(tokens, "")
        if not value or value.startswith("--"):
            return None
        try:
            converted = CONVERT[kind](value)
        except ValueError:
            return None
        if kind == "list":
            params.setdefault(dest, []).append(converted)
        else:
            params[dest] = converted
    return log_level, params


def agent_command(argv: list[str]) -> int | None:
    """Run ``wattline agent`` if ``argv`` is one this module reads (exit status 0 once stopped); else None."""
    parsed = parse_agent(argv)
    if parsed is None:
        return None
    log_level, params = parsed
    start_logging(log_level or os.environ.get("WATTLINE_LOG_LEVEL") or "info")
    run_agent_command(params.pop("config", None), **params)
    return 0
