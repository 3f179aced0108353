"""Workload wrappers, saturation, attribution and reports (floor 3), in rooms that import
down only (``tests/test_layers.py``):

- :mod:`.energy`: a window's joules, their bounds, the saturated window, a host's energy
  attributed to its jobs and a shared accelerator split among them;
- :mod:`.jobs`: the events a wrapper writes and a job's view built from them;
- :mod:`.report`: a job's report built from the store, its figures and its JSON;
- :mod:`.output`: tables, HTML, plots and CSV/Parquet for people and files;
- :mod:`.services`: job summaries kept as jobs close, the reading behind report/jobs/compare;
- :mod:`.wrappers`: the Job API, ``wattline run``, sessions, heartbeats, Slurm hooks;
- :mod:`.reference`, :mod:`.sweep` and :mod:`.demo`: workloads and sweeps built on the rest.

``from wattline.workloads import Job, job_window`` is the job API (:mod:`.wrappers.job`), imported
on first use so that the package's other modules do not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wattline.workloads.wrappers.job import Job, job_window

__all__ = ["Job", "job_window"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from wattline.workloads.wrappers import job

        return getattr(job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
