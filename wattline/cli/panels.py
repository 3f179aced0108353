"""Help panels: the names that group a command's options (and the top-level commands) in
``--help``, their order, and the plain-text help that shows them.

The app's help is plain text (``rich_markup_mode=None``: "[agent]" is a TOML table, not
markup), and typer draws ``rich_help_panel`` only in its rich help; :class:`PanelCommand`
and :class:`PanelGroup` draw the same panels as plain sections. One concern, one panel name,
on every command that has it.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand, TyperGroup

# options
JOB = "The job"
STUDY = "The study"
UNITS = "Units"
ENDPOINT = "A served metrics endpoint"
WORKLOAD = "The workload"
HOST = "Host and sampling"
STORE = "Store and collector"
RECEIVING = "Receiving batches"
DELIVERY = "Delivery and spool"
SUMMARIES = "Summaries"
PROMETHEUS = "Prometheus endpoint"
SECURITY = "TLS and tokens"
REPORT = "Report"
WINDOW = "Window"
OUTPUT = "Output"

#: the order panels are shown in, on every command (a command shows those it has)
OPTION_PANELS = (
    JOB,
    STUDY,
    UNITS,
    ENDPOINT,
    WORKLOAD,
    HOST,
    STORE,
    RECEIVING,
    DELIVERY,
    SUMMARIES,
    PROMETHEUS,
    SECURITY,
    REPORT,
    WINDOW,
    OUTPUT,
)

# top-level commands
MEASURE = "Measure"
READ = "Read the store"
OPERATE = "Operate"
REFERENCE = "Reference workloads"

COMMAND_PANELS = (MEASURE, READ, OPERATE, REFERENCE)

#: the section of what has no panel (-h/--help, and every option of a short command)
DEFAULT = "Options"


def _rank(panel: str | None, order: tuple[str, ...]) -> int:
    """Where ``panel`` goes: the default section last, an unknown panel before it."""
    if panel is None:
        return len(order) + 1
    return order.index(panel) if panel in order else len(order)


def _sections(rows: list[tuple[str | None, tuple[str, str]]], order: tuple[str, ...]) -> list[tuple[str, list[Any]]]:
    """``(panel, help row)`` pairs as ``(title, rows)`` sections in ``order``, rows kept in order."""
    panels = sorted({panel for panel, _ in rows}, key=lambda p: _rank(p, order))
    return [(panel or DEFAULT, [row for p, row in rows if p == panel]) for panel in panels]


def _format_params(command: Any, ctx: Any, formatter: Any) -> None:
    """Arguments, then each option panel, then the options without one."""
    args: list[tuple[str, str]] = []
    opts: list[tuple[str | None, tuple[str, str]]] = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        if param.param_type_name == "argument":
            args.append(record)
        elif param.param_type_name == "option":
            opts.append((getattr(param, "rich_help_panel", None), record))
    if args:
        with formatter.section("Arguments"):
            formatter.write_dl(args)
    for title, rows in _sections(opts, OPTION_PANELS):
        with formatter.section(title):
            formatter.write_dl(rows)


class PanelCommand(TyperCommand):
    """A command whose plain ``--help`` shows its options by panel."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _format_params(self, ctx, formatter)


class PanelGroup(TyperGroup):
    """A group whose plain ``--help`` shows its options and its commands by panel."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _format_params(self, ctx, formatter)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        commands = [(name, self.get_command(ctx, name)) for name in self.list_commands(ctx)]
        shown = [(name, cmd) for name, cmd in commands if cmd is not None and not cmd.hidden]
        if not shown:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in shown)
        rows = [(getattr(cmd, "rich_help_panel", None), (name, cmd.get_short_help_str(limit))) for name, cmd in shown]
        for title, section in _sections(rows, COMMAND_PANELS):
            with formatter.section("Commands" if title == DEFAULT else title):
                formatter.write_dl(section)
