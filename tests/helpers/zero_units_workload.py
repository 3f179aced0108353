"""A workload that starts counting with ``add_units(0)`` (issue #42 item 7), for the Job API's tests.

``python zero_units_workload.py STORE MARKS``: a ``Job`` (its own, in STORE; joined, when run
under ``wattline run`` or in a Slurm job) that calls ``add_units(0)`` 1 s in,
``mark_saturated()`` 1 s later and ``add_units(10)`` 1 s after that, and writes to MARKS (JSON)
the clock just before and just after each call: the truth each instant lies within.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from wattline import Job

if __name__ == "__main__":
    with Job("zero", job_id="zero-api", store=sys.argv[1] or None) as job:
        time.sleep(1)
        a = time.time_ns()
        job.add_units(0)
        b = time.time_ns()
        time.sleep(1)
        c = time.time_ns()
        job.mark_saturated()
        d = time.time_ns()
        time.sleep(1)
        e = time.time_ns()
        job.add_units(10)
        f = time.time_ns()
        time.sleep(0.3)
    Path(sys.argv[2]).write_text(json.dumps({"zero": [a, b], "mark": [c, d], "ten": [e, f]}))
