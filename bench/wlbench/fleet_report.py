"""Part "fleet", reports (issue #30): the report of a 16-host job with a UNITS event a minute,
24 h against 1 h (quick: 1 h against 10 min), on VictoriaMetrics and on InfluxDB 1.x, same
run, same data.

The data is the report part's (:mod:`wlbench.report`): 16 hosts sampled at 1 Hz (package and
DRAM of socket 0 at a constant 100 W and 20 W) from 2 minutes before each job to 1 minute
after; each job's open, a ``saturated`` mark at 5 % of it, its close and a UNITS event of 600
units per host a minute; 40 unrelated 10-minute jobs with their events in the same store.
Synthetic, but every batch goes through each store's own writer (``store.write``: the
collector's encoding and HTTP write path), the same batches to both stores. VictoriaMetrics
is the one the fleet ingest filled; InfluxDB's database is a fresh one of the same server.

Truth: a job's energy is 16 x 120 W x its seconds and its units 16 x 600 x its UNITS events; a
report whose energy or units are off by more than 1e-9 (relative) is marked wrong.
Timed: ``build_report`` in process (cold, then the median of the warm calls, the jobs
alternating: :func:`wlbench.report.timed_reports`), and the whole ``wattline report JOB
--store URL --json`` command (a fresh process: start-up, imports, reads, JSON) ``CLI_RUNS``
times per job, alternating, median, its JSON checked against the truth too; beside it, the
same command's start-up alone (``--help``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.reports.build import build_report
from wattline.stores.influxdb.v1 import InfluxV1Store
from wattline.stores.victoria.store import VictoriaStore
from wlbench import report
from wlbench.agent import wattline_argv
from wlbench.common import Influxd, Victoria, wait_idle
from wlbench.data import T0_NS

NS = 10**9
#: Seconds of samples per batch (one host's two series).
BATCH_S = 1800
CLI_RUNS = 5
#: Relative error beyond which a report is wrong.
EXACT = 1e-9


def run(servers: dict[str, Influxd | Victoria], work: Path, quick: bool) -> dict[str, Any]:
    lengths = {"10min": 600, "1h": 3600} if quick else {"1h": 3600, "24h": 86400}
    shortest, longest = min(lengths, key=lengths.__getitem__), max(lengths, key=lengths.__getitem__)
    starts, t = {}, T0_NS + report.OTHER_JOBS * (report.OTHER_S + 60) * NS
    for label, seconds in lengths.items():
        starts[label] = t
        t += (report.BEFORE_S + seconds + report.AFTER_S) * NS
    stores = {name: open_store(server) for name, server in servers.items()}
    load_s = dict.fromkeys(stores, 0.0)

    def write(batches: Iterable[wire.pb.Batch]) -> None:
        for batch in batches:
            for name, store in stores.items():
                t0 = time.perf_counter()
                result = store.write(batch)
                load_s[name] += time.perf_counter() - t0
                if result.rejected:
                    raise RuntimeError(f"{name} refused {result.rejected} points: {result.reasons[:2]}")

    report._builder.cache_clear()  # the jobs' events numbered afresh, whatever ran before
    write(report.other_jobs())
    for label, seconds in lengths.items():
        write(energy(starts[label], seconds))
        write(report.job_events(f"bench-{label}", starts[label], seconds))
        write(report.job_events(f"bench-{label}", starts[label], seconds, units_only=True))
    result: dict[str, Any] = {
        "hosts": report.HOSTS,
        "lengths_s": lengths,
        "other_jobs": 2 * report.OTHER_JOBS,
        "samples_per_host_and_series": sum(s + report.BEFORE_S + report.AFTER_S for s in lengths.values()),
        "load_s": load_s,
    }
    for server in servers.values():
        if isinstance(server, Victoria):
            server.flush()
        wait_idle(server.proc)
    for name, store in stores.items():
        timed = report.timed_reports(store, lengths)
        d: dict[str, Any] = {"build_report_s": {}, "cold_s": {}, "error": {}, "cli_s": {}, "cli_error": {}}
        for label, seconds in lengths.items():
            timings, _ = timed[label]
            d["build_report_s"][label] = statistics.median(timings[1:])
            d["cold_s"][label] = timings[0]
            r = build_report(store, f"bench-{label}")
            energy_j, units = r.warmup.energy_j + r.saturated_window.energy_j, r.units_warmup + r.units_saturated
            d["error"][label] = errors(seconds, energy_j, units)
        cli = cli_reports(servers[name], lengths)
        d["cli_startup_s"] = statistics.median(s for s, _ in cli["--help"])
        for label in lengths:
            d["cli_s"][label] = statistics.median(s for s, _ in cli[label])
            d["cli_error"][label] = max((e for _, e in cli[label]), key=lambda e: e["worst"])
        d["flatness"] = d["build_report_s"][longest] / d["build_report_s"][shortest]
        d["cli_flatness"] = d["cli_s"][longest] / d["cli_s"][shortest]
        d["right"] = all(e["worst"] <= EXACT for e in [*d["error"].values(), *d["cli_error"].values()])
        result[name] = d
        store.close()
    return result


def open_store(server: Influxd | Victoria) -> InfluxV1Store | VictoriaStore:
    if isinstance(server, Victoria):
        return VictoriaStore(server.url)
    store = InfluxV1Store(server.url, report.DATABASE)
    store.create_database()
    return store


def energy(open_ns: int, seconds: int) -> Iterator[wire.pb.Batch]:
    """Each host's samples from BEFORE_S before ``open_ns`` to AFTER_S after the job's end,
    BATCH_S seconds a batch, one agent stream per host and job."""
    t0 = open_ns - report.BEFORE_S * NS
    total_s = report.BEFORE_S + seconds + report.AFTER_S
    for h in range(report.HOSTS):
        host = f"host-{h:02d}"
        for seq, first in enumerate(range(0, total_s, BATCH_S), start=1):
            batch = wire.Batch(stream_id=f"s-{h}-{t0}", seq=seq, sent_ns=t0)
            batch.host.host_id = host
            for component, device, watts in report.SERIES:
                for k in range(first + 1, min(first + BATCH_S, total_s) + 1):
                    end = t0 + k * NS
                    batch.samples.add(
                        source="rapl",
                        component=component,
                        device=device,
                        quality=wire.QUALITY_COUNTER,
                        healthy=True,
                        start_ns=end - NS,
                        end_ns=end,
                        energy_j=watts,
                        power_w=watts,
                        cumulative_j=watts * k,
                    )
            yield batch


def truth(seconds: int) -> tuple[float, float]:
    """(energy J, units) of a job of ``seconds`` as the data was made."""
    energy_j = report.HOSTS * sum(w for _, _, w in report.SERIES) * seconds
    units = report.HOSTS * 600.0 * len(range(report.UNITS_EVERY_S, seconds, report.UNITS_EVERY_S))
    return energy_j, units


def errors(seconds: int, energy_j: float, units: float) -> dict[str, float]:
    want_j, want_units = truth(seconds)
    out = {"energy": abs(energy_j - want_j) / want_j, "units": abs(units - want_units) / want_units}
    return {**out, "worst": max(out.values())}


def cli_reports(server: Influxd | Victoria, lengths: dict[str, int]) -> dict[str, list[tuple[float, dict[str, float]]]]:
    """Per job: (wall seconds, errors) of each ``wattline report --json`` run, the jobs alternating;
    under ``--help``: the same command's start-up alone (it prints its help and reads nothing)."""
    argv = [*wattline_argv(), "report", "--json", "--store", server.url]
    if isinstance(server, Influxd):
        argv += ["--influx-database", report.DATABASE]
    out: dict[str, list[tuple[float, dict[str, float]]]] = {label: [] for label in [*lengths, "--help"]}
    for k in range(CLI_RUNS):
        for label in [*lengths, "--help"] if k % 2 == 0 else ["--help", *reversed(lengths)]:
            t0 = time.perf_counter()
            job = "--help" if label == "--help" else f"bench-{label}"
            done = subprocess.run([*argv, job], capture_output=True, timeout=120, check=False)
            wall = time.perf_counter() - t0
            if done.returncode != 0:
                raise RuntimeError(f"wattline report {label} failed: {done.stderr.decode()[-500:]}")
            if label == "--help":
                out[label].append((wall, {"worst": 0.0}))
                continue
            whole = json.loads(done.stdout)["whole_run"]
            out[label].append((wall, errors(lengths[label], whole["energy_j"], whole["units"])))
    return out
