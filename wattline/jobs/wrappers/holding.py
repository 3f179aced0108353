"""A wrapper's hold on the job it opened (:mod:`wattline.agent.holders.registry`): recorded once its open
event is sent, released once its close is, so that a process finding it dead in between
ends the job where it died."""

from __future__ import annotations

from pathlib import Path

from wattline import wire
from wattline.agent.holders.registry import ALIVE_S, Holding, hold
from wattline.jobs.events import EventBuilder
from wattline.jobs.wrappers.session import EventSink


def hold_job(sink: EventSink, builder: EventBuilder, opened: wire.pb.JobEvent) -> Holding | None:
    """Record the hold of the job ``opened`` opened through ``sink``; None where the sink keeps
    no holder records (a job joined to ``wattline run``, a sink of the caller's own)."""
    root: Path | None = getattr(sink, "holders_root", None)
    kind: str = getattr(sink, "holder_sink", "")
    host: wire.pb.Host | None = getattr(sink, "host", None)
    if root is None or not kind or host is None:
        return None
    renews = getattr(sink, "renew", None)  # an embedded session renews it as its samples are stored
    holding = hold(root, opened, host, kind, builder.reserved_seq, ALIVE_S if renews is None else None)
    if holding is not None and renews is not None:
        renews(holding)
    return holding


def ended_ids(sink: EventSink) -> list[str]:
    """The jobs of dead holders ``sink`` ended when it started."""
    return [record.job_id for record in getattr(sink, "ended", [])]
