"""Part "fleet", ingest (issue #30): 1,000 agents at 1 Hz into VictoriaMetrics, and into
InfluxDB 1.x in the same run, one store after the other, both servers up throughout.

Simulated: the agents, as in the scale part (:mod:`wlbench.fleet`): asyncio gRPC clients in
four processes, each agent with its own connection and the real agent's channel settings,
12 RAPL + NIC samples a second, sealed and pushed every ``batch_interval`` (1.5 s) on its own
phase, kept until acknowledged and retried for 60 s after the run. Real: the collector's gRPC
server and admission path (:class:`~wattline.collector.server.CollectorServer`) over the store
``wattline collector --store URL`` opens for that URL (found from its ``/ping``), in a process
of its own (:mod:`wlbench.sink`, which records each sample's delay from its time stamp to its
write's acknowledgement), and the database servers.

Beside the scale part's figures, per store: the samples the database holds after the run
(a count query) against those sent and not still waiting in an agent: lost; the delays to
the acknowledgement also of the samples from STEADY_AFTER_S on; the database server's CPU
per sample stored from STEADY_AFTER_S (quick: a quarter of the run) to half the run, and the
collector's over the whole run; from the second half on, when the samples of a few hosts first come back from a query;
after the run, when a new series does (:mod:`wlbench.visibility`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from wattline.stores.factory import open_store
from wlbench import scale
from wlbench.common import Influxd, Poller, Proc, Victoria
from wlbench.fleet import AGENT_PUSH_EVERY_S
from wlbench.visibility import Probe, new_series_delay

#: Samples per agent and second (the fixture host's RAPL zones and NICs).
CHANNELS = 12
#: Seconds from the run's start to the steady state, when every series exists (VictoriaMetrics
#: makes new series slowly, refusing pushes meanwhile): delays and the server's CPU also from then.
STEADY_AFTER_S = 15.0


def run(servers: dict[str, Influxd | Victoria], work: Path, quick: bool) -> dict[str, Any]:
    agents, duration = (100, 24.0) if quick else (1000, 90.0)
    result: dict[str, Any] = {
        "agents": agents,
        "duration_s": duration,
        "push_every_s": AGENT_PUSH_EVERY_S,
        "steady_after_s": STEADY_AFTER_S,
    }
    for name, server in servers.items():
        # the agents start a second or two after the call: the probe after the run's first half
        probe = Probe(server, time.time() + 2.0 + duration / 2)
        cpu = CpuLog(server.proc)
        probe.start()
        cpu.start()
        try:
            d = scale.size(agents, name, server.url, duration, work / name, steady_after_s=STEADY_AFTER_S)
        finally:
            probe.stop()
            cpu.stop()
        start, end = d["window"]
        d["in_database"] = stored(server, start)
        # sent, not waiting in an agent's spool, and not in the database: lost
        d["lost_in_database"] = d["sent"] - d["unacked_at_end"] - d["in_database"]
        server_cores = cpu.rate(start + min(STEADY_AFTER_S, duration / 4), start + duration / 2)
        d["server_core_pct"] = None if server_cores is None else server_cores * 100
        d["server_us_per_sample"] = None if server_cores is None else server_cores / d["stored_per_s"] * 1e6
        d["server_hwm_mib"] = server.proc.hwm_mib()
        d["collector_us_per_sample"] = d["collector_cpu_s"] / d["in_database"] * 1e6 if d["in_database"] else None
        d["searchable"] = probe.figures(CHANNELS, end)
        with open_store(server.url) as store:
            d["new_series_searchable_s"] = new_series_delay(server, store)
        result[name] = d
    return result


def stored(server: Influxd | Victoria, since: float) -> int:
    """Samples of the simulated fleet the database holds (each once: a resent one replaced its copy)."""
    if isinstance(server, Victoria):
        server.flush()
        now = time.time()
        found = server.query(
            f'sum(count_over_time(energy_energy_j{{host=~"fleet-.*"}}[{int(now - since) + 10}s]))', now
        )
        return int(float(found[0]["value"][1])) if found else 0
    rows = server.query(f"SELECT count(energy_j) FROM energy WHERE time >= {int((since - 10) * 1e9)}", "wattline")
    return int(rows[0]["count"]) if rows else 0


class CpuLog(Poller):
    """A process's CPU seconds, noted once a second."""

    def __init__(self, proc: Proc) -> None:
        super().__init__(1.0)
        self.proc = proc
        self.points: list[tuple[float, float]] = []  #: (wall clock, CPU seconds)

    def tick(self) -> None:
        self.points.append((time.time(), self.proc.cpu_s()))

    def rate(self, a: float, b: float) -> float | None:
        """Cores used between the wall-clock times ``a`` and ``b`` (the points inside them)."""
        inside = [p for p in self.points if a <= p[0] <= b]
        if len(inside) < 2:
            return None
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return (c1 - c0) / (t1 - t0)
