"""Part "fleet" (issue #30): VictoriaMetrics beside InfluxDB 1.x at a fleet's size, same run.

Both servers run side by side for the whole part: first the ingest of 1,000 agents at 1 Hz
into each (:mod:`wlbench.fleet_ingest`), then the 16-host reports of a 24 h and a 1 h job
on each (:mod:`wlbench.fleet_report`). ``--quick``: 100 agents, jobs of 10 min and 1 h.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wlbench import fleet_ingest, fleet_report
from wlbench.common import Influxd, Proc, Victoria, running, start_influxd, start_victoria_metrics


def run(work: Path, quick: bool) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    procs: list[Proc] = []
    with running(procs):
        victoria = start_victoria_metrics(work / "victoria-metrics")
        procs.append(victoria.proc)
        influxd = start_influxd(work / "influxd")
        procs.append(influxd.proc)
        servers: dict[str, Influxd | Victoria] = {"victoriametrics": victoria, "influxdb1": influxd}
        return {
            "ingest": fleet_ingest.run(servers, work / "ingest", quick),
            "report": fleet_report.run(servers, work / "report", quick),
        }
