"""A stored job with known power and units: the truth for plots, CSV and the HTML page.

On the first host, 1 s samples from 5 s before the job to 5 s after it: ``cpu_package`` (RAPL
counter) at :data:`WARM_W` during the warm-up and :data:`BUSY_W` after, ``dram`` (counter)
at :data:`DRAM_W`, ``nic`` (a model estimate) at :data:`NIC_W`, and ``cpu_core`` (a
sub-domain, left out of totals) at 99 W; host k draws (1 + k/2) times that. The job
opens at ``t0``, counts :data:`WARM_RATE` units/s during a :data:`WARMUP_S` warm-up, marks saturation, then
:data:`BUSY_RATE` units/s until it closes :data:`LENGTH_S` after it opened.
"""

from __future__ import annotations

from pathlib import Path

from cpu_events import cpu_periods

from wattline import wire
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.stores.sqlite.store import SqliteStore

S = 10**9
T0 = 1_767_225_600 * S  # 2026-01-01T00:00:00Z
WARMUP_S, LENGTH_S = 10, 60
WARM_W, BUSY_W, DRAM_W, NIC_W = 10.0, 30.0, 5.0, 1.0
WARM_RATE, BUSY_RATE = 2, 20
SERIES = (  # source, component, device, quality
    ("rapl", "cpu_package", "package-0", wire.QUALITY_COUNTER),
    ("rapl", "dram", "package-0/dram", wire.QUALITY_COUNTER),
    ("rapl", "cpu_core", "package-0/core", wire.QUALITY_COUNTER),
    ("nic", "nic", "eth0", wire.QUALITY_MODEL),
)


def power(component: str, t_s: float) -> float:
    """W drawn by ``component`` at ``t_s`` seconds after the job opened."""
    return {
        "cpu_package": WARM_W if t_s < WARMUP_S else BUSY_W,
        "dram": DRAM_W,
        "cpu_core": 99.0,
        "nic": NIC_W,
    }[component]


def add_job(
    store: SqliteStore,
    job_id: str,
    hosts: tuple[str, ...] = ("node-1",),
    t0: int = T0,
    labels: dict[str, str] | None = None,
) -> None:
    """Write the job and its hosts' samples (see the module doc)."""
    for k, host in enumerate(hosts):
        scale = 1 + k / 2  # host k draws (1 + k/2) times the power
        batch = wire.Batch(stream_id=f"{job_id}-{host}", seq=1, sent_ns=t0)
        batch.host.host_id = host
        for source, component, device, quality in SERIES:
            cumulative = 0.0
            for i in range(-5, LENGTH_S + 5):
                joules = power(component, i) * scale
                cumulative += joules
                batch.samples.add(
                    source=source, component=component, device=device, quality=quality, healthy=True,
                    start_ns=t0 + i * S, end_ns=t0 + (i + 1) * S, energy_j=joules, power_w=joules,
                    cumulative_j=cumulative, utilization=0.5,
                )  # fmt: skip
        b = EventBuilder(JobSpec(job_id, f"name {job_id}", "inference", "documents", dict(labels or {})))
        events = [b.open(t0)]
        events += [b.units(WARM_RATE, t0 + (i + 1) * S) for i in range(WARMUP_S)]
        events.append(b.phase("saturated", t0 + WARMUP_S * S))
        events += [b.units(BUSY_RATE, t0 + (i + 1) * S) for i in range(WARMUP_S, LENGTH_S)]
        events += cpu_periods(b, t0, t0 + LENGTH_S * S)  # its processes: the host's only busy ones
        events.append(b.close(0, t0 + LENGTH_S * S))
        batch.job_events.extend(events)
        assert store.write(batch).rejected == 0


def make_store(path: Path, jobs: dict[str, tuple[str, ...]] | None = None) -> str:
    """A SQLite store at ``path`` holding ``jobs`` (id -> hosts), one after the other; its URL."""
    with SqliteStore(path) as store:
        for n, (job_id, hosts) in enumerate((jobs or {"synth": ("node-1",)}).items()):
            add_job(store, job_id, hosts, T0 + n * 1000 * S, {"SLURM_JOB_ID": str(4242 + n)})
    return f"sqlite:///{path}"


def truth(window: str, component: str, hosts: int = 1) -> float:
    """Joules of ``component`` in the warm-up or measured window, over the job's first ``hosts`` hosts."""
    span = range(WARMUP_S) if window == "warmup" else range(WARMUP_S, LENGTH_S)
    return sum(1 + k / 2 for k in range(hosts)) * sum(power(component, t) for t in span)


if __name__ == "__main__":  # python tests/helpers/synthetic_job.py DB: the README's figure's store
    import sys

    print(make_store(Path(sys.argv[1]), {"synth": ("node-1", "node-2")}))
