"""A workload in phases of known power and known units, for windowed reports: each phase steps a
RAPL zone's power (a :class:`sysfs_trees.PowerAdvancer` schedule) and writes ``units N TIME``
lines every 0.1 s to its events file; the last line of a phase is stamped with the next step's
instant, so a window from one step to the next holds exactly that phase's lines.

    python window_workload.py SCHEDULE ZONE OUT.json WATTS:SECONDS:UNITS_PER_LINE ...

OUT.json: ``{"steps": [[unix_seconds_text, watts], ...], "lines": [[unix_seconds_text, units], ...]}``
(the last step is to 0 W at the end)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from sysfs_trees import step_power

LINE_S = 0.1


def main() -> None:
    schedule, zone, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    phases = [tuple(float(x) for x in arg.split(":")) for arg in sys.argv[4:]]
    events = open(os.environ["WATTLINE_EVENTS"], "a", buffering=1)  # noqa: SIM115
    steps: list[tuple[str, float]] = []
    lines: list[tuple[str, float]] = []
    previous = 0.0

    def write(units: float, at: str) -> None:
        events.write(f"units {units:g} {at}\n")
        lines.append((at, units))

    for watts, seconds, per_line in [*phases, (0.0, 0.0, 0.0)]:
        at = repr(step_power(schedule, zone, watts) / 1e9)
        write(previous, at)  # the phase's last line at the step that ends it (the first: counting starts)
        steps.append((at, watts))
        end = float(at) + seconds
        while time.time() + LINE_S < end:
            time.sleep(LINE_S)
            write(per_line, repr(time.time()))
        time.sleep(max(0.0, end - time.time()))
        previous = per_line
    out.write_text(json.dumps({"steps": steps, "lines": lines}))


if __name__ == "__main__":
    main()
