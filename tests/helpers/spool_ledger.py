"""The truth of what an agent produced: every record it ever wrote to its disk spool.

A watcher hard-links each spool segment the moment it appears, so a test keeps every
segment's inode even after the agent deletes it once acknowledged (a record torn by a kill
is truncated by the agent's recovery in that same inode, so it is not counted as produced).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from wattline.agent.spool.format import read_segment

Key = tuple[str, int]  # (device, interval end ns)


class Ledger:
    """Hard-links every spool segment the moment it appears (the truth of what was produced)."""

    def __init__(self, spool: Path, ledger: Path, host: str) -> None:
        self.spool, self.ledger, self.host = spool, ledger, host
        ledger.mkdir()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _scan(self) -> None:
        for path in self.spool.glob("seg-*.wls"):
            target = self.ledger / path.name
            if not target.exists():
                try:
                    os.link(path, target)
                except FileNotFoundError:
                    pass  # deleted meanwhile: the check below would report it as lost
                except FileExistsError:
                    pass

    def _run(self) -> None:
        while not self.stop.wait(0.005):
            self._scan()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self._scan()

    def samples(self) -> dict[Key, tuple[str, int, float, float]]:
        """(device, end) -> (stream, start, energy_j, cumulative_j) of every record ever written."""
        out: dict[Key, tuple[str, int, float, float]] = {}
        for path in sorted(self.ledger.glob("seg-*.wls")):
            for record in read_segment(path):
                assert record.batch.host.host_id == self.host
                for s in record.batch.samples:
                    key = (s.device, s.end_ns)
                    assert key not in out, f"the agent produced {key} twice"
                    out[key] = (record.batch.stream_id, s.start_ns, s.energy_j, s.cumulative_j)
        return out
