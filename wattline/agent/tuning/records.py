"""Restore records: the settings a process changed, kept on disk until it put them back.

``<outbox root>/restore/r<pid>-<random>.json`` holds the changing process's identity (pid,
start time, boot id: :mod:`wattline.agent.holders.registry`) and, per setting, what its kind's
``restore`` needs. It is written before the first change and removed once every setting is
back. A wattline process that finds a record whose process is gone (:func:`restore_dead`:
every ``wattline`` command, the agent at start and on each pass over its outbox) restores
it; a record is claimed by a rename first (``<record>.<claimer pid>-<start ticks>.claimed``),
so two processes never restore one record at once, and a claim whose claimer died before
it finished is claimed again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from wattline.agent.holders import registry as holders
from wattline.agent.tuning import Knob, cpufreq, gpu_power

log = logging.getLogger(__name__)

#: kind -> the function that puts a saved state back
RESTORERS: dict[str, Callable[[dict[str, Any]], None]] = {
    cpufreq.KIND: cpufreq.restore,
    gpu_power.KIND: gpu_power.restore,
}
#: The ``--param`` names wattline applies itself.
APPLIED = frozenset({gpu_power.PARAM, cpufreq.MAX_FREQ, cpufreq.GOVERNOR})
_NAME = re.compile(r"r[0-9]+-[0-9a-f]{12}\.json")
_CLAIMED = re.compile(r"(r[0-9]+-[0-9a-f]{12}\.json)\.([0-9]+)-([0-9]+)\.claimed")


def knob(param: str, sysfs_root: Path) -> Knob | None:
    """The setting ``param`` drives, or None for a parameter only the command takes."""
    if param == gpu_power.PARAM:
        return gpu_power.GpuPowerLimit()
    if param in (cpufreq.MAX_FREQ, cpufreq.GOVERNOR):
        return cpufreq.CpuFreq(param, sysfs_root)
    return None


def restore_dir(outbox_root: Path) -> Path:
    return outbox_root / "restore"


class Applied:
    """Settings this process changes, recorded before the first change; :meth:`restore` puts
    them back and removes the record (a failure keeps it, for the next process to retry)."""

    def __init__(self, directory: Path, knobs: Sequence[Knob], what: str) -> None:
        self.knobs = list(knobs)
        self.path: Path | None = None
        self.current: dict[str, str] = {}
        if not self.knobs:
            return
        me = holders.identity()
        record = {
            "what": what,
            "owner": asdict(me) if me is not None else None,
            "settings": [{"kind": k.kind, "param": k.param, "state": k.saved()} for k in self.knobs],
        }
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"r{os.getpid()}-{uuid.uuid4().hex[:12]}.json"
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.record = record

    def set(self, point: Mapping[str, str]) -> None:
        """Apply the point's values of the settings (those already at that value stay)."""
        for k in self.knobs:
            value = point[k.param]
            if self.current.get(k.param) != value:
                self.current.pop(k.param, None)  # unknown until the write succeeded
                k.apply(value)
                self.current[k.param] = value

    def restore(self) -> list[str]:
        """Put every setting back; the lines of what failed (the record then stays)."""
        if self.path is None:
            return []
        failed = _restore(self.record)
        if not failed:
            self.path.unlink(missing_ok=True)
            self.path = None
        self.current.clear()
        return failed


def _restore(record: Mapping[str, Any]) -> list[str]:
    failed = []
    for setting in record.get("settings", []):
        try:
            RESTORERS[setting["kind"]](setting["state"])
        except Exception as exc:  # a setting that cannot go back must not keep the others from it
            failed.append(f"{setting.get('param')}: {' '.join(str(exc).split()) or type(exc).__name__}")
    return failed


def _claimer_gone(match: re.Match[str]) -> bool:
    """Whether the process a ``.claimed`` name names (pid, start ticks) no longer runs."""
    claimer = holders.identity(int(match.group(2)))
    return claimer is None or claimer.start_ticks != int(match.group(3))


def _claimable(directory: Path) -> list[tuple[Path, str]]:
    """(file, record name) of the records to look at: unclaimed, or claimed by a process that is gone."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    found = []
    for path in entries:
        if _NAME.fullmatch(path.name):
            found.append((path, path.name))
        elif (m := _CLAIMED.fullmatch(path.name)) and _claimer_gone(m):
            found.append((path, m.group(1)))
    return found


def restore_dead(directory: Path, say: Callable[[str], None] | None = None) -> int:
    """Restore the records of processes that are gone (and those whose restorer died midway);
    how many were restored. Never raises."""
    done = 0
    me = holders.identity()
    mark = f"{os.getpid()}-{me.start_ticks if me is not None else 0}"
    for path, name in _claimable(directory):
        try:
            record = json.loads(path.read_text())
            owner = holders.Identity(**record["owner"]) if record.get("owner") else None
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if owner is None or holders.gone(owner) is not True:
            continue
        claimed = directory / f"{name}.{mark}.claimed"
        try:
            os.rename(path, claimed)  # of two claimers, the second finds the file gone
        except OSError:
            continue
        failed = _restore(record)
        params = ", ".join(str(s.get("param")) for s in record.get("settings", []))
        if failed:
            os.replace(claimed, directory / name)  # for the next process to retry
            line = f"could not restore what {record.get('what')} (pid {owner.pid}, gone) changed: {'; '.join(failed)}"
        else:
            claimed.unlink(missing_ok=True)
            done += 1
            line = f"restored {params} as they were before {record.get('what')} (pid {owner.pid}, gone)"
        log.warning(line)
        if say is not None:
            with contextlib.suppress(Exception):
                say(line)
    return done
