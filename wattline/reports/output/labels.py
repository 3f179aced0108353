"""How figures are labelled in text: the ESTIMATE tag of figures partly from a model, and
"no samples" where none was stored, and what a side's figures are over."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wattline.jobs.jobs_view import utc_iso
from wattline.reports.output import quantities as q

if TYPE_CHECKING:
    from wattline.reports.model import Report

#: The text of a figure derived from energy where no sample was stored at all (not "0 J").
NO_SAMPLES = "no samples"


def estimate_tag(fraction: float) -> str:
    """The label of figures from energy of which ``fraction`` is a model estimate: "ESTIMATE"
    (all of it), "partly ESTIMATE (N % model)", or "" (none)."""
    if fraction <= 0:
        return ""
    if fraction >= 1 - 1e-9:
        return "ESTIMATE"
    return f"partly ESTIMATE ({q.fraction(fraction)} model)"


def tagged(text: str, fraction: float) -> str:
    tag = estimate_tag(fraction)
    return f"{text} {tag}" if tag and text != q.NA else text


def span_note(report: Report, tag: str) -> str | None:
    """What a side's figures are over when not its saturated window: the window asked, or the
    whole run of a job that never saturated; None when they are its saturated window."""
    if report.settings.window is not None:
        return f"{tag}'s figures are over {utc_iso(report.job.start_ns)} to {utc_iso(report.end_ns)} (the window asked)"
    if not report.saturated:
        return f"{tag} never saturated: its figures are whole-run figures"
    return None
