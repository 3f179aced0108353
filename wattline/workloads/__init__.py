"""Workload wrappers, saturation, attribution and reports (floor 3).

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
