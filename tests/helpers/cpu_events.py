"""The CPU-time USE events a job's holder sends (``wattline run``, the Job API, the pod and
Slurm watchers: device ``cpu:host``), for synthetic jobs: their host-wide share is then a
truth the test constructs, as it is measured for real ones, not an estimate."""

from __future__ import annotations

import itertools

from wattline import wire
from wattline.jobs.events import EventBuilder

S = 10**9


def cpu_use(
    builder: EventBuilder, start_ns: int, end_ns: int, job_cpus: float = 1.0, host_cpus: float = 1.0
) -> wire.pb.JobEvent:
    """Over ``(start_ns, end_ns]`` the job's processes kept ``job_cpus`` CPUs busy, every
    process ``host_cpus`` (the job's included): as its holder reports it."""
    return builder.make(
        wire.pb.JobEvent.KIND_USE,
        end_ns,
        use_device="cpu:host",
        use_period_ns=end_ns - start_ns,
        job_use=100.0 * job_cpus,
        device_use=100.0 * host_cpus,
        use_metric="cpu-time",
    )


def cpu_periods(
    builder: EventBuilder,
    start_ns: int,
    end_ns: int,
    job_cpus: float = 1.0,
    host_cpus: float = 1.0,
    every_s: float = 5.0,
) -> list[wire.pb.JobEvent]:
    """:func:`cpu_use` events every ``every_s`` from ``start_ns`` to ``end_ns`` (the last one to
    the end); by default the job's processes were the host's only busy ones (its share: all)."""
    step = int(every_s * S)
    edges = [*range(start_ns, end_ns, step), end_ns]
    return [cpu_use(builder, a, b, job_cpus, host_cpus) for a, b in itertools.pairwise(edges) if b > a]
