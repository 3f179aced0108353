"""``python -m wattline.agent``: the agent's lean entry point, for hosts where memory counts.

It runs the same agent (:func:`~wattline.agent.daemon.run_agent`) as ``wattline agent``, and
like it loads no command-line library (typer, click, rich) nor the job and report commands;
it also takes every ``[agent]`` option as a flag. Settings come, as everywhere, from ``--config FILE``, then
``WATTLINE_AGENT_*`` / ``WATTLINE_SOURCES_*`` environment variables, then flags: one
``--OPTION VALUE`` per ``[agent]`` option (``--sysfs-root /``, ``--interval 0.1``; lists and
labels comma-separated: ``--sources rapl,nic``, ``--labels cluster=a,rack=3``). The spellings of
``wattline agent`` work too, so a unit or manifest can switch entry points unchanged: repeated
``--source``, ``--collector`` and ``--label``/``-l``, ``-i`` for ``--interval``, a bare ``--tls``.

An argv of only those options, each with its value, is read without :mod:`argparse`
(building its parser raises the agent's peak memory, for a parse a plain loop does as
well); anything else (``--help``, an unknown or abbreviated option, a missing value, a
value that starts with ``-``) goes to argparse, which prints the help or the usage error.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from wattline.agent.grpc_io import import_grpc

import_grpc()  # first: gRPC reads its I/O settings when imported (wattline/agent/grpc_io.py)

from wattline.agent.daemon import run_agent  # noqa: E402
from wattline.agent.settings import AgentSettings  # noqa: E402
from wattline.config import ConfigError, build, help_of, read_toml  # noqa: E402

if TYPE_CHECKING:
    import argparse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace | SimpleNamespace:
    """The options of ``argv`` (default: the process's): one attribute per ``[agent]`` option
    (a string, None when not given), ``config`` and ``log_level``."""
    argv = sys.argv[1:] if argv is None else argv
    plain = _plain_args(argv)
    return plain if plain is not None else _argparse_args(argv)


def _plain_args(argv: list[str]) -> SimpleNamespace | None:
    """:func:`parse_args` of an argv of ``--OPTION VALUE`` / ``--OPTION=VALUE`` pairs and bare
    ``--tls``, as argparse reads them; None for anything else."""
    single = {"--config": "config", "-c": "config", "--log-level": "log_level", "-i": "interval"}
    single.update({"--" + f.name.replace("_", "-"): f.name for f in dataclasses.fields(AgentSettings)})
    repeated = {name: dest for flag, short, dest in _REPEATED for name in (flag, *short)}
    values: dict[str, str | None] = dict.fromkeys(single.values())
    values["log_level"] = "info"
    more: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=") if argv[i].startswith("--") else (argv[i], "", "")
        following = argv[i + 1] if i + 1 < len(argv) else None
        if name == "--tls" and not eq and (following is None or following.startswith("-")):
            values["tls"], i = "true", i + 1  # bare --tls
            continue
        if name not in single and name not in repeated:
            return None
        if not eq:
            if following is None:
                return None
            value, i = following, i + 1
        if value.startswith("-"):
            return None
        if name in repeated:
            more.setdefault(repeated[name], []).append(value)
        else:
            values[single[name]] = value
        i += 1
    for dest, added in more.items():
        values[dest] = ",".join(filter(None, [values[dest], *added]))
    config = values.pop("config")
    return SimpleNamespace(config=Path(config) if config is not None else None, **values)


def _argparse_args(argv: list[str]) -> argparse.Namespace:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m wattline.agent", description=__doc__.splitlines()[0])
    ap.add_argument("--config", "-c", type=Path, help="TOML config file ([agent], [sources.NAME] tables)")
    ap.add_argument("--log-level", default="info", help="debug, info, warning or error")
    for f in dataclasses.fields(AgentSettings):
        names = ["--" + f.name.replace("_", "-")] + (["-i"] if f.name == "interval" else [])
        if f.name == "tls":  # --tls alone (wattline agent's flag), or --tls VALUE
            ap.add_argument(
                *names, dest=f.name, metavar="VALUE", nargs="?", const="true", help=help_of(AgentSettings, f.name)
            )
            continue
        ap.add_argument(*names, dest=f.name, metavar="VALUE", help=help_of(AgentSettings, f.name))
    for flag, short, dest in _REPEATED:
        ap.add_argument(
            flag, *short, dest="repeated_" + dest, action="append", metavar="VALUE", help="Repeatable: one value each."
        )
    args = ap.parse_args(argv)
    for _flag, _short, dest in _REPEATED:
        more = getattr(args, "repeated_" + dest)
        if more:
            setattr(args, dest, ",".join(filter(None, [getattr(args, dest), *more])))
    return args


#: ``wattline agent``'s repeatable flags -> the option they add to (comma-joined).
_REPEATED: tuple[tuple[str, list[str], str], ...] = (
    ("--source", [], "sources"),
    ("--collector", [], "collectors"),
    ("--label", ["-l"], "labels"),
)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    level = getattr(logging, args.log_level.upper(), None)
    if not isinstance(level, int):
        print(f"wattline: error: --log-level {args.log_level!r} is not debug, info, warning or error", file=sys.stderr)
        return 2
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        doc = read_toml(args.config)
        flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(AgentSettings)}
        run_agent(build(AgentSettings, "agent", doc, flags=flags).validate(), doc)
    except (ConfigError, OSError, ValueError) as exc:
        print(f"wattline: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
