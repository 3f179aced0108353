"""Job(sync=...): queued accelerator work is waited for before the window opens, at
mark_saturated() and before it closes; "torch" without CUDA is a no-op; a bad value is
one ValueError line."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from wattline import wire
from wattline.jobs.wrappers.job import Job


class Recorder:
    """An event sink and a sync callable writing one timeline: ("sync", ns) and (kind, event ns)."""

    host_id = "h"

    def __init__(self) -> None:
        self.timeline: list[tuple[str, int]] = []

    def sync(self) -> None:
        self.timeline.append(("sync", time.time_ns()))
        time.sleep(0.002)  # work still queued: the event that follows comes after it

    def send(self, events: list[Any]) -> None:
        self.timeline += [(wire.pb.JobEvent.Kind.Name(e.kind), e.time_ns) for e in events]

    def edge_tick(self) -> None:
        return None

    def close(self) -> None:
        return None


def test_sync_comes_before_the_open_the_saturation_mark_and_the_close() -> None:
    rec = Recorder()
    with Job("synced", sink=rec, sync=rec.sync) as job:
        job.mark_saturated()
    edges = [(k, t) for k, t in rec.timeline if k in {"sync", "KIND_OPEN", "KIND_PHASE", "KIND_CLOSE"}]
    assert [k for k, _ in edges] == ["sync", "KIND_OPEN", "sync", "KIND_PHASE", "sync", "KIND_CLOSE"]
    stamps = [t for _, t in edges]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)  # each event stamped after its sync


def test_a_failing_sync_at_the_close_still_closes_the_job() -> None:
    rec = Recorder()

    def broken() -> None:
        if any(k == "KIND_OPEN" for k, _ in rec.timeline):
            raise RuntimeError("device lost")

    with Job("broken", sink=rec, sync=broken):
        pass
    assert [k for k, _ in rec.timeline][-1] == "KIND_CLOSE"


def test_torch_without_cuda_is_a_no_op_and_is_only_imported_when_asked() -> None:
    plain = "from wattline.jobs.wrappers.job import Job; Job('plain', sync=None); import sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", plain], check=True, timeout=60)
    pytest.importorskip("torch")
    rec = Recorder()
    with Job("cpu", sink=rec, sync="torch") as job:
        job.mark_saturated()
    assert [k for k, _ in rec.timeline].count("KIND_CLOSE") == 1


@pytest.mark.parametrize("bad", ["jax", 3, "torch\nx"])
def test_a_bad_sync_is_one_value_error_line(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"^sync must be 'torch' or a callable, not ") as err:
        Job("bad", sync=bad)
    assert "\n" not in str(err.value)
