"""A workload whose energy per unit is known by construction, for ``wattline sweep``.

``python sweep_workload.py SCHEDULE ZONE WATTS RATE SECONDS WARMUP``: raises ZONE's power to
WATTS (a :class:`sysfs_trees.PowerAdvancer` schedule line) as its first act and counts RATE
units a second, in tenths of a second, each count stamped with its instant (through
``$WATTLINE_EVENTS``); after WARMUP seconds it marks the job saturated, counts on for
SECONDS, and lowers the power to 0 as its last act. Power and rate are the same on both
sides of the saturation point, so no sample straddling it hides a step. The measured
window's energy per unit is WATTS / RATE and its throughput RATE (exactly: WATTS x the time
from the saturation point to the step down, which the schedule's last line gives, over
RATE x SECONDS units).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from sysfs_trees import step_power

TICK_S = 0.1

if __name__ == "__main__":
    schedule, zone = Path(sys.argv[1]), sys.argv[2]
    watts, rate, seconds, warmup = (float(a) for a in sys.argv[3:7])
    events = open(os.environ["WATTLINE_EVENTS"], "a")  # noqa: SIM115
    up = step_power(schedule, zone, watts) / 1e9
    warm, ticks = round(warmup / TICK_S), round((warmup + seconds) / TICK_S)
    for k in range(1, ticks + 1):
        at = up + k * TICK_S
        time.sleep(max(0.0, at - time.time()))
        events.write(f"units {rate * TICK_S!r} {at!r}\n")
        if k == warm:
            events.write(f"phase saturated {at!r}\n")
        events.flush()
    step_power(schedule, zone, 0.0)
    events.close()
    time.sleep(0.05)  # a moment for the advancer to write the last value
