"""A sweep's grid: ``--param NAME=V1,V2`` parsed, the points (every combination), the order
of the runs and a point's command.

The order interleaves the points so that drift over the sweep (a warming room, a throttling
chip) favours none: every round runs each point once, odd rounds in the reverse order of
even ones, so a drift linear in time adds the same to every point over each pair of rounds.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from wattline.config import ConfigError

#: A parameter name: it becomes the label ``param.<name>`` and the placeholder ``{name}``.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class Param:
    """One swept parameter and its values, in the order given."""

    name: str
    values: tuple[str, ...]


#: One point of the grid: (name, value) per parameter, in the parameters' order.
Point = tuple[tuple[str, str], ...]


def parse_params(items: Sequence[str]) -> list[Param]:
    """``["batch=1,8,32", ...]`` into parameters; a malformed one is a ConfigError (one line)."""
    params: list[Param] = []
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not _NAME.fullmatch(name):
            raise ConfigError(f"option --param: expected NAME=V1,V2,... (NAME a word), got {item[:100]!r}")
        values = tuple(v.strip() for v in text.split(","))
        if not all(values):
            raise ConfigError(f"option --param {name}: an empty value in {text[:100]!r}")
        if len(set(values)) != len(values):
            raise ConfigError(f"option --param {name}: a value given twice in {text[:100]!r}")
        if any(p.name == name for p in params):
            raise ConfigError(f"option --param: {name} given twice")
        params.append(Param(name, values))
    if not params:
        raise ConfigError("wattline sweep: give at least one --param NAME=V1,V2,...")
    return params


def points(params: Sequence[Param]) -> list[Point]:
    """Every combination of the parameters' values, the last parameter varying fastest."""
    out: list[Point] = [()]
    for p in params:
        out = [(*point, (p.name, v)) for point in out for v in p.values]
    return out


def schedule(grid: Sequence[Point], repeat: int) -> Iterator[tuple[Point, int]]:
    """(point, run index) for every run: round r runs every point once, reversed when r is odd."""
    for r in range(repeat):
        for point in grid if r % 2 == 0 else reversed(grid):
            yield point, r


def placeholders(command: Sequence[str]) -> set[str]:
    """The ``{name}`` fields in ``command`` (``{{`` is a literal brace)."""
    names: set[str] = set()
    for arg in command:
        try:
            names |= {f for _, f, _, _ in string.Formatter().parse(arg) if f is not None}
        except ValueError as exc:
            raise ConfigError(f"command argument {arg[:100]!r}: {exc} (write {{{{ for a literal brace)") from None
    return names


def check_command(command: Sequence[str], params: Sequence[Param], applied: set[str]) -> None:
    """ConfigError unless every placeholder names a parameter and every parameter reaches the
    command (as a placeholder) or is one wattline applies itself (``applied``)."""
    names = {p.name for p in params}
    fields = placeholders(command)
    unknown = sorted(fields - names)
    if unknown:
        raise ConfigError(f"the command uses {{{unknown[0]}}}, which no --param names")
    unused = [p.name for p in params if p.name not in fields and p.name not in applied]
    if unused:
        raise ConfigError(
            f"--param {unused[0]}: the command has no {{{unused[0]}}} and wattline does not apply it "
            f"(it applies {', '.join(sorted(applied))})"
        )


def point_command(command: Sequence[str], point: Point) -> list[str]:
    """The command of ``point``: each ``{name}`` replaced by its value."""
    values = dict(point)
    return [arg.format_map(values) for arg in command]


def point_text(point: Point) -> str:
    """``batch=8 threads=2``."""
    return " ".join(f"{k}={v}" for k, v in point)


def point_labels(point: Point) -> dict[str, str]:
    """The job labels of a point: ``param.<name>``."""
    return {f"param.{k}": v for k, v in point}
