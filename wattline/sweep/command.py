"""``wattline sweep``'s body: check everything before anything changes, keep the plan, set
and always restore the settings wattline applies, run the plan, then the answer.

Nothing is changed on the host before every value has been checked and every setting found
permitted (:class:`wattline.agent.tuning.NotPermitted`: one line, exit 2). The settings are
restored when the sweep ends, fails or is interrupted; after a crash, by the next wattline
process (:mod:`wattline.agent.tuning.records`).

A run whose command fails (exits non-zero, or cannot start) does not stop the sweep: the
other runs still run, the settings are restored as always and the answer is shown (the
failed point without figures, or with those of its other runs); then one line on stderr
names each failed point, its exit statuses and how many of its runs failed, and the sweep
exits 1 (:func:`failed_line`).
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from wattline.agent.spool.outbox import outbox_root
from wattline.agent.tuning import Knob
from wattline.agent.tuning.records import APPLIED, Applied, knob, restore_dead, restore_dir
from wattline.config import ConfigError
from wattline.jobs.wrappers.job_command import Job, say
from wattline.jobs.wrappers.run import check_command
from wattline.reports.model import ReportSettings
from wattline.sweep import grid, plan, runner
from wattline.sweep.analysis import RunFigures, analyse
from wattline.sweep.output import answer_json, csv_text, print_answer


@dataclass
class Outputs:
    """What to show and write once the sweep has run."""

    sla: float | None = None
    as_json: bool = False
    plot: Path | None = None
    html: Path | None = None
    csv: Path | None = None


def prepare(the_plan: plan.Plan, sysfs_root: Path) -> list[Knob]:
    """Check the plan against the host; the settings wattline will apply. Changes nothing."""
    grid.check_command(the_plan.command, the_plan.params, set(APPLIED))
    if the_plan.repeat < 1:
        raise ConfigError(f"option --repeat: {the_plan.repeat} is below 1")
    first = grid.points(the_plan.params)[0]
    check_command(grid.point_command(the_plan.command, first))
    knobs: list[Knob] = []
    for p in the_plan.params:
        k = knob(p.name, sysfs_root)
        if k is not None:
            k.check(p.values)
            knobs.append(k)
    return knobs


def run_sweep(the_plan: plan.Plan, template: Job, settings: ReportSettings, sysfs_root: Path, out: Outputs) -> int:
    """Run (or resume) the sweep and show its answer; the exit status."""
    root = outbox_root(template.settings.outbox_dir)
    restore_dead(restore_dir(root), lambda line: say(f"wattline: {line}"))
    knobs = prepare(the_plan, sysfs_root)
    if template.collectors and not template.store.named:
        raise ConfigError("wattline sweep --collector: give the collector's store (--store) to read the runs' reports")
    done: list[RunFigures] = []
    if (plan.plan_path(root, the_plan.sweep_id)).exists():
        with template.store.open_reader() as reader:
            done = runner.done_runs(reader, the_plan, settings, plan.load_latency(root, the_plan.sweep_id))
        say(f"wattline sweep {the_plan.sweep_id}: {len(done)} runs done, reused")
    plan.save(the_plan, root)
    applied = Applied(restore_dir(root), knobs, f"sweep {the_plan.sweep_id}")
    try:
        with runner.signals_interrupt():
            keep = functools.partial(plan.keep_latency, root, the_plan.sweep_id)
            runs = runner.run_plan(the_plan, template, applied, settings, done, say, keep)
    except (runner.Interrupted, KeyboardInterrupt) as exc:
        say(
            f"wattline sweep {the_plan.sweep_id}: interrupted; resume with: wattline sweep --resume {the_plan.sweep_id}"
        )
        return exc.status if isinstance(exc, runner.Interrupted) else 130
    finally:
        for line in applied.restore():
            say(f"wattline: error: could not restore {line} (kept for the next wattline process to retry)")
    answer = analyse(runs, grid.points(the_plan.params), out.sla, settings.price_per_instance_hour)
    data = answer_json(the_plan, answer, out.sla, settings.price_per_instance_hour)
    write_outputs(data, out)
    if out.as_json:
        print(json.dumps(data, indent=2), flush=True)
    else:
        print_answer(data, Console(file=sys.stdout, width=max(Console().width, 160)))
    line = failed_line(the_plan, runs)
    if line:
        say(line)
        return 1
    return 0


def failed_line(the_plan: plan.Plan, runs: list[RunFigures]) -> str:
    """One line naming each point with a run whose command failed (in the grid's order), its
    exit statuses and how many of its runs failed; "" when every command exited 0."""
    parts = []
    for point in grid.points(the_plan.params):
        mine = [r for r in runs if r.point == point]
        bad = [r for r in mine if r.status != 0]
        if bad:
            statuses = ", ".join(str(s) for s in sorted({r.status for r in bad}))
            parts.append(f"{grid.point_text(point)} (exit {statuses} in {len(bad)} of {len(mine)} runs)")
    if not parts:
        return ""
    what = "a point failed" if len(parts) == 1 else f"{len(parts)} points failed"
    others = "the other runs ran; " if any(r.status == 0 for r in runs) else ""
    return (
        f"wattline sweep {the_plan.sweep_id}: error: {what}: {'; '.join(parts)}; "
        f"{others}run the failed ones again with: wattline sweep --resume {the_plan.sweep_id}"
    )


def write_outputs(data: dict[str, Any], out: Outputs) -> None:
    """--csv, --plot, --html (each says where it wrote, on stderr)."""
    if out.csv is not None:
        _write(out.csv, lambda p: p.write_text(csv_text(data)))
    if out.plot is None and out.html is None:
        return
    from wattline.reports.output import plot as plotting
    from wattline.sweep.figure import plot_sweep, sweep_page

    if out.plot is not None:
        _write(out.plot, lambda p: plotting.save(plot_sweep(data), p))
    if out.html is not None:
        page = sweep_page(data, plotting.svg_text(plot_sweep(data)))
        _write(out.html, lambda p: p.write_text(page, encoding="utf-8"))


def _write(path: Path, write: Any) -> None:
    try:
        write(path)
    except OSError as exc:
        raise ConfigError(f"cannot write {str(path)[:100]!r}: {exc.strerror or exc}") from None
    say(f"wrote {path}")
