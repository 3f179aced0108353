"""What earlier processes left in a disk spool directory, read back at start-up.

Segments are read in order from the cursor. A record whose header, length or CRC is wrong
(torn by a crash mid-write, or the zeros a power cut can leave at the end of a file) ends
its segment: the file is truncated there and the discarded bytes are logged. Segments
before the cursor (acknowledged before the last stop) and empty ones are deleted.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError

from wattline import wire
from wattline.agent.spool.format import MAGIC, parse_cursor
from wattline.agent.spool.runs import Fragment
from wattline.segments import scan, segment_name, segment_numbers

log = logging.getLogger(__name__)


@dataclass
class Leftovers:
    """A spool directory as found: the cursor, the segments kept, their valid fragments."""

    cursor: tuple[int, int] = (0, 0)
    #: The last acknowledged (stream, seq), ("", 0) if none.
    cursor_stream: tuple[str, int] = ("", 0)
    #: Segment number -> bytes of valid data, ascending.
    segments: dict[int, int] = field(default_factory=dict)
    highest: int = 0  #: highest segment number seen, deleted ones included
    fragments: list[Fragment] = field(default_factory=list)
    corrupt_bytes: int = 0


def unlink(directory: Path, path: Path) -> None:
    """Delete ``path``; a failure other than "already gone" is one warning line."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("spool %s: cannot delete %s: %s", directory, path.name, exc.strerror)


def read_cursor(directory: Path, found: Leftovers) -> None:
    try:
        text = (directory / "cursor").read_text()
    except FileNotFoundError:
        return
    except (OSError, UnicodeError) as exc:
        log.warning("spool %s: cursor unreadable (%s); replaying every segment", directory, exc)
        return
    parsed = parse_cursor(text)
    if parsed is None:
        log.warning("spool %s: cursor corrupt; replaying every segment", directory)
        return
    found.cursor, found.cursor_stream = parsed


def recover(directory: Path) -> Leftovers:
    """Read the cursor and every segment from it; truncate torn ends, delete what is done."""
    found = Leftovers()
    read_cursor(directory, found)
    for number in segment_numbers(directory):
        found.highest = max(found.highest, number)
        path = directory / segment_name(number)
        if number < found.cursor[0]:
            unlink(directory, path)  # acknowledged before the last stop
            continue
        data = path.read_bytes()
        if len(data) < len(MAGIC) and MAGIC.startswith(data):
            unlink(directory, path)  # created, killed before its header was complete: nothing in it
            continue
        if not data.startswith(MAGIC):
            log.warning("spool %s: %s has no spool header (%d bytes); discarded", directory, path.name, len(data))
            found.corrupt_bytes += len(data)
            unlink(directory, path)
            continue
        start = max(len(MAGIC), found.cursor[1]) if number == found.cursor[0] else len(MAGIC)
        records, end = scan(data, min(start, len(data)))  # past the end: a power cut shortened a done file
        if end < len(data):
            log.warning(
                "spool %s: %s: torn or corrupt record at offset %d; %d bytes discarded (truncated)",
                directory,
                path.name,
                end,
                len(data) - end,
            )
            found.corrupt_bytes += len(data) - end
            os.truncate(path, end)
        found.segments[number] = end
        for offset, rec_end, written_ns, payload in records:
            try:
                fragment = wire.Batch.FromString(payload)
            except DecodeError:
                log.warning("spool %s: %s: undecodable record at offset %d skipped", directory, path.name, offset)
                found.corrupt_bytes += rec_end - offset
                continue
            found.fragments.append(
                Fragment(
                    number,
                    offset,
                    rec_end,
                    written_ns,
                    fragment.stream_id,
                    len(fragment.samples),
                    len(fragment.job_events),
                )
            )
    return found
