"""When stored samples become searchable: a reader polling a store while agents write to it.

A collector's write is acknowledged when the store has taken the points. InfluxDB answers
them from then on; VictoriaMetrics keeps new rows in memory and makes them searchable a
moment later, and a new series later still. So the delay from a sample's time stamp to the
moment a query first returns it is measured apart:

- :class:`Probe`: for a few hosts of the fleet (``HOSTS``), from ``start_at`` on, every
  ``EVERY_S`` the ``energy_j`` of the last ``WINDOW_S`` seconds is asked for and the time each
  (host, device, time stamp) is first seen is noted. The figure includes up to ``EVERY_S`` of
  polling and the query's own time; a sample first seen later than ``WINDOW_S`` after its
  time stamp is never seen (``seen`` against ``expected`` tells).
- :func:`new_series_delay`: one sample of a host never seen before, written through the
  store's own writer, then asked for every ``NEW_EVERY_S`` until it comes back.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.parse
from typing import Any

from wattline import wire
from wattline.stores.base import Store
from wlbench.common import Influxd, Poller, Victoria, http

#: The probed hosts: the first ten simulated agents (wlbench.fleet names them fleet-00000...).
HOSTS = [f"fleet-{i:05d}" for i in range(10)]
EVERY_S = 0.25
WINDOW_S = 20
NEW_EVERY_S = 0.05
Key = tuple[str, str, int]  #: host, device, time stamp (ms)


def visible(server: Influxd | Victoria, hosts: str, window_s: float) -> list[Key]:
    """The (host, device, ms) of the ``energy_j`` of hosts matching the regex ``hosts`` stamped in
    the last ``window_s`` seconds that a query returns now (InfluxDB: database ``wattline``)."""
    if isinstance(server, Influxd):
        rows = server.query(
            f"SELECT energy_j FROM energy WHERE host =~ /^({hosts})$/ AND time > now() - {window_s}s "
            "GROUP BY host, device",
            "wattline",
        )
        return [(r["host"], r["device"], int(r["time"]) // 10**6) for r in rows]
    params = {"match[]": f'energy_energy_j{{host=~"{hosts}"}}', "start": f"{time.time() - window_s:.3f}"}
    status, body = http("GET", f"{server.url}/api/v1/export?{urllib.parse.urlencode(params)}")
    if status != 200:
        raise RuntimeError(f"export answered {status}")
    keys: list[Key] = []
    for line in body.splitlines():
        doc: dict[str, Any] = json.loads(line)
        host, device = doc["metric"]["host"], doc["metric"]["device"]
        keys += [(host, device, int(t)) for t in doc["timestamps"]]
    return keys


class Probe(Poller):
    """Polls ``server`` from ``start_at`` (wall clock) on."""

    def __init__(self, server: Influxd | Victoria, start_at: float) -> None:
        super().__init__(EVERY_S, start_at)
        self.server = server
        self.first_seen: dict[Key, float] = {}  #: -> wall clock, s
        self.errors = 0

    def tick(self) -> None:
        try:
            keys = visible(self.server, "|".join(HOSTS), WINDOW_S)
        except (OSError, RuntimeError, ValueError, KeyError):
            self.errors += 1
            return
        seen = time.time()
        for key in keys:
            self.first_seen.setdefault(key, seen)

    def figures(self, channels: int, end: float) -> dict[str, Any]:
        """Delay percentiles (s) from time stamp to first seen of the samples stamped from a
        second after the probe began to ``end``; how many were seen against ``channels`` per
        host a second."""
        start = self.start_at + 1.0
        delays = sorted(seen - ms / 1e3 for (_, _, ms), seen in self.first_seen.items() if start <= ms / 1e3 < end)
        return {
            "hosts": len(HOSTS),
            "every_s": EVERY_S,
            "from_s": start,
            "seen": len(delays),
            "expected": len(HOSTS) * channels * round(end - start),
            "p50_s": percentile(delays, 50),
            "p99_s": percentile(delays, 99),
            "max_s": delays[-1] if delays else None,
            "errors": self.errors,
        }


def percentile(ordered: list[float], p: float) -> float | None:
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else None


def new_series_delay(server: Influxd | Victoria, store: Store, tries: int = 3, limit_s: float = 60.0) -> float | None:
    """Median seconds from the acknowledged write of a new host's sample to a query returning it."""
    delays = []
    for k in range(tries):
        host = f"new-series-{k}-{time.time_ns()}"
        batch = wire.Batch(stream_id=host, seq=1)
        batch.host.host_id = host
        end = time.time_ns()
        batch.samples.add(source="rapl", component="cpu_package", device="package-0", quality=wire.QUALITY_COUNTER,
                          healthy=True, start_ns=end - 10**9, end_ns=end, energy_j=1.0, power_w=1.0,
                          cumulative_j=1.0)  # fmt: skip
        if store.write(batch).rejected:
            raise RuntimeError(f"{store!r} did not take the new series' sample")
        acked = time.monotonic()
        while not visible(server, host, 60):
            if time.monotonic() - acked > limit_s:
                return None
            time.sleep(NEW_EVERY_S)
        delays.append(time.monotonic() - acked)
    return statistics.median(delays)
