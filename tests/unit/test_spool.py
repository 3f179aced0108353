"""The spools: in order, bounded (oldest dropped, counted), and the disk spool crash-safe.

The disk spool is killed for real (``kill -9`` of a child process writing to it), its
files are torn the way a power cut tears them, and what it replays goes through a real
collector into SQLite: one copy of each point, whatever was resent.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_rows import energy_rows

from wattline import wire
from wattline.agent.assembly import open_spool, spool_directory
from wattline.agent.settings import AgentSettings
from wattline.agent.spool.base import Spool
from wattline.agent.spool.disk import DiskSpool
from wattline.agent.spool.format import MAGIC, SpoolError, read_segment
from wattline.agent.spool.memory import MemorySpool
from wattline.agent.uplink import Uplink
from wattline.collector.server import CollectorServer
from wattline.segments import segment_name, segment_numbers
from wattline.stores.sqlite.store import SqliteStore

HOST = wire.Host(host_id="node-1", labels={"cluster": "c1"}, agent_version="test")
T0 = 1_767_225_600 * 10**9


def tick(i: int, channels: int = 2) -> list[wire.pb.Sample]:
    """The samples of tick ``i``: one per channel, interval (i-1 .. i) seconds after T0."""
    return [
        wire.Sample(
            source="rapl",
            component="cpu_package",
            device=f"package-{c}",
            start_ns=T0 + (i - 1) * 10**9,
            end_ns=T0 + i * 10**9,
            energy_j=float(i),
            power_w=float(i),
            cumulative_j=i * (i + 1) / 2,
            quality=wire.QUALITY_COUNTER,
            healthy=True,
        )
        for c in range(channels)
    ]


def drain(spool: Spool) -> list[wire.pb.Batch]:
    """Every batch in delivery order, each acknowledged after it is taken (copies)."""
    spool.seal()
    out = []
    while (batch := spool.peek()) is not None:
        copy = wire.Batch()
        copy.CopyFrom(batch)
        out.append(copy)
        spool.ack(batch.seq, batch.stream_id)
    return out


def ends(batches: list[wire.pb.Batch]) -> list[int]:
    return [s.end_ns for b in batches for s in b.samples if s.device == "package-0"]


# -- in memory -----------------------------------------------------------------------


def test_memory_spool_drops_the_oldest_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    spool = MemorySpool(HOST, max_batch_samples=4, max_batches=3)
    for i in range(1, 11):
        spool.add_samples(tick(i))  # 20 samples -> 5 batches of 4
    with caplog.at_level(logging.WARNING):
        assert spool.seal() == 5
    assert (spool.dropped_batches, spool.dropped_samples) == (2, 8)
    assert "spool full (3 batches): dropped batch 1" in caplog.text
    batches = drain(spool)
    assert [b.seq for b in batches] == [3, 4, 5]
    assert ends(batches) == [T0 + i * 10**9 for i in range(5, 11)]
    assert (spool.acked_batches, spool.acked_samples) == (3, 12)


def test_ack_names_its_stream() -> None:
    spool = MemorySpool(HOST)
    spool.add_samples(tick(1))
    spool.seal()
    spool.ack(1, "another-stream")
    assert spool.backlog() == 1
    spool.ack(1, spool.stream_id)
    assert spool.backlog() == 0


def test_split_head_renumbers_what_follows() -> None:
    spool = MemorySpool(HOST, max_batch_samples=8)
    for i in range(1, 9):
        spool.add_samples(tick(i))
    spool.seal()
    assert spool.split_head()
    batches = drain(spool)
    assert [(b.seq, len(b.samples)) for b in batches] == [(1, 4), (2, 4), (3, 8)]  # later ones stay
    assert ends(batches) == [T0 + i * 10**9 for i in range(1, 9)]
    one = MemorySpool(HOST)
    one.add_samples(tick(1, channels=1))
    one.seal()
    assert not one.split_head()


# -- on disk -------------------------------------------------------------------------


def test_disk_spool_delivers_in_order_in_bounded_batches(tmp_path: Path) -> None:
    spool = DiskSpool(HOST, tmp_path / "spool", max_batch_samples=5)
    for i in range(1, 11):
        spool.add_samples(tick(i))
        if i == 4:
            spool.add_job_events([wire.JobEvent(job_id="j1", kind=wire.pb.JobEvent.KIND_OPEN, time_ns=T0 + 1)])
    batches = drain(spool)
    assert all(len(b.samples) <= 5 for b in batches)
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))
    assert {b.stream_id for b in batches} == {spool.stream_id}
    assert all(b.host == HOST for b in batches)
    assert ends(batches) == [T0 + i * 10**9 for i in range(1, 11)]
    assert [e.job_id for b in batches for e in b.job_events] == ["j1"]
    assert spool.backlog() == 0
    spool.close()
    assert (tmp_path / "spool").stat().st_mode & 0o077 == 0


def test_restart_replays_the_old_stream_first_under_its_own_id(tmp_path: Path) -> None:
    first = DiskSpool(HOST, tmp_path)
    for i in range(1, 4):
        first.add_samples(tick(i))
    first.seal()
    head = first.peek()
    assert head is not None
    first.ack(head.seq, head.stream_id)  # ticks 1..3 delivered
    for i in range(4, 6):
        first.add_samples(tick(i))  # written, never sealed: the process dies here
    first.close()

    other_host = wire.Host(host_id="node-1", labels={"cluster": "c2"}, agent_version="test-2")
    second = DiskSpool(other_host, tmp_path)
    assert second.stream_id != first.stream_id  # cumulative_j restarts: a new stream
    assert (second.recovered_batches, second.recovered_samples) == (1, 4)
    second.add_samples(tick(100))
    batches = drain(second)
    assert [b.stream_id for b in batches] == [first.stream_id, second.stream_id]
    assert batches[0].host == HOST and batches[1].host == other_host  # self-describing records
    assert batches[0].seq == 2  # after the last acknowledged seq of that stream
    assert ends(batches) == [T0 + i * 10**9 for i in (4, 5, 100)]
    second.close()
    third = DiskSpool(HOST, tmp_path)
    assert third.backlog() == 0
    assert len(segment_numbers(tmp_path)) == 1  # only its own, empty, active segment
    third.close()


CHILD = """
import os, sys
from pathlib import Path
sys.path[:0] = {paths!r}
from test_spool import HOST, tick
from wattline.agent.spool.disk import DiskSpool
spool = DiskSpool(HOST, Path(sys.argv[1]), max_batch_samples=64)
i = 0
while True:
    i += 1
    spool.add_samples(tick(i))
    if i % 10 == 0:
        spool.seal()
    os.write(1, b"%d\\n" % i)
