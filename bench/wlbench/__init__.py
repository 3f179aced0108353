"""wattline's benchmarks (run them with ``bench/run``; ``python -m wlbench --help``).

The repository's tests/ folder goes on ``sys.path`` here, before any part is imported: the
benchmarks reuse its fixture builders (sysfs_trees, pipeline, the NVML stand-in).
"""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parents[2] / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
