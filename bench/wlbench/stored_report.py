"""Part "stored-report": a service's report over a day from its stored intervals against the
same report from raw samples (issue #44), side by side in one run, on SQLite.

One host sampled at 1 Hz (package 100 W and DRAM 20 W constant, so the truth is power x time)
for a day plus 2 minutes either side (quick: 2 hours), written with the store's own INSERT in
one transaction; a service job (open, one UNITS event a minute, close) through the store; and
its 60 s ``service_interval`` points as the collector's writer stores them (the policy fields,
final, the energy whole), built from the construction and written through ``write_intervals``.
Once with the service alone on its host, once beside another job all day (the equal rule
halves each sample). Then ``build_report`` over the day minus 30 s at each end (``--from/--to``, as ``--since 1d``
is: whole intervals inside, partial edges), stored (``from_stored``) and ``--raw``, alternating
calls: the cold call and the median of ``WARM_CALLS`` more each, their ratio, and both
energies against the truth.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.jobs.events import EventBuilder, JobSpec
from wattline.reports.build import build_report
from wattline.reports.model import ReportSettings
from wattline.reports.stored_intervals import policy_fields, stored_fields
from wattline.reports.window_view import Window
from wattline.reports.windows import ComponentEnergy, WindowEnergy
from wattline.stores.base import IntervalSummary
from wattline.stores.sqlite.store import _INSERT_ENERGY, _INSERT_SERIES, SqliteStore
from wlbench.data import T0_NS
from wlbench.rows import Row, num

NS = 10**9
HOST = "svc-host"
SERIES = (("cpu_package", "package-0", 100.0), ("dram", "package-0/dram", 20.0))
WATTS = sum(w for _, _, w in SERIES)
MARGIN_S, EVERY_S, RATE = 120, 60, 10
WARM_CALLS = 5
EDGE_S = 30  #: the window starts and ends this far inside the job: partial edges


def run(work: Path, quick: bool) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    seconds = 7200 if quick else 86400
    return {"job_s": seconds, "scenarios": {name: scenario(work, seconds, name) for name in SCENARIOS}}


#: The service alone on its host (the raw report reads the counters at the window's edges only),
#: and beside another job all day (the raw report splits every sample between the two).
SCENARIOS = {"alone": 1, "shared with a job": 2}


def scenario(work: Path, seconds: int, name: str) -> dict[str, Any]:
    jobs = SCENARIOS[name]
    open_ns = T0_NS - T0_NS % (EVERY_S * NS)
    store = SqliteStore(work / f"stored-{jobs}.db")
    t = time.monotonic()
    fill(store, open_ns, seconds, jobs)
    load_s = time.monotonic() - t
    settings = ReportSettings(share_rule="equal")
    store.write_intervals(intervals(open_ns, seconds, settings, jobs))
    window = Window(open_ns + EDGE_S * NS, open_ns + (seconds - EDGE_S) * NS)
    ways = {"stored": dataclasses.replace(settings, window=window, from_stored=True)}
    ways["raw"] = dataclasses.replace(settings, window=window)
    timings: dict[str, list[float]] = {w: [] for w in ways}
    energy: dict[str, float] = {}
    for k in range(WARM_CALLS + 1):
        for way in ways if k % 2 == 0 else reversed(list(ways)):
            t = time.monotonic()
            report = build_report(store, "svc", ways[way])
            timings[way].append(time.monotonic() - t)
            energy[way] = report.saturated_window.energy_j
    store.close()
    truth = WATTS / jobs * (window.to_ns - window.from_ns) / NS  # the equal rule: each job its part
    warm = {w: statistics.median(v[1:]) for w, v in timings.items()}
    return {
        "samples": len(SERIES) * (seconds + 2 * MARGIN_S),
        "load_s": load_s,
        "cold_s": {w: v[0] for w, v in timings.items()},
        "warm_s": warm,
        "runs_s": timings,
        "raw_over_stored": warm["raw"] / warm["stored"],
        "energy_error": {w: abs(e - truth) / truth for w, e in energy.items()},
    }


def fill(store: SqliteStore, open_ns: int, seconds: int, jobs: int) -> None:
    """The host's samples from MARGIN_S before the job to MARGIN_S after, the service's events
    and, with ``jobs`` 2, another job's over the same time."""
    t0 = open_ns - MARGIN_S * NS
    rows = [
        (
            *(HOST, "rapl", component, device, "counter", "{}", t0 + k * NS, t0 + (k - 1) * NS),
            *(watts, watts, watts * k, 1.0, None, 1, "", None, f"s-{t0}", "{}"),
        )
        for component, device, watts in SERIES
        for k in range(1, seconds + 2 * MARGIN_S + 1)
    ]
    conn = store._db
    conn.execute("BEGIN")
    conn.executemany(_INSERT_ENERGY, rows)
    conn.executemany(_INSERT_SERIES, sorted({r[:5] for r in rows}))
    conn.execute("COMMIT")
    b = EventBuilder(JobSpec("svc", "svc", "inference", "requests", service=True))
    events = [b.open(open_ns)]
    events += [b.units(RATE * EVERY_S, open_ns + s * NS) for s in range(EVERY_S, seconds + 1, EVERY_S)]
    events.append(b.close(0, open_ns + seconds * NS))
    if jobs == 2:
        other = EventBuilder(JobSpec("batch", "batch", "training", "steps"))
        events += [other.open(open_ns), other.close(0, open_ns + seconds * NS)]
    batch = wire.Batch(stream_id="events", seq=1, sent_ns=open_ns)
    batch.host.host_id = HOST
    batch.job_events.extend(events)
    store.write(batch)


def intervals(open_ns: int, seconds: int, settings: ReportSettings, jobs: int) -> list[IntervalSummary]:
    """The service's 60 s intervals as the writer stores them, from the construction (its part
    of the host's energy: all of it, or half beside another job under the equal rule)."""
    energy = WATTS * EVERY_S / jobs
    comps = {c: ComponentEnergy(c, w * EVERY_S / jobs, 0.0, {"counter": w * EVERY_S / jobs}) for c, _, w in SERIES}
    fields = {
        "seconds": float(EVERY_S),
        "energy_j": energy,
        "energy_bound_j": 0.0,
        "units": float(RATE * EVERY_S),
        "units_bound": 0.0,
        "complete": 1.0,
        "final": 1.0,
        **policy_fields(settings),
        **stored_fields(WindowEnergy(EVERY_S, comps)),
    }
    tags = {"name": "svc", "unit": "requests"}
    return [IntervalSummary("svc", open_ns + s * NS, tags, dict(fields)) for s in range(0, seconds, EVERY_S)]


def rows(r: dict[str, Any]) -> list[Row]:
    out = []
    for name, d in r["scenarios"].items():
        day = f"{r['job_s'] / 3600:g} h service {name}, 1 Hz, SQLite"
        out += [Row("stored-report", f"report over {day}, {w}", num(t, "s")) for w, t in d["warm_s"].items()]
        out.append(Row("stored-report", f"raw / stored, {day}", num(d["raw_over_stored"], "x")))
    return out
