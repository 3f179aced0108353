"""A job's device claims that match no device measured on its host are named in the report:
nothing is charged for them, so the figure lacks their energy, and the report must say so
rather than show a GPU job's energy without its GPUs as if whole.

The store holds GPU samples of devices ``GPU-0`` and ``GPU-1`` (tests/helpers/servers.py ``make_batch``);
one job claims them by index (``gpu:0``, as a holder that could not map an index to a UUID
leaves it), one by UUID.
"""

from __future__ import annotations

import json
from pathlib import Path

from servers import make_batch
from typer.testing import CliRunner

from wattline.cli.main import app
from wattline.stores.sqlite.store import SqliteStore


def _report(db: Path, job_id: str) -> dict[str, object]:
    out = CliRunner().invoke(app, ["report", job_id, "--json"], env={"WATTLINE_STORE": f"sqlite:///{db}"})
    assert out.exit_code == 0, out.output[-2000:]
    return json.loads(out.stdout)


def test_a_claim_no_device_matches_is_named_and_a_matching_one_is_not(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    by_index = make_batch(job_id="by-index", samples=6)
    by_uuid = make_batch(job_id="by-uuid", samples=6, stream="stream-b", host="node-2")
    del by_uuid.job_events[0].devices[:]
    by_uuid.job_events[0].devices.extend(["gpu:GPU-0", "gpu:GPU-1"])
    with SqliteStore(db) as store:
        store.write(by_index)
        store.write(by_uuid)
    index_notes = [n for n in _report(db, "by-index")["notes"] if "match no device" in n]
    assert len(index_notes) == 1 and "gpu:0, gpu:1" in index_notes[0], index_notes
    uuid_report = _report(db, "by-uuid")
    assert not [n for n in uuid_report["notes"] if "match no device" in n]
    assert uuid_report["whole_run"]["energy_j"] > 0  # the claimed GPUs are charged
