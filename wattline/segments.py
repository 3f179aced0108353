"""Append-only segment files of CRC-checked records: the agent's spool and outbox
(:mod:`wattline.agent.spool.format`) and the collector's replay log
(:mod:`wattline.collector.replay`) lay their data out so.

A segment is an 8-byte header (its kind's magic, e.g. ``WLSPOOL1``) followed by records::

    >I payload length | >I CRC32 of (written_ns, payload) | >q written_ns | payload

A torn or corrupt record ends a segment's valid data (:func:`scan`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from pathlib import Path

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIq")
#: A record longer than this is corruption, not data (a batch is at most a few MB).
MAX_RECORD_BYTES = 64 << 20
#: The length of a segment's magic header.
MAGIC_BYTES = 8

#: One record found in a segment's bytes: (offset, end, written_ns, payload).
RawRecord = tuple[int, int, int, bytes]


def segment_name(number: int, suffix: str = ".wls") -> str:
    return f"seg-{number:016d}{suffix}"


def segment_numbers(directory: Path, suffix: str = ".wls") -> list[int]:
    """Numbers of the segment files in ``directory``, ascending."""
    numbers = []
    for path in directory.glob(f"seg-*{suffix}"):
        digits = path.name[4 : -len(suffix)]
        if digits.isdigit():
            numbers.append(int(digits))
    return sorted(numbers)


def encode_record(payload: bytes, written_ns: int) -> bytes:
    """Header + payload of one record."""
    stamp = struct.pack(">q", written_ns)
    return HEADER.pack(len(payload), zlib.crc32(stamp + payload), written_ns) + payload


def scan(data: bytes, offset: int = MAGIC_BYTES) -> tuple[list[RawRecord], int]:
    """Valid records of a segment's bytes from ``offset``, and the offset where valid data ends
    (the first torn or corrupt record)."""
    records = []
    while offset + HEADER.size <= len(data):
        length, crc, written_ns = HEADER.unpack_from(data, offset)
        body = offset + HEADER.size
        if length == 0 or length > MAX_RECORD_BYTES or body + length > len(data):
            break
        payload = data[body : body + length]
        if zlib.crc32(data[offset + 8 : body] + payload) != crc:
            break
        records.append((offset, body + length, written_ns, payload))
        offset = body + length
    return records, offset


def read_range(path: Path, start: int, end: int) -> bytes:
    """The bytes ``[start, end)`` of a segment file (OSError as raised)."""
    with path.open("rb") as fh:
        fh.seek(start)
        return fh.read(end - start)


def write_record(fd: int, record: bytes, size: int) -> None:
    """Append ``record`` to a segment now ``size`` bytes long; on failure the file is cut back to
    ``size`` (no torn record behind us) and the OSError raised."""
    done = 0
    try:
        while done < len(record):
            done += os.write(fd, record[done:])
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise


def sync_files(directory: Path, fds: list[int], sync_dir: bool) -> None:
    """fsync then close each of ``fds``, and fsync ``directory`` if ``sync_dir``; failures logged."""
    for fd in fds:
        try:
            os.fsync(fd)
        except OSError as exc:
            log.error("%s: fsync failed: %s", directory, exc.strerror)
        finally:
            os.close(fd)
    if sync_dir:
        try:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            log.error("%s: directory fsync failed: %s", directory, exc.strerror)
