"""The floor for an agent in Python: read the same counter files at the same rate, nothing else.

Usage: ``python -m wlbench.floor TREE RATE``. Opens the fixture host's 24 counter files once
(8 RAPL ``energy_uj``, 4 statistics files of 4 NICs) and, on a fixed grid, reads each with
``os.pread`` on the kept descriptor and parses it: the yardstick of BENCHMARKS.md ("plain
Python, os.pread on kept descriptors"). Runs until SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def main() -> None:
    root, rate = Path(sys.argv[1]), float(sys.argv[2])
    paths = sorted((root / "sys/class/powercap").glob("intel-rapl:*/energy_uj"))
    paths += sorted((root / "sys/class/net").glob("*/statistics/[rt]x_[bp]*"))
    fds = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in paths]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    period = 1.0 / rate
    next_at = time.monotonic()
    total = 0
    print(f"floor: {len(fds)} files at {rate:g} Hz", flush=True)
    while True:
        for fd in fds:
            total += int(os.pread(fd, 32, 0))
        next_at += period
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_at = time.monotonic()


if __name__ == "__main__":
    main()
