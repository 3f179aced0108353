"""Figures as people read them: SI prefixes and 4 significant digits, so a nonzero figure
never prints as zero and a large one never as a wall of digits.

Each kind of figure has a *shown* value (what the text says, as a number) and its text;
percent changes are computed from the shown values (:func:`percent_shown`), so a table
never says "0.04 vs 0.01 USD, -68 %".

* energy ``si(j, "J")``: 800 µJ, 1.739 MJ; power ``si(w, "W")``;
* ``kwh(x)``: kWh given, shown in Wh with a prefix (226.3 µWh, 1.5 kWh, 2.3 MWh);
* ``co2(g)``: gCO2, kgCO2, tCO2 (mgCO2 below a gram);
* ``usd(x)``: to the cent from 1 USD up, else 4 significant digits (0.004 USD);
* ``count(x)``: whole numbers with thousands separators, else 4 significant digits;
  ``rate(x, unit)`` the same below a million, else "17.94 million tokens/h";
* ``duration(s)``: 12.35 s, 2 min 05 s, 3 h 12 min;
* ``fraction(f)``: 42 %, and "<1 %" / ">99 %" for a part that would round to none or all;
* ``plus_minus(rel)``: a relative bound, 2 significant digits: "± 2.3 %", "± 0.0017 %".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

DIGITS = 4
#: (scale, prefix) from the largest down.
SI_PREFIXES: tuple[tuple[float, str], ...] = (
    (1e12, "T"),
    (1e9, "G"),
    (1e6, "M"),
    (1e3, "k"),
    (1.0, ""),
    (1e-3, "m"),
    (1e-6, "µ"),
    (1e-9, "n"),
    (1e-12, "p"),
)
NA = "n/a"


def round_sig(x: float, digits: int = DIGITS) -> float:
    """``x`` rounded to ``digits`` significant digits (0, inf and nan unchanged)."""
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits - 1}e}")


def _fixed(x: float, digits: int = DIGITS) -> str:
    """``x`` (already rounded) in plain notation with at most ``digits`` significant digits,
    trailing zeros dropped, thousands separators on the integer part."""
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def si(x: float | None, unit: str, prefixes: Sequence[tuple[float, str]] = SI_PREFIXES) -> str:
    """``x`` in ``unit`` with the prefix that leaves 1 to 999.9 before it: 1738946 J -> "1.739 MJ"."""
    if x is None:
        return NA
    shown = round_sig(x)
    if shown == 0 or not math.isfinite(shown):
        return f"{shown:g} {unit}"
    scale, prefix = next(((s, p) for s, p in prefixes if abs(shown) >= s * 0.9999999), prefixes[-1])
    return f"{_fixed(round_sig(shown / scale))} {prefix}{unit}"


def kwh(x: float | None) -> str:
    """kWh given, shown in Wh with a prefix: 2.263e-07 kWh -> "226.3 µWh"."""
    return si(None if x is None else x * 1000.0, "Wh")


def co2(grams: float | None) -> str:
    """gCO2 given: "12.35 gCO2", "1.2 kgCO2", "3.4 tCO2", "500 mgCO2"."""
    if grams is not None and abs(round_sig(grams)) >= 1e6:
        return si(grams / 1e6, "tCO2", SI_PREFIXES[:5])
    return si(grams, "gCO2", SI_PREFIXES[3:])


def shown_usd(x: float) -> float:
    """The amount :func:`usd` shows."""
    cents = float(f"{x:.2f}")
    return cents if abs(cents) >= 1 else round_sig(x)


def usd(x: float | None) -> str:
    """To the cent from 1 USD up ("1,234.57 USD"), else 4 significant digits ("0.004 USD")."""
    if x is None:
        return NA
    shown = shown_usd(x)
    return f"{shown:,.2f} USD" if abs(shown) >= 1 else f"{_fixed(shown)} USD"


def shown_count(x: float) -> float:
    """The number :func:`count` shows."""
    return float(f"{x:.0f}") if abs(x) >= 1000 or x == int(x) else round_sig(x)


def count(x: float | None, unit: str = "") -> str:
    """Whole numbers with thousands separators ("1,738,946"), else 4 significant digits ("0.4")."""
    if x is None:
        return NA
    shown = shown_count(x)
    text = f"{shown:,.0f}" if abs(shown) >= 1000 or shown == int(shown) else _fixed(shown)
    return f"{text} {unit}" if unit else text


#: Word prefixes for large rates of work units (units are not SI: "17.94 million tokens/h").
LARGE = ((1e12, "trillion"), (1e9, "billion"), (1e6, "million"))


def shown_rate(x: float) -> float:
    """The number :func:`rate` shows."""
    return round_sig(x) if abs(round_sig(x)) >= 1e6 else shown_count(x)


def rate(x: float | None, unit: str) -> str:
    """A rate of work units: :func:`count` below a million, else 4 significant digits and a
    word ("17.94 million documents/h")."""
    if x is None:
        return NA
    shown = shown_rate(x)
    for scale, word in LARGE:
        if abs(shown) >= scale:
            return f"{_fixed(round_sig(shown / scale))} {word} {unit}"
    return count(x, unit)


def duration(seconds: float | None) -> str:
    """Seconds as read: "12.35 s" (ms below a second), "2 min 05 s", "3 h 12 min"."""
    if seconds is None:
        return NA
    if seconds < 59.5:
        return si(seconds, "s", SI_PREFIXES[4:])
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60:,} h {minutes % 60:02d} min"


def fraction(fraction: float) -> str:
    """A fraction (0..1) as a percent that never rounds a part to none or to all: "<1 %", ">99 %"."""
    if 0 < fraction < 0.005:
        return "<1 %"
    if 0.995 <= fraction < 1:
        return ">99 %"
    return f"{fraction * 100:.0f} %"


def shown_si(x: float) -> float:
    """The value :func:`si`, :func:`kwh` and :func:`co2` show (in the unit given)."""
    return round_sig(x)


def percent_shown(a: float | None, b: float | None) -> float | None:
    """Percent change of ``b`` relative to ``a`` (both shown values); None when undefined."""
    if a is None or b is None or a == 0:
        return None
    return (b / a - 1.0) * 100.0


def plus_minus(rel: float | None, unit: str = "%") -> str:
    """A relative half-width (0.023) as "± 2.3 %" (2 significant digits; ``unit`` "pp" for
    percentage points); "± n/a" when unknown."""
    if rel is None or not math.isfinite(rel):
        return f"± {NA}"
    return f"± {_fixed(round_sig(rel * 100.0, 2), 2)} {unit}"
