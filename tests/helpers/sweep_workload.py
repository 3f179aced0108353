"""A workload whose energy per unit is known by construction, for ``wattline sweep``.

``python sweep_workload.py SCHEDULE ZONE WATTS RATE SECONDS WARMUP [TAIL]``: raises ZONE's
power to WATTS (a :class:`sysfs_trees.PowerAdvancer` schedule line) as its first act and
counts RATE units a second, in tenths of a second, each count stamped with its instant
(through ``$WATTLINE_EVENTS``); after WARMUP seconds it marks the job saturated, counts on
for SECONDS, lowers the power to 0 and counts the units of the moment between its last
tick and that step (RATE x that moment). Power and rate are the same on both sides of the
saturation point, so no sample straddling it hides a step; the measured window's energy
per unit is WATTS / RATE exactly (WATTS x the time from the saturation point to the step
down, over RATE x that time). Each tick also reports a latency of 1 / RATE seconds.

It exits TAIL seconds after the step down (default 0.05; the job closes then). A host
agent samples on its own clock: the interval holding the step down must end before the
close, or the report spreads that interval's energy evenly over it and leaves out part of
what came before the step (-1.3 % seen with 0.05 s and 0.25 s samples): with an agent,
TAIL is two sampling intervals and a margin. The throughput is then RATE x SECONDS / (SECONDS
+ TAIL): the tail is in the window, at 0 W.
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
    tail = float(sys.argv[7]) if len(sys.argv) > 7 else 0.05
    events = open(os.environ["WATTLINE_EVENTS"], "a")  # noqa: SIM115
    up = step_power(schedule, zone, watts) / 1e9
    warm, ticks = round(warmup / TICK_S), round((warmup + seconds) / TICK_S)
    for k in range(1, ticks + 1):
        at = up + k * TICK_S
        time.sleep(max(0.0, at - time.time()))
        events.write(f"units {rate * TICK_S!r} {at!r}\n")
        events.write(f"latency {1 / rate!r} {at!r}\n")  # as if it served one unit at a time
        if k == warm:
            events.write(f"phase saturated {at!r}\n")
        events.flush()
    down = step_power(schedule, zone, 0.0) / 1e9
    # the step comes a little after the last tick (waking, writing): its units too, or each
    # millisecond late would add 0.07 % to the energy per unit
    events.write(f"units {rate * (down - at)!r} {down!r}\n")
    events.close()
    time.sleep(tail)
