"""wattline: energy telemetry for machine-learning fleets.

Floors (imports point down only; docs/architecture.md): this package's own modules
(``wire``, ``config``, ``units``, ...) import nothing else of the project; ``stores`` and
``agent`` build on them, ``collector`` on ``stores``; ``accounting``, ``jobs``, ``reports``,
``sweep`` and ``reference`` above; ``cli`` on top.

``from wattline import Job, job_window`` is the Job API (:mod:`wattline.jobs.wrappers.job`).
It is imported on first use: the agent and the collector import ``wattline.wire`` and must
not load the Job API with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wattline.jobs.wrappers.job import Job, job_window

__version__ = "0.1.0"
__all__ = ["Job", "__version__", "job_window"]


def __getattr__(name: str) -> Any:
    if name in ("Job", "job_window"):
        from wattline.jobs.wrappers import job

        return getattr(job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
