"""What :meth:`wattline.Job.report` returns: the report, with its JSON one call away."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from wattline.reports.model import Report
from wattline.reports.report_json import report_json


class JobReport(Report):
    """A :class:`~wattline.reports.model.Report` that gives its JSON (``to_dict``)."""

    @classmethod
    def of(cls, report: Report) -> JobReport:
        return cls(**{f.name: getattr(report, f.name) for f in fields(report) if f.init})

    def to_dict(self) -> dict[str, Any]:
        """The report JSON (``wattline report --json``; docs/reports.md, "Report JSON")."""
        return report_json(self)
