"""A sweep's plan on disk, ``<outbox root>/sweeps/<ID>.json``: what ``--resume ID`` needs to
run the rest (the grid, the command, the job's kind and unit). Which runs are done is not
kept here: the store says (the jobs labelled ``sweep=<ID>``)."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from wattline.config import ConfigError
from wattline.sweep.grid import Param

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,80}")


@dataclass
class Plan:
    """Everything a sweep runs, the same on resume."""

    sweep_id: str
    params: list[Param]
    command: list[str]
    repeat: int = 3
    name: str = "sweep"
    kind: str = "other"
    units: str = "units"
    labels: dict[str, str] = field(default_factory=dict)
    saturated_after_s: float | None = None
    units_from_stdout: str | None = None


def new_id(name: str) -> str:
    """A fresh sweep id: the name, the time, a random part."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40] or "sweep"
    return f"{stem}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:4]}"


def plan_path(outbox_root: Path, sweep_id: str) -> Path:
    if not _ID.fullmatch(sweep_id):
        raise ConfigError(f"sweep id {sweep_id[:100]!r}: letters, digits, '_', '.', '-' only")
    return outbox_root / "sweeps" / f"{sweep_id}.json"


def save(plan: Plan, outbox_root: Path) -> None:
    path = plan_path(outbox_root, plan.sweep_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(plan), indent=1))
    os.replace(tmp, path)


def latency_path(outbox_root: Path, sweep_id: str) -> Path:
    """Where the runs' latencies are kept (job id -> seconds): no job event carries them, and a
    resumed sweep reuses runs whose latency only its first process saw."""
    return plan_path(outbox_root, sweep_id).with_suffix(".latency.json")


def load_latency(outbox_root: Path, sweep_id: str) -> dict[str, float]:
    """The latencies kept so far ({} when none, or the file is unreadable: latency is shown, not relied on)."""
    try:
        data = json.loads(latency_path(outbox_root, sweep_id).read_text())
        return {str(k): float(v) for k, v in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def keep_latency(outbox_root: Path, sweep_id: str, job_id: str, seconds: float) -> None:
    """Add one run's latency to the kept ones (one process writes them: the sweep's)."""
    path = latency_path(outbox_root, sweep_id)
    kept = {**load_latency(outbox_root, sweep_id), job_id: seconds}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(kept))
    os.replace(tmp, path)


def load(outbox_root: Path, sweep_id: str) -> Plan:
    """The plan of ``sweep_id``; ConfigError (one line) when this host has none."""
    path = plan_path(outbox_root, sweep_id)
    try:
        data = json.loads(path.read_text())
        data["params"] = [Param(p["name"], tuple(p["values"])) for p in data["params"]]
        return Plan(**data)
    except FileNotFoundError:
        raise ConfigError(f"--resume {sweep_id}: no sweep of that id was started on this host ({path})") from None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"--resume {sweep_id}: its plan {path} cannot be read: {exc}") from None
