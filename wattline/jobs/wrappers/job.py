"""The Python job API: tag a job window, count its work units, mark saturation.

::

    from wattline import Job, job_window

    with Job("bert-large", kind="training", units="sequences") as job:
        for batch in loader:
            train_step(batch)
            job.add_units(len(batch))
    report = job.report()  # the figures `wattline report` prints; report.to_dict() is its JSON

    @job_window("layoutlm", kind="inference", units="inferences")
    def serve(job): ...

Inside a process started by ``wattline run`` the API joins that job (through
``$WATTLINE_JOB_ID`` / ``$WATTLINE_EVENTS``) instead of opening a second one. Otherwise
it opens its own job: through ``collector=`` when a host agent runs, or embedded (in-
process sampling into the local SQLite store) when none is given; an opened job renews its
lease with a heartbeat until it closes (:mod:`.heartbeat`).
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from wattline.agent.holders.event_lines import check_count, check_phase
from wattline.agent.holders.registry import Holding
from wattline.agent.settings import AgentSettings
from wattline.config import build
from wattline.jobs.events import (
    SATURATED,
    EventBuilder,
    JobSpec,
    UnitAccumulator,
    append_event_line,
)
from wattline.jobs.job_env import ENV_EVENTS, ENV_JOB_ID, with_owner
from wattline.jobs.wrappers.heartbeat import Heartbeat
from wattline.jobs.wrappers.holding import ended_ids, hold_job
from wattline.jobs.wrappers.session import CollectorSink, EventSink, ParentSink
from wattline.jobs.wrappers.sync import Sync, SyncSpec
from wattline.jobs.wrappers.usage import JobUse

if TYPE_CHECKING:
    from wattline.jobs.wrappers.job_report import JobReport
    from wattline.reports.model import ReportSettings
    from wattline.stores.reader import Reader

P = ParamSpec("P")
R = TypeVar("R")

#: Environment variables from which a multi-host job id is taken when none is given.
JOB_ID_ENV = ("WATTLINE_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")


def default_job_id(name: str, env: Mapping[str, str] | None = None) -> str:
    """The job id shared by every host of a launcher's job, else a fresh one."""
    env = os.environ if env is None else env
    for var in JOB_ID_ENV:
        value = env.get(var)
        if value and value != "none":
            return value if var == "WATTLINE_JOB_ID" else f"{var.split('_')[0].lower()}-{value}"
    return f"{name}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


