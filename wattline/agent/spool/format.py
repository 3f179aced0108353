"""The disk spool's on-disk format: segment files of CRC-checked records, a cursor, a lock.

Layout of a spool directory (``agent.spool_dir``; under systemd ``$STATE_DIRECTORY/spool``)::

    lock                       flock(2)-held by the running agent: one agent per directory
    seg-0000000000000001.wls   segments, numbered in write order
    cursor                     "done up to (segment, offset)": everything before it was
                               acknowledged by a collector or dropped by a bound

A segment is an 8-byte header ``WLSPOOL1`` followed by CRC-checked records
(:mod:`wattline.segments`), and each payload is a serialized :class:`wire.Batch` *fragment*: the stream id, the host,
and the samples (or job events) of one ``add_*`` call, i.e. of one sampler tick. Records
are self-describing: a spool left by another process is replayed under its own stream id
and host.

The cursor is one line ``v1 SEGMENT OFFSET STREAM SEQ CRC32`` (the last acknowledged
stream and seq; ``-`` for none), replaced with ``rename`` as a whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wattline.segments import read_range, scan

if TYPE_CHECKING:  # loaded by the readers: what only writes records (a Slurm hook) never needs protobuf
    from wattline import wire

log = logging.getLogger(__name__)

MAGIC = b"WLSPOOL1"


class SpoolError(RuntimeError):
    """The spool directory cannot be used (locked by another agent, not writable)."""


@dataclass(slots=True)
class Record:
    """One record read back from a segment."""

    offset: int
    end: int
    written_ns: int
    batch: wire.pb.Batch


def read_batch(path: Path, start: int, end: int, records: int) -> wire.pb.Batch | None:
    """The ``records`` records in ``[start, end)`` of a segment merged into one batch, CRCs
    checked again; None (logged) if unreadable or changed on disk."""
    try:
        data = read_range(path, start, end)
    except OSError as exc:
        log.error("spool %s: cannot read %s: %s", path.parent, path.name, exc.strerror)
        return None
    found, valid_end = scan(data, 0)
    if valid_end != len(data) or len(found) != records:
        log.error("spool %s: %s changed on disk at offset %d", path.parent, path.name, start + valid_end)
        return None
    from google.protobuf.message import DecodeError

    from wattline import wire

    batch = wire.Batch()
    try:
        for _offset, _end, _ns, payload in found:
            batch.MergeFromString(payload)
    except DecodeError:
        return None
    return batch


def read_segment(path: Path) -> Iterator[Record]:
    """Every valid record of one segment file, without modifying it (tools and tests)."""
    from google.protobuf.message import DecodeError

    from wattline import wire

    data = path.read_bytes()
    if not data.startswith(MAGIC):
        return
    records, _end = scan(data)
    for offset, end, written_ns, payload in records:
        try:
            batch = wire.Batch.FromString(payload)
        except DecodeError:
            continue
        yield Record(offset, end, written_ns, batch)


def create_segment(path: Path) -> int:
    """A new segment file holding the header, open for appending (SpoolError if it cannot be
    created, OSError if its header cannot be written)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise SpoolError(f"spool directory {path.parent}: cannot create {path.name}: {exc.strerror}") from None
    try:
        os.write(fd, MAGIC)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return fd


def save_cursor(directory: Path, segment: int, offset: int, stream: str, seq: int) -> None:
    """Replace the cursor file (no fsync: a stale cursor only means batches resent); failures logged."""
    body = f"v1 {segment} {offset} {stream or '-'} {seq}"
    tmp = directory / "cursor.tmp"
    try:
        tmp.write_text(f"{body} {zlib.crc32(body.encode()):08x}\n")
        os.replace(tmp, directory / "cursor")
    except OSError as exc:
        log.warning("spool %s: cannot save the cursor: %s", directory, exc.strerror)


def parse_cursor(text: str) -> tuple[tuple[int, int], tuple[str, int]] | None:
    """((segment, offset), (stream, seq)) of a cursor line; None if it is not a valid one."""
    parts = text.split()
    body = " ".join(parts[:-1])
    if len(parts) != 6 or parts[0] != "v1" or f"{zlib.crc32(body.encode()):08x}" != parts[-1]:
        return None
    return (int(parts[1]), int(parts[2])), (parts[3], int(parts[4]))


def take_lock(directory: Path) -> int:
    """Create ``directory`` if needed and hold its ``lock`` (the fd; released when closed).

    Raises SpoolError when another process holds it (naming its pid) or it cannot be made."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise SpoolError(f"spool directory {directory}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise SpoolError(f"spool directory {directory} is in use by another agent (pid {holder})") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
