"""A workload whose power steps up as its first act and down as its last.

``python step_workload.py SCHEDULE ZONE WATTS SECONDS``: appends ``ZONE WATTS now`` to the
:class:`sysfs_trees.PowerAdvancer` schedule, works (sleeps) SECONDS, appends ``ZONE 0 now``
and exits (after a moment for the advancer to write the last value: the energy is the
schedule's integral whenever it is written). The truth of its energy is WATTS x the time
between its two lines.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from sysfs_trees import step_power

if __name__ == "__main__":
    schedule, zone, watts, seconds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    step_power(schedule, zone, watts)
    time.sleep(seconds)
    step_power(schedule, zone, 0.0)
    time.sleep(0.05)
