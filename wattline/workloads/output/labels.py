"""How figures are labelled in text: the share of energy that is a model estimate and its
ESTIMATE tag, and how a job ended."""

from __future__ import annotations

import signal

from wattline.quality import Quality
from wattline.workloads.jobs.jobs_view import abandoned_text
from wattline.workloads.output import quantities as q
from wattline.workloads.report.build import WindowEnergy

#: The text of a figure derived from energy where no sample was stored at all (not "0 J").
NO_SAMPLES = "no samples"


def estimate_share(*windows: WindowEnergy) -> float:
    """Share of the windows' energy that is a model estimate (0 without energy)."""
    total = sum(w.energy_j for w in windows)
    model = sum(w.by_quality().get(Quality.MODEL, 0.0) for w in windows)
    return model / total if total > 0 else 0.0


def estimate_tag(share: float) -> str:
    """The label of figures from energy of which ``share`` is a model estimate: "ESTIMATE"
    (all of it), "partly ESTIMATE (N % model)", or "" (none)."""
    if share <= 0:
        return ""
    if share >= 1 - 1e-9:
        return "ESTIMATE"
    return f"partly ESTIMATE ({q.share(share)} model)"


def tagged(text: str, share: float) -> str:
    tag = estimate_tag(share)
    return f"{text} {tag}" if tag and text != q.NA else text


#: A scheduler's ``end_state`` (Slurm) or how a pod ended (a pod-job's ``pod_end``) as people
#: read it; another value is shown as it is.
END_STATE_TEXT = {
    "cancelled": "cancelled",
    "timeout": "timed out",
    "node_fail": "node failure",
    "preempted": "preempted",
    "out_of_memory": "out of memory",
    "deadline": "deadline reached",
    "boot_fail": "boot failure",
    "oom_killed": "OOM-killed",
    "shutdown": "node shutdown",
}


def status_text(
    state: str, exit_code: int | None, last_heard_ns: int | None, end_reason: str = "", end_state: str = ""
) -> str:
    """How a job ended, for people: "ok (exit 0)", "failed (exit 143, SIGTERM)", "cancelled
    (exit 143, SIGTERM)" (the scheduler ended it), "evicted (exit 137, SIGKILL)" (how its
    pod ended), "running", "abandoned (no close; last heard
    at T)", "abandoned (wrapper gone: ...; last alive at T)"."""
    if state == "running":
        return "running"
    if state == "abandoned":
        return abandoned_text(end_reason, last_heard_ns or 0)
    verdict = END_STATE_TEXT.get(end_state, end_state) or ("failed" if exit_code else "ok")
    if not exit_code:
        return f"{verdict} (exit 0)"
    number = -exit_code if exit_code < 0 else exit_code - 128
    try:
        name = f", {signal.Signals(number).name}" if number > 0 else ""
    except ValueError:
        name = ""
    return f"{verdict} (exit {exit_code}{name})"