"""


def test_kill_9_loses_nothing_written(tmp_path: Path) -> None:
    """A child adds ticks as fast as it can and is SIGKILLed; every tick it finished comes back."""
    script = CHILD.format(paths=[str(Path(__file__).parent), str(Path(__file__).parents[1] / "helpers")])
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE)
    assert child.stdout is not None
    last = 0
    deadline = time.monotonic() + 30
    while last < 3000 and time.monotonic() < deadline:
        line = child.stdout.readline()
        assert line, "the child died"
        last = int(line)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    last = max([last, *(int(x) for x in child.stdout.read().split())])
    spool = DiskSpool(HOST, tmp_path, max_batch_samples=64)
    got = ends(drain(spool))
    spool.close()
    # Every finished add is there, in order, once; at most one more (killed after its write).
    assert got[:last] == [T0 + i * 10**9 for i in range(1, last + 1)]
    assert len(got) in (last, last + 1)
    print(f"\nkill -9 after {last} ticks: {len(got)} recovered")


@pytest.mark.parametrize("damage", ["cut_in_header", "cut_in_payload", "zeros_after", "flipped_byte"])
def test_torn_last_record_is_truncated(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    spool = DiskSpool(HOST, tmp_path)
    for i in range(1, 6):
        spool.add_samples(tick(i))
    spool.close()
    (number,) = segment_numbers(tmp_path)
    path = tmp_path / segment_name(number)
    records = list(read_segment(path))
    assert len(records) == 5
    last = records[-1]
    data = bytearray(path.read_bytes())
    if damage == "cut_in_header":
        data = data[: last.offset + 7]
    elif damage == "cut_in_payload":
        data = data[: last.end - 3]
    elif damage == "zeros_after":
        data = data[: last.end - 10] + bytes(4096)  # what a power cut can leave
    else:
        data[last.end - 5] ^= 0x40
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        again = DiskSpool(HOST, tmp_path)
    assert "torn or corrupt record" in caplog.text
    assert again.corrupt_bytes > 0
    assert path.stat().st_size == last.offset  # truncated at the damaged record
    again.add_samples(tick(6))
    assert ends(drain(again)) == [T0 + i * 10**9 for i in (1, 2, 3, 4, 6)]
    again.close()


def test_a_second_agent_cannot_share_the_directory(tmp_path: Path) -> None:
    spool = DiskSpool(HOST, tmp_path)
    with pytest.raises(SpoolError, match=f"in use by another agent \\(pid {os.getpid()}\\)"):
        DiskSpool(HOST, tmp_path)
    spool.close()
    DiskSpool(HOST, tmp_path).close()


def test_size_bound_drops_the_oldest_segments(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = DiskSpool(HOST, tmp_path, max_bytes=64 << 10)  # 4 KiB segments
    with caplog.at_level(logging.WARNING):
        for i in range(1, 2001):
            spool.add_samples(tick(i))
    assert spool.size_bytes() <= 64 << 10
    assert spool.dropped_samples > 0
    assert "full (0.0625 MiB): dropped the oldest segment" in caplog.text
    got = ends(drain(spool))
    assert got == [T0 + i * 10**9 for i in range(2001 - len(got), 2001)]  # the newest, contiguous
    assert spool.dropped_samples + spool.acked_samples == 4000  # every sample accounted for
    spool.close()


def test_age_bound_drops_old_batches(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = DiskSpool(HOST, tmp_path, max_age_s=0.2)
    spool.add_samples(tick(1))
    spool.seal()
    time.sleep(0.3)  # time, not a state: the first batch ages past max_age_s
    spool.add_samples(tick(2))
    with caplog.at_level(logging.WARNING):
        got = ends(drain(spool))
    assert got == [T0 + 2 * 10**9]
    assert (spool.dropped_batches, spool.dropped_samples) == (1, 2)
    assert "older than 0.2 s dropped" in caplog.text
    spool.close()


def test_disk_full_is_counted_never_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spool = DiskSpool(HOST, tmp_path)
    spool.add_samples(tick(1))

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m, caplog.at_level(logging.ERROR):
        m.setattr(os, "write", full)
        spool.add_samples(tick(2))  # the sampler's call returns normally
    assert spool.write_errors == 1 and spool.dropped_samples == 2
    assert "write failed, samples dropped (No space left on device)" in caplog.text
    spool.add_samples(tick(3))
    assert ends(drain(spool)) == [T0 + 10**9, T0 + 3 * 10**9]
    spool.close()


def test_split_head_on_disk(tmp_path: Path) -> None:
    spool = DiskSpool(HOST, tmp_path, max_batch_samples=100)
    for i in range(1, 7):
        spool.add_samples(tick(i))
    spool.seal()
    assert spool.split_head()
    batches = drain(spool)
    assert [(b.seq, len(b.samples)) for b in batches] == [(1, 6), (2, 6)]
    assert ends(batches) == [T0 + i * 10**9 for i in range(1, 7)]
    spool.close()


def test_spool_directory_from_settings_and_systemd(tmp_path: Path) -> None:
    assert spool_directory(AgentSettings(), {}) is None
    assert spool_directory(AgentSettings(), {"STATE_DIRECTORY": "/var/lib/wattline:/x"}) == Path(
        "/var/lib/wattline/spool"
    )
    assert spool_directory(AgentSettings(spool_dir="memory"), {"STATE_DIRECTORY": "/s"}) is None
    assert spool_directory(AgentSettings(spool_dir=str(tmp_path)), {}) == tmp_path
    spool = open_spool(AgentSettings(spool_max_mb=1), HOST, {"STATE_DIRECTORY": str(tmp_path)})
    assert isinstance(spool, DiskSpool) and spool.directory == tmp_path / "spool" and spool.max_bytes == 1 << 20
    spool.close()
    assert type(open_spool(AgentSettings(), HOST, {})) is MemorySpool


def test_replays_leave_one_copy_through_the_collector(tmp_path: Path) -> None:
    """A batch written but not acknowledged (lost ack, agent killed) is sent again after the
    restart, and pushed twice more by hand: the store holds each point once."""
    store = SqliteStore(tmp_path / "w.db")
    server = CollectorServer(store, "127.0.0.1:0")
    server.start()
    address = f"127.0.0.1:{server.port}"
    try:
        first = DiskSpool(HOST, tmp_path / "spool")
        for i in range(1, 5):
            first.add_samples(tick(i))
        first.seal()
        batch = first.peek()
        assert batch is not None
        stub = Uplink(first, [address])._connect()
        assert stub.Push(batch, timeout=10).written == 8  # written; the ack never reaches the spool
        assert stub.Push(batch, timeout=10).written == 8  # a resend
        first.close()

        second = DiskSpool(HOST, tmp_path / "spool")
        assert second.recovered_samples == 8
        second.add_samples(tick(5))
        uplink = Uplink(second, [address])
        second.seal()
        uplink.drain()
        assert second.backlog() == 0
        uplink.close()
        second.close()
        rows = energy_rows(store, host="node-1")
        assert len(rows) == 10  # 5 ticks x 2 channels, once each
        assert sorted(r["time_ns"] for r in rows if r["device"] == "package-0") == [T0 + i * 10**9 for i in range(1, 6)]
    finally:
        server.stop()
        store.close()


def test_segment_files_start_with_the_magic(tmp_path: Path) -> None:
    spool = DiskSpool(HOST, tmp_path)
    spool.add_samples(tick(1))
    spool.close()
    (number,) = segment_numbers(tmp_path)
    assert (tmp_path / segment_name(number)).read_bytes().startswith(MAGIC)
    (tmp_path / segment_name(number + 1)).write_bytes(b"garbage, not a segment")
    again = DiskSpool(HOST, tmp_path)
    assert again.recovered_samples == 2 and again.corrupt_bytes == len(b"garbage, not a segment")
    again.close()
