"""Jobs whose events a store partly lost (issue #43), for the tests that read them back:
samples at a known power and one process's events as a job's wrapper sends them.

Truth: RAPL counters advanced at :data:`POWER_W` over the whole time, one process's events
built by :class:`EventBuilder` as a job's wrapper builds them; a store that restarted empty
:data:`RESTART_S` after the job opened took only what came after (:func:`stored_after`).
"""

from __future__ import annotations

from cpu_events import cpu_periods
from servers import T0

from wattline import wire
from wattline.jobs.events import EventBuilder, JobSpec

S = 10**9
POWER_W = {"cpu_package": 40.0, "dram": 5.0}
RESTART_S = 5.2  #: the store took nothing stamped before this (after the open)
EVIDENCE_S = 5  #: the first stored CPU-time period reaches back to here
LENGTH_S = 60
UNITS_EVERY_S, UNITS_EACH = 0.5, 2.0


def samples(host: str, t0: int, seconds: range) -> wire.pb.Batch:
    """1 s RAPL samples of ``host`` at :data:`POWER_W` over ``seconds`` (relative to ``t0``)."""
    batch = wire.Batch(stream_id=f"agent-{host}", seq=1)
    batch.host.host_id = host
    for component, watts in POWER_W.items():
        for i in seconds:
            batch.samples.add(
                source="rapl",
                component=component,
                device="package-0" if component == "cpu_package" else "package-0/dram",
                start_ns=t0 + i * S,
                end_ns=t0 + (i + 1) * S,
                energy_j=watts,
                power_w=watts,
                cumulative_j=watts * (i + 1 - seconds.start),
                quality=wire.QUALITY_COUNTER,
                healthy=True,
            )
    return batch


def job_events(job_id: str, t0: int = T0, length_s: int = LENGTH_S) -> list[wire.pb.JobEvent]:
    """Everything the job's process sent, in order: open, units, CPU time, heartbeats, close."""
    b = EventBuilder(JobSpec(job_id, "lost-open", "inference", "documents"))
    events = [b.open(t0)]
    ticks = [t0 + round(k * UNITS_EVERY_S * S) for k in range(1, round(length_s / UNITS_EVERY_S) + 1)]
    timed = [(t, "units") for t in ticks] + [(t0 + k * 30 * S, "beat") for k in range(1, length_s // 30 + 1)]
    use = {e.time_ns: e for e in cpu_periods(b, t0, t0 + length_s * S)}
    timed += [(t, "use") for t in use]
    for t, what in sorted(timed):
        if what == "units":
            events.append(b.units(UNITS_EACH, t))
        elif what == "beat":
            events.append(b.heartbeat(t))
        else:
            events.append(use[t])
    events.append(b.close(0, t0 + length_s * S))
    return events


def stored_after(events: list[wire.pb.JobEvent], restart_ns: int) -> list[wire.pb.JobEvent]:
    return [e for e in events if e.time_ns >= restart_ns]
