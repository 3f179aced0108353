"""What the collector refuses: a batch that can never be stored, and single bad points.

A batch without host id, stream id or seq is refused whole (:func:`validate`); a malformed
sample or job event (bad interval, negative or non-finite energy, quality unspecified, a
quality or event kind this version does not know) is dropped alone with its reason
(:func:`drop_invalid_points`), and the rest of the batch is written.
"""

from __future__ import annotations

import math

from wattline import wire


def validate(batch: wire.pb.Batch) -> str:
    """Why ``batch`` as a whole can never be stored, or "" when it is acceptable."""
    if not batch.host.host_id:
        return "host.host_id is empty"
    if not batch.stream_id or batch.seq == 0:
        return "stream_id and seq are required"
    return ""


def sample_problem(s: wire.pb.Sample) -> str:
    """Why one sample can never be stored, or ""."""
    if not (s.source and s.component and s.device):
        return "source, component and device are required"
    if s.end_ns <= 0 or s.start_ns > s.end_ns:
        return f"bad interval {s.start_ns}..{s.end_ns}"
    for name, value in (("energy_j", s.energy_j), ("power_w", s.power_w), ("cumulative_j", s.cumulative_j)):
        if not math.isfinite(value) or value < 0:
            return f"{name} {value} is negative or not finite"
    if s.quality == wire.pb.QUALITY_UNSPECIFIED:
        return "quality unspecified (say how the energy was obtained: counter, integrated or model)"
    if s.quality not in wire.QUALITY_NAMES:
        return f"unknown quality {s.quality} (a newer agent? upgrade the collector)"
    return ""


def event_problem(e: wire.pb.JobEvent) -> str:
    """Why one job event can never be stored, or ""."""
    if not e.job_id or e.time_ns <= 0:
        return "job_id and time_ns are required"
    if e.kind not in wire.pb.JobEvent.Kind.values():
        return f"unknown job event kind {e.kind} (a newer agent? upgrade the collector)"
    return ""


_INF = math.inf
#: Qualities a sample may be stored with: not "unspecified", which no report could present
#: honestly as measured or estimated.
_QUALITIES = frozenset(wire.QUALITY_NAMES) - {wire.pb.QUALITY_UNSPECIFIED}


def _sample_ok(s: wire.pb.Sample) -> bool:
    """:func:`sample_problem` is "" (the fast test run on every sample; NaN fails every comparison)."""
    return bool(
        s.source
        and s.component
        and s.device
        and s.end_ns > 0
        and s.start_ns <= s.end_ns
        and 0 <= s.energy_j < _INF
        and 0 <= s.power_w < _INF
        and 0 <= s.cumulative_j < _INF
        and s.quality in _QUALITIES
    )


def drop_invalid_points(batch: wire.pb.Batch) -> list[str]:
    """Remove the samples and job events that can never be stored; the reasons, one per point."""
    samples = batch.samples
    bad_samples = [] if all(map(_sample_ok, samples)) else [(i, sample_problem(s)) for i, s in enumerate(samples)]
    bad_samples = [(i, p) for i, p in bad_samples if p]
    for i, _problem in reversed(bad_samples):
        del samples[i]
    bad_events = [(i, p) for i, event in enumerate(batch.job_events) if (p := event_problem(event))]
    for i, _problem in reversed(bad_events):
        del batch.job_events[i]
    reasons = [f"sample {i}: {problem}" for i, problem in bad_samples]
    reasons += [f"job event {i}: {problem}" for i, problem in bad_events]
    return reasons