class Job:
    """A job window on this host; use as a context manager."""

    def __init__(
        self,
        name: str,
        *,
        job_id: str | None = None,
        kind: str = "other",
        units: str = "units",
        labels: Mapping[str, str] | None = None,
        devices: list[str] | None = None,
        collector: list[str] | str | None = None,
        sink: EventSink | None = None,
        store: str | None = None,
        sync: SyncSpec = None,
    ) -> None:
        """``store``: the store URL embedded sampling writes to (default ``$WATTLINE_STORE``
        or the local SQLite file) and :meth:`report` reads; with ``collector=``, the URL of
        the collector's store, for :meth:`report`. ``sync``: "torch" or a callable that waits
        for queued accelerator work, called before the window opens, at :meth:`mark_saturated`
        and before it closes (:mod:`.sync`)."""
        if kind not in {"inference", "training", "other"}:
            raise ValueError(f"kind must be inference, training or other, not {kind!r}")
        self.joined = bool(os.environ.get(ENV_EVENTS) and os.environ.get(ENV_JOB_ID))
        resolved_id = os.environ[ENV_JOB_ID] if self.joined else (job_id or default_job_id(name))
        self.spec = JobSpec(resolved_id, name, kind, units, with_owner(labels), list(devices or []))
        self._collector = [collector] if isinstance(collector, str) else collector
        self._sink = sink
        self._sink_given = sink is not None
        self._builder = EventBuilder(self.spec)
        self._units: UnitAccumulator | None = None
        self._heartbeat: Heartbeat | None = None
        self._use: JobUse | None = None
        self._holding: Holding | None = None
        self.exit_code: int | None = None
        self._store = store
        self._sync = Sync(sync)
        self._batch_interval_s = AgentSettings().batch_interval

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def units_total(self) -> float:
        return self._units.total if self._units else 0.0

    def __enter__(self) -> Job:
        self._sync()
        if self._sink is None:
            if self.joined:
                self._sink = ParentSink(Path(os.environ[ENV_EVENTS]))
            elif self._collector:
                settings = build(AgentSettings, "agent", {}, flags={"collectors": self._collector})
                self._batch_interval_s = settings.batch_interval
                self._sink = CollectorSink(settings.validate())
            else:
                from wattline.jobs.wrappers.embedded import embedded_session

                self._sink = embedded_session(self._store)
        self._units = UnitAccumulator(self._builder, self._sink.send)
        if not self.joined:  # a joined job's lease is renewed by its `wattline run`
            opened = self._builder.open(self._sink.edge_tick())
            self._sink.send([opened])
            self._holding = hold_job(self._sink, self._builder, opened)
            self._heartbeat = Heartbeat(self._builder, self._sink.send).start()
            discovery = getattr(self._sink, "discovery", None)  # the calling process and its children:
            self._use = JobUse(self._builder, self._sink.send, [os.getpid()], discovery=discovery).start()
        return self

    def add_units(self, count: float = 1) -> None:
        """Count ``count`` more completed work units (inferences, sequences, tokens); 0 says
        "counting starts now" (the units before it are not spread past now). ValueError unless
        the count is finite and >= 0."""
        if self._units is None:
            raise RuntimeError("add_units() outside the job's with-block")
        self._units.add(count)

    def add_latency(self, seconds: float) -> None:
        """One request's latency, now: inside ``wattline run`` / ``wattline sweep`` a ``latency``
        events-file line (the sweep's Pareto front weighs it); no job event carries it, so a
        job of its own ignores it. ValueError unless ``seconds`` is finite and >= 0."""
        check_count("latency", float(seconds))
        if self.joined:
            append_event_line(f"latency {float(seconds)!r} {time.time()!r}")

    def mark_saturated(self) -> None:
        """Declare that the hardware is saturated from now on (overrides detection)."""
        self._sync()
        self.phase(SATURATED)

    def phase(self, name: str) -> None:
        """Mark the start of a named phase; ValueError for a name the events file could not
        carry (:func:`~wattline.agent.holders.event_lines.check_phase`), whichever way the job's events go."""
        check_phase(name)
        if self._sink is None or self._units is None:
            raise RuntimeError("phase() outside the job's with-block")
        self._units.flush()
        self._sink.send([self._builder.phase(name)])

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._sink is not None and self._units is not None
        self._sync.before_close()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._use is not None:
            self._use.stop()
        self._units.flush()
        self.exit_code = 0 if exc_type is None else (130 if exc_type is KeyboardInterrupt else 1)
        if not self.joined:
            scope = self._use.scope if self._use else ()
            close_ns = self._sink.edge_tick() or time.time_ns()
            if self._use is not None:
                self._use.finish(close_ns)
            self._sink.send([self._builder.close(self.exit_code, close_ns, use_scope=scope)])
        if self._holding is not None:
            self._holding.release()
        self._sink.close()
        if not self.joined and not self._collector and not self._sink_given:  # embedded: as `wattline run`
            from wattline.reports.summaries.summary import (
                record_local_summary,  # summaries read reports: loaded only here
            )

            record_local_summary(self._store, self.job_id, changed=ended_ids(self._sink))

    def report(self, settings: ReportSettings | None = None, reader: Reader | None = None) -> JobReport:
        """The job's report after its window: the figures ``wattline report`` prints (its
        ``to_dict()`` is the report JSON), complete as ``wattline run`` waits for completeness
        (up to two batch intervals + 3 s for the last samples; else its notes say what lacks).

        Reads ``reader`` when given, else the store: the embedded one, or ``store=`` (a job
        sent to a collector needs it: the collector's store). RuntimeError inside the window,
        for a job joined to ``wattline run`` (which prints the report) and without a store.
        """
        from wattline.jobs.wrappers.job_report import JobReport
        from wattline.reports.build import build_complete_report, report_wait_s
        from wattline.reports.summaries.store import default_store_url
        from wattline.stores.factory import open_store

        if self.exit_code is None:
            raise RuntimeError("report() comes after the job's with-block")
        if self.joined:
            raise RuntimeError("this job belongs to `wattline run`, which prints its report")
        wait_s = report_wait_s(self._batch_interval_s)
        if reader is not None:
            return JobReport.of(build_complete_report(reader, self.job_id, settings, wait_s, closed=True))
        if self._store is None and (self._collector or self._sink_given):
            raise RuntimeError("report(): give Job(store=...) the URL of the store the job's events went to")
        store = open_store(self._store or default_store_url())
        try:
            return JobReport.of(build_complete_report(store, self.job_id, settings, wait_s, closed=True))  # type: ignore[arg-type]
        finally:
            store.close()


def job_window(name: str, **kwargs: Any) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Decorator form: the function runs inside ``Job(name, **kwargs)`` and receives it as ``job=``."""

    def wrap(fn: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(fn)
        def inner(*args: Any, **kw: Any) -> R:
            with Job(name, **kwargs) as job:
                return fn(*args, job=job, **kw)

        return inner

    return wrap
