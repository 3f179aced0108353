"""A row of the table, and how its cells are written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Row:
    part: str
    figure: str
    value: str
    yardstick: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None

    def cells(self) -> list[str]:
        met = "" if self.met is None else ("yes" if self.met else "NO")
        return [self.part, self.figure, self.value, self.yardstick, fmt_ratio(self.ratio), self.target, met]

    def as_dict(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "figure": self.figure,
            "value": self.value,
            "yardstick": self.yardstick,
            "ratio": self.ratio,
            "target": self.target,
            "met": self.met,
        }


def fmt_ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}x"


def num(value: float | None, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}g}{(' ' + unit) if unit else ''}"


def at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def at_least(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


def ratio_of(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b
