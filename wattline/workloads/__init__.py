"""Deprecated: the Job API moved to ``from wattline import Job, job_window``; the rest of
this package moved to ``wattline.accounting``, ``wattline.jobs``, ``wattline.reports``,
``wattline.sweep`` and ``wattline.reference``. Kept so that old imports of the Job API
still work, with a DeprecationWarning."""

from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("Job", "job_window"):
        warnings.warn(
            f"wattline.workloads.{name} moved: use `from wattline import {name}`", DeprecationWarning, stacklevel=2
        )
        import wattline

        return getattr(wattline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
