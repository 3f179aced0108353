"""Run a sweep's plan: each (point, run) of :func:`grid.schedule` is a job run by ``wattline
run``'s machinery (:func:`job_command.run_in_job`, its report by :func:`job_command.read_report`),
labelled ``sweep=<ID>``, ``param.<name>=<value>`` and ``sweep.run=<k>``; the settings
wattline applies itself are set before each job (:class:`tuning.records.Applied`).

A run whose job closed with exit 0 is done: on ``--resume`` it is read, not run again. A
command killed by a signal (Ctrl-C, SIGTERM: 128+N) stops the sweep; another failure is
that run's result ("failed (exit N)").
"""

from __future__ import annotations

import dataclasses
import functools
import signal
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import FrameType

from wattline.accounting.uncertainty import Side
from wattline.agent.tuning.records import Applied
from wattline.jobs.jobs_view import all_views
from wattline.jobs.wrappers.job_command import Job, read_report, run_in_job
from wattline.jobs.wrappers.run import RunRequest
from wattline.reports.build import build_complete_report
from wattline.reports.model import Report, ReportSettings
from wattline.reports.windows import estimate_fraction
from wattline.stores.reader import Reader
from wattline.sweep.analysis import RunFigures
from wattline.sweep.grid import Point, point_command, point_labels, points, schedule
from wattline.sweep.plan import Plan

SWEEP_LABEL = "sweep"
RUN_LABEL = "sweep.run"
#: Exit statuses of a command ended by SIGHUP, SIGINT, SIGTERM: the sweep stops there.
STOPPING = (128 + signal.SIGHUP, 128 + signal.SIGINT, 128 + signal.SIGTERM)


class Interrupted(Exception):
    """The sweep was stopped (a signal): ``status`` is the exit status it ends with."""

    def __init__(self, status: int) -> None:
        super().__init__(f"interrupted (exit {status})")
        self.status = status


def window_latency(report: Report, latencies: list[tuple[float, int]]) -> float | None:
    """The median of the latencies (seconds, time ns) reported in the saturated window, saturation
    to end: the ramp's requests are not what the setting serves at its plateau."""
    inside = [s for s, t in latencies if report.saturated_from_ns <= t <= report.end_ns]
    return statistics.median(inside) if inside else None


def _keep(kept: list[tuple[float, int]], seconds: float, time_ns: int) -> None:
    kept.append((seconds, time_ns))


def figures_of(
    report: Report, point: Point, run: int, status: int, latencies: list[tuple[float, int]] | None = None
) -> RunFigures:
    """A run's figures from its job's report (and the latencies its command reported)."""
    f = report.figures
    problem = ""
    if status != 0:
        problem = f"failed (exit {status})"
    elif not report.energy_data:
        problem = "no energy samples"
    elif not f.j_per_unit:
        problem = "no units counted"
    return RunFigures(
        point, run, report.job.job_id, status,
        j_per_unit=f.j_per_unit,
        throughput_per_s=f.throughput_per_s,
        throughput_per_instance_h=f.throughput_per_instance_hour,
        mean_power_w=f.mean_power_w,
        power_per_instance_w=f.power_per_instance_w,
        side=Side.of(report.saturated_window.bound, f.window.energy_j),
        estimate_fraction=estimate_fraction(report.saturated_window),
        saturated=report.saturated,
        problem=problem,
        latency_s=window_latency(report, latencies or []),
    )  # fmt: skip


def done_runs(
    reader: Reader, plan: Plan, settings: ReportSettings, latency: Mapping[str, float] | None = None
) -> list[RunFigures]:
    """The runs of the sweep already in the store whose command exited 0, one per (point, run),
    with the latencies kept for them (job id -> seconds)."""
    grid = points(plan.params)
    found: dict[tuple[Point, int], RunFigures] = {}
    for view in all_views(reader):
        labels = view.labels
        if labels.get(SWEEP_LABEL) != plan.sweep_id or view.problems or not view.closed:
            continue
        if view.end_reason or view.exit_code != 0 or not labels.get(RUN_LABEL, "").isdigit():
            continue
        point = tuple((p.name, labels.get(f"param.{p.name}", "")) for p in plan.params)
        run = int(labels[RUN_LABEL])
        if point not in grid or run >= plan.repeat or (point, run) in found:
            continue
        figures = figures_of(build_complete_report(reader, view.job_id, settings, closed=True), point, run, 0)
        found[(point, run)] = dataclasses.replace(figures, latency_s=(latency or {}).get(view.job_id))
    return list(found.values())


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP stop the sweep as Ctrl-C does (between jobs; during one, the job's
    command gets them and the sweep stops when it ends), so the settings are restored."""

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(128 + signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_plan(
    plan: Plan,
    template: Job,
    applied: Applied,
    settings: ReportSettings,
    done: list[RunFigures],
    say: Callable[[str], None],
    keep_latency: Callable[[str, float], None] | None = None,
) -> list[RunFigures]:
    """Run what ``done`` lacks; every run's figures (``done``'s first). Raises
    :class:`Interrupted` when a command was stopped by a signal (or the sweep was)."""
    results = list(done)
    have = {(r.point, r.run) for r in done}
    todo = [(p, r) for p, r in schedule(points(plan.params), plan.repeat) if (p, r) not in have]
    index = {p: i for i, p in enumerate(points(plan.params))}
    for n, (point, run) in enumerate(todo, 1):
        applied.set(dict(point))
        job_id = f"{plan.sweep_id}-{index[point]}.{run}-{uuid.uuid4().hex[:4]}"
        labels = {**plan.labels, SWEEP_LABEL: plan.sweep_id, RUN_LABEL: str(run), **point_labels(point)}
        spec = dataclasses.replace(template.request.spec, job_id=job_id, labels=labels)
        latencies: list[tuple[float, int]] = []
        request = RunRequest(
            point_command(plan.command, point), spec, plan.saturated_after_s, plan.units_from_stdout,
            stdout_to_stderr=template.request.stdout_to_stderr,
            on_latency=functools.partial(_keep, latencies),
        )  # fmt: skip
        job = dataclasses.replace(template, request=request)
        shown = " ".join(f"{k}={v}" for k, v in point)
        say(f"wattline sweep {plan.sweep_id}: run {n}/{len(todo)}: {shown} (repeat {run + 1}/{plan.repeat})")
        started = time.monotonic()
        status, elsewhere = run_in_job(job, settings)
        if status in STOPPING:
            raise Interrupted(status)
        if elsewhere:
            raise RuntimeError(f"job {job_id}: its report cannot be read here (give the collector's store: --store)")
        results.append(figures_of(read_report(job, settings), point, run, status, latencies))
        if keep_latency is not None and results[-1].latency_s is not None:
            keep_latency(job_id, results[-1].latency_s)
        say(f"wattline sweep {plan.sweep_id}: {shown}: exit {status} after {time.monotonic() - started:.1f} s")
    return results
