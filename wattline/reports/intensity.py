"""Grid carbon intensity over time: ``--carbon-intensity`` as a number (gCO2/kWh, constant)
or a CSV file as grid operators and carbon-data services export it: a header with ``time``
and ``gco2_per_kwh`` (other columns ignored), one row per period; ``time`` is ISO 8601 (no
offset: UTC) or Unix seconds. Each row's value holds from its time until the next row's; the
last row's holds on. Applied to a report by :mod:`.carbon`."""

from __future__ import annotations

import bisect
import csv
import datetime as dt
import itertools
import math
from dataclasses import dataclass
from pathlib import Path

from wattline.config import ConfigError


@dataclass(frozen=True)
class IntensitySeries:
    """gCO2/kWh from each time on (ns since the epoch, increasing)."""

    source: str  #: the file it came from, for the report's note
    times_ns: tuple[int, ...]
    values: tuple[float, ...]

    def at(self, t_ns: int) -> float:
        """The value holding at ``t_ns`` (the first one before the first row)."""
        return self.values[max(bisect.bisect_right(self.times_ns, t_ns) - 1, 0)]


def parse_intensity(text: str | None, option: str = "--carbon-intensity") -> float | IntensitySeries | None:
    """A number (gCO2/kWh) or the series in the CSV file ``text`` names; ConfigError (one
    line) for a negative number, a missing file or a bad row."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return read_series(Path(text), option)
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"option {option}: {text[:100]!r} is not a non-negative number of gCO2/kWh")
    return value


def read_series(path: Path, option: str = "--carbon-intensity") -> IntensitySeries:
    """Read a ``time,gco2_per_kwh`` CSV file (see the module doc)."""
    where = f"option {option}: {str(path)[:100]!r}"
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f, skipinitialspace=True)
            rows = list(reader)
            header = [h.strip() for h in reader.fieldnames or []]
    except OSError as exc:
        raise ConfigError(f"{where}: not a number, and cannot read it as a CSV file: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{where}: not a CSV file ({exc})") from None
    if not {"time", "gco2_per_kwh"} <= set(header):
        raise ConfigError(f"{where}: needs a header with time and gco2_per_kwh (has {', '.join(header)[:100]})")
    points: list[tuple[int, float]] = []
    for line, row in enumerate(rows, start=2):
        t, v = (row.get("time") or "").strip(), (row.get("gco2_per_kwh") or "").strip()
        try:
            value = float(v)
            if not math.isfinite(value) or value < 0:
                raise ValueError
        except ValueError:
            raise ConfigError(f"{where} line {line}: gco2_per_kwh {v[:100]!r} is not a non-negative number") from None
        points.append((_time_ns(t, f"{where} line {line}"), value))
    if not points:
        raise ConfigError(f"{where}: no rows")
    points.sort()
    if any(a[0] == b[0] for a, b in itertools.pairwise(points)):
        raise ConfigError(f"{where}: two rows for one time")
    return IntensitySeries(str(path), tuple(t for t, _ in points), tuple(v for _, v in points))


def _time_ns(text: str, where: str) -> int:
    try:
        return round(float(text) * 1e9)
    except ValueError:
        pass
    try:
        stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{where}: time {text[:100]!r} is not ISO 8601 or Unix seconds") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return round(stamp.timestamp()) * 10**9 + stamp.microsecond * 1000
