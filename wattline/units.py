"""Units and their parsing: durations ("90s", "2m"), nothing else needs a library."""

from __future__ import annotations

import re

from wattline.config import ConfigError

J_PER_KWH = 3.6e6
NS_PER_S = 1_000_000_000

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min|h)?\s*$")
_SCALE = {None: 1.0, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str, option: str) -> float:
    """Seconds from "45", "45s", "1.5m", "2h", "250ms"; ConfigError naming ``option`` otherwise."""
    match = _DURATION.match(text)
    if not match:
        raise ConfigError(f"option {option}: invalid duration {text!r} (e.g. 30s, 2m, 1h)")
    return float(match.group(1)) * _SCALE[match.group(2)]
