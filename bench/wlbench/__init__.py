"""wattline's benchmarks (run them with ``bench/run``; ``python -m wlbench --help``).

The repository's tests/helpers/ and tests/ folders go on ``sys.path`` here, before any part is
imported: the benchmarks reuse the tests' fixture builders (sysfs_trees, pipeline) and the NVML
stand-in (tests/nvml_stub).
"""

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[2] / "tests"
for _path in (str(_TESTS), str(_TESTS / "helpers")):
    if _path not in sys.path:
        sys.path.insert(0, _path)
