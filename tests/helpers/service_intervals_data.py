"""A stored service job with known power and request rate, and the truth of its intervals.

One host, 1 s RAPL counter samples from 2 s before the job to 2 s after it, at
:data:`BUSY_W` before ``base + STEP_S`` and :data:`QUIET_W` after. The job (a service) opens
at ``base + OPEN_S``, counts :data:`BUSY_RATE` requests/s before the step and
:data:`QUIET_RATE` after (each request taking :data:`BUSY_LATENCY_S`, then
:data:`QUIET_LATENCY_S`, in a latency histogram of :data:`BOUNDS`), one UNITS event a second for the second before it (reports spread
an event's units over the time since the one before, so each lies whole in one interval), and closes at ``base + CLOSE_S``. With intervals of :data:`EVERY_S` aligned
to multiples of it (``base`` is one), each interval's truth is power x its seconds and rate x
its seconds, the first interval starting at the open and the last ending at the close.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from wattline import wire
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.stores.base import Store

S = 10**9
UNITS = wire.pb.JobEvent.KIND_UNITS
EVERY_S = 10
#: Two days back, on a 1000 s boundary: the session's Prometheus takes samples up to its
#: out-of-order window (3 days) behind the newest any test wrote, and other tests write "now".
RECENT = (time.time_ns() // (1000 * S) - 2 * 86400 // 1000) * 1000 * S
OPEN_S, STEP_S, CLOSE_S = 3, 20, 48
BUSY_W, QUIET_W = 100.0, 50.0
BUSY_RATE, QUIET_RATE = 10, 4
#: Every request's latency (s) before and after the step, and the server's histogram buckets.
BUSY_LATENCY_S, QUIET_LATENCY_S = 0.3, 0.05
BOUNDS = (0.1, 0.5, math.inf)


def watts(t_s: int) -> float:
    return BUSY_W if t_s < STEP_S else QUIET_W


def rate(t_s: int) -> int:
    return BUSY_RATE if t_s < STEP_S else QUIET_RATE


def latency_s(t_s: int) -> float:
    return BUSY_LATENCY_S if t_s < STEP_S else QUIET_LATENCY_S


@dataclass(frozen=True)
class Truth:
    start_ns: int
    seconds: float
    energy_j: float
    units: float
    load: float  #: throughput over the highest interval throughput up to this one
    latency_s: float  #: every request's in it

    @property
    def j_per_unit(self) -> float:
        return self.energy_j / self.units


def truths(base: int) -> list[Truth]:
    """Every interval of the job written at ``base``, oldest first."""
    out, peak = [], 0.0
    for a in range(OPEN_S - OPEN_S % EVERY_S, CLOSE_S, EVERY_S):
        lo, hi = max(a, OPEN_S), min(a + EVERY_S, CLOSE_S)
        units = sum(rate(t) for t in range(lo, hi))
        peak = max(peak, units / (hi - lo))
        energy = sum(watts(t) for t in range(lo, hi))
        out.append(Truth(base + lo * S, hi - lo, energy, units, units / (hi - lo) / peak, latency_s(lo)))
    return out


def samples(host: str, base: int, from_s: int, to_s: int, seq: int) -> wire.Batch:
    """The host's samples of [from_s, to_s) (its counter counts from the first sample, -2 s)."""
    batch = wire.Batch(stream_id=f"stream-{host}", seq=seq, sent_ns=base)
    batch.host.host_id = host
    cumulative = sum(watts(t) for t in range(-2, from_s))
    for t in range(from_s, to_s):
        cumulative += watts(t)
        batch.samples.add(
            source="rapl", component="cpu_package", device="package-0", quality=wire.QUALITY_COUNTER,
            healthy=True, start_ns=base + t * S, end_ns=base + (t + 1) * S, energy_j=watts(t),
            power_w=watts(t), cumulative_j=cumulative,
        )  # fmt: skip
    return batch


def service_events(job_id: str, base: int) -> list[wire.pb.JobEvent]:
    """The job's events, oldest first: its open, UNITS, close."""
    b = EventBuilder(JobSpec(job_id, f"svc {job_id}", "inference", "requests", service=True))
    out = [b.open(base + OPEN_S * S)]
    # the latency histogram's series, each numbered by a builder of its own, as the holder sends them
    les = [*("+Inf" if le == math.inf else repr(le) for le in BOUNDS), "sum"]
    series = {le: EventBuilder(b.spec) for le in les}
    for t in range(OPEN_S, CLOSE_S):
        at = base + (t + 1) * S
        out.append(b.units(rate(t), at))
        for le, builder in series.items():  # that second's growth: per bucket, and the sum (s)
            grew = (
                rate(t) * latency_s(t) if le == "sum" else rate(t) * (latency_s(t) <= float(le.replace("+Inf", "inf")))
            )
            out.append(builder.make(UNITS, at, units=grew, unit="e2e", unit_labels={"le": le}))
    return [*out, b.close(0, base + CLOSE_S * S)]


def event_batch(host: str, base: int, events: list[wire.pb.JobEvent], seq: int) -> wire.Batch:
    batch = wire.Batch(stream_id=f"events-{host}", seq=seq, sent_ns=base)
    batch.host.host_id = host
    batch.job_events.extend(events)
    return batch


def write_service(store: Store, job_id: str, host: str, base: int, samples_to_s: int = CLOSE_S + 2) -> None:
    """The whole job, closed, with samples up to ``samples_to_s``."""
    assert store.write(samples(host, base, -2, samples_to_s, 1)).rejected == 0
    assert store.write(event_batch(host, base, service_events(job_id, base), 1)).rejected == 0
