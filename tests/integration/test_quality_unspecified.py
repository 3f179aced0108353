"""A sample of quality "unspecified" says nothing of how its energy was obtained: the collector
refuses it over the real wire (that point alone, with its reason, counted; the rest of the
batch written), and rows an older collector stored with it are left out of every report's
figures and named in its notes, never an error.

One host: cpu_package at 10 W and dram at 5 W, 1 s samples for 20 s; job A alone in
[2 s, 6 s) (read from the cumulative counters at its edges), jobs B [10 s, 16 s) and
C [12 s, 18 s) overlapping (read from the samples, split equally).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from servers import T0

from wattline import wire
from wattline.collector.server import CollectorServer
from wattline.stores.sqlite.store import SqliteStore

HOST = "quality-host"
S = 10**9
CPU_W, DRAM_W = 10.0, 5.0
JOBS = {"A": (2, 6), "B": (10, 16), "C": (12, 18)}
#: Job -> its energy from cpu_package alone: B and C share [12 s, 16 s) equally.
TRUTH = {"A": CPU_W * 4, "B": CPU_W * (2 + 4 / 2), "C": CPU_W * (4 / 2 + 2)}
LEFT_OUT = "rapl dram package-0/dram (unspecified)"


def batch(dram_quality: int) -> wire.pb.Batch:
    """The host's 20 s of samples (dram with ``dram_quality``) and the three jobs' events."""
    out = wire.Batch(stream_id="stream-q", seq=1, sent_ns=T0)
    out.host.host_id = HOST
    for component, device, watts, quality in (
        ("cpu_package", "package-0", CPU_W, wire.QUALITY_COUNTER),
        ("dram", "package-0/dram", DRAM_W, dram_quality),
    ):
        for i in range(20):
            out.samples.add(
                source="rapl", component=component, device=device, quality=quality,
                start_ns=T0 + i * S, end_ns=T0 + (i + 1) * S,
                energy_j=watts, power_w=watts, cumulative_j=watts * (i + 1),
            )  # fmt: skip
    kinds = wire.pb.JobEvent
    for job, (start, end) in JOBS.items():
        out.job_events.add(job_id=job, kind=kinds.KIND_OPEN, time_ns=T0 + start * S, event_seq=1, name=job)
        out.job_events.add(job_id=job, kind=kinds.KIND_CLOSE, time_ns=T0 + end * S, event_seq=2, exit_code=0)
    return out


def cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "wattline.cli.main", *args, "--store", f"sqlite:///{db}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, env={**os.environ, "COLUMNS": "200"})


def report(db: Path, job: str) -> dict[str, Any]:
    done = cli(db, "report", job, "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_collector_refuses_an_unspecified_sample_and_keeps_the_rest(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    store = SqliteStore(db)
    server = CollectorServer(store, "127.0.0.1:0")
    server.start()
    try:
        sent = batch(wire.pb.QUALITY_UNSPECIFIED)
        ack = wire.telemetry_stub(grpc.insecure_channel(f"127.0.0.1:{server.port}")).Push(sent, timeout=10)
        rejected = server.registry.get_sample_value("wattline_collector_points_rejected_total")
    finally:
        server.stop(grace_s=1)
        store.close()
    assert (ack.written, ack.rejected) == (20 + 6, 20)
    assert ack.message.startswith(
        "sample 20: quality unspecified (say how the energy was obtained: counter, integrated or model)"
    )
    assert rejected == 20
    for job, truth in TRUTH.items():
        got = report(db, job)
        assert got["measured"]["energy_j"] + got["warmup"]["energy_j"] == pytest.approx(truth)
        assert not any("unspecified" in note for note in got["notes"])  # nothing of it was stored
        assert "memory" in got["measured"]["coverage"]["missing"]


def test_rows_stored_unspecified_are_left_out_and_named_never_an_error(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    with SqliteStore(db) as store:  # written as an older collector did: no validation of quality
        assert store.write(batch(wire.pb.QUALITY_UNSPECIFIED)).rejected == 0
    for job, truth in TRUTH.items():
        got = report(db, job)
        assert got["measured"]["energy_j"] + got["warmup"]["energy_j"] == pytest.approx(truth)
        assert "memory" in got["measured"]["coverage"]["missing"]
        assert [n for n in got["notes"] if LEFT_OUT in n] == [
            f"{HOST}: left out of the figures, stored with no known quality "
            f"(how its energy was obtained is unknown): {LEFT_OUT}"
        ]
    jobs = cli(db, "jobs")
    assert jobs.returncode == 0, jobs.stderr
    assert "error" not in jobs.stdout and "Traceback" not in jobs.stderr
    assert all(job in jobs.stdout for job in JOBS)
