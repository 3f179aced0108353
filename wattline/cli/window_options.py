"""``--since``, ``--from`` and ``--to``: the stretch of a job a report is over (a service's last
15 minutes), parsed into a :class:`~wattline.reports.window_view.Window`."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from pathlib import Path

import typer

from wattline.cli import panels
from wattline.config import ConfigError
from wattline.reports.model import Report, ReportSettings
from wattline.reports.window_view import Window
from wattline.units import parse_duration

SINCE = typer.Option(
    None,
    "--since",
    help="Figures over the last DURATION only (15m, 2h): a service's recent window.",
    rich_help_panel=panels.WINDOW,
)
FROM = typer.Option(
    None,
    "--from",
    help="Figures from TIME only (ISO 8601, UTC unless it says; or Unix seconds).",
    rich_help_panel=panels.WINDOW,
)
TO = typer.Option(
    None,
    "--to",
    help="Figures up to TIME only (ISO 8601 or Unix seconds; default: now).",
    rich_help_panel=panels.WINDOW,
)
EVERY = typer.Option(
    None,
    "--every",
    help="Also the figures interval by interval (5m): energy per unit against load, and at saturation.",
    rich_help_panel=panels.WINDOW,
)
RAW = typer.Option(
    False,
    "--raw",
    help="With a window: compute every figure from raw samples, not from a service's stored intervals.",
    rich_help_panel=panels.WINDOW,
)
CURVE = typer.Option(
    None,
    "--curve",
    help="With --every: draw energy per unit against load to FILE.png or FILE.svg.",
    rich_help_panel=panels.OUTPUT,
)


def parse_time(text: str, option: str) -> int:
    """ns since the epoch from ISO 8601 (no offset: UTC) or Unix seconds; ConfigError otherwise."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"option {option}: {text[:60]!r} is not a time (ISO 8601 like 2026-12-06T10:00:00Z, or Unix seconds)"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        return int(when.timestamp() * 1e9)
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"option {option}: {text[:60]!r} is not a time")
    return int(seconds * 1e9)


def parse_every(every: str | None, curve: Path | None) -> float | None:
    """``--every`` in seconds (None: not asked); ConfigError when bad or when ``--curve`` lacks it."""
    if every is None:
        if curve is not None:
            raise ConfigError("option --curve needs --every (the intervals it draws)")
        return None
    seconds = positive_duration(every, "--every")
    if curve is not None:
        from wattline.reports.output.plot import check_path, pyplot

        check_path(curve, "--curve")
        pyplot()  # matplotlib installed, else its install hint now
    return seconds


def positive_duration(text: str, option: str) -> float:
    """Seconds of a duration option that must be longer than 0; ConfigError otherwise."""
    seconds = parse_duration(text, option)
    if seconds <= 0:
        raise ConfigError(f"option {option}: {text!r} must be longer than 0")
    return seconds


def last_window(report: Report, settings: ReportSettings, seconds: float) -> ReportSettings:
    """``settings`` asking for the last ``seconds`` of ``report``'s job (to its end, or now)."""
    end = report.end_ns
    return dataclasses.replace(settings, window=Window(max(report.job.start_ns, end - int(seconds * 1e9)), end))


def parse_window(since: str | None, from_: str | None, to: str | None, now_ns: int) -> Window | None:
    """The window the options ask (None: the whole job); ConfigError (one line) when they conflict."""
    if since is None and from_ is None and to is None:
        return None
    if since is not None and from_ is not None:
        raise ConfigError("options --since and --from: give one of them")
    end = now_ns if to is None else parse_time(to, "--to")
    if since is not None:
        seconds = positive_duration(since, "--since")
        start = end - int(seconds * 1e9)
    else:
        start = 0 if from_ is None else parse_time(from_, "--from")
    if end > now_ns:
        end = now_ns  # nothing is known past now
    try:
        return Window(start, end)
    except ValueError as exc:
        raise ConfigError(f"options --from/--to: {exc}") from None
