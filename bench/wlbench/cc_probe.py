"""CodeCarbon's own cost per measurement; runs with bench/.venv's python (not the project's).

Usage: ``cc_probe.py INTERVAL_S WARM_S WINDOW_S``. Prints one JSON line: CPU seconds and
measurements counted over the steady window (after ``WARM_S``), from ``os.times()`` of this
process (every thread). The parent takes the whole-run cost, start-up and children
included, from ``os.wait4``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path


def cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def main() -> None:
    interval, warm, window = (float(a) for a in sys.argv[1:4])
    logging.disable(logging.WARNING)
    from codecarbon import OfflineEmissionsTracker

    tracker = OfflineEmissionsTracker(
        country_iso_code="USA",
        measure_power_secs=interval,
        save_to_file=False,
        log_level="error",
        allow_multiple_runs=True,
        tracking_mode="machine",
    )
    count = 0
    scheduler = tracker._scheduler
    measure = scheduler.function

    def counted(*args: object, **kwargs: object) -> None:
        nonlocal count
        measure(*args, **kwargs)
        count += 1

    scheduler.function = counted
    tracker.start()
    time.sleep(warm)
    c0, n0, t0 = cpu_s(), count, time.monotonic()
    time.sleep(window)
    c1, n1, t1 = cpu_s(), count, time.monotonic()
    tracker.stop()
    print(
        json.dumps(
            {
                "steady_cpu_s": c1 - c0,
                "steady_measurements": n1 - n0,
                "steady_s": t1 - t0,
                "measurements": count,
                "hwm_kib": int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
