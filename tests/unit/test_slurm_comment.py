"""The AdminComment of a Slurm job (#45) without a cluster: its form from a report's JSON
(figures written by hand here), and the writer's bounds against a scripted sacctmgr: retried
while slurmdbd does not answer, skipped with one line where no try can succeed, never
blocking its caller. The real cluster: tests/e2e/test_slurm_accounting.py."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from waits import wait_until

from wattline.reports.summaries.slurm_comment import (
    AdminCommentWriter,
    admin_comment,
    node_count,
    parse_comment,
    slurm_id,
)


def report(unit: str = "documents", units: int = 40, gpu_j: float = 300.0) -> dict[str, Any]:
    """A report's JSON as far as the comment reads it: 100 J of warm-up, 900 J saturated."""
    sat = {
        "by_component": [{"component": "cpu_package", "energy_j": 600.0}, {"component": "gpu", "energy_j": gpu_j}],
        "coverage": {"fractions": {"counter": 0.9, "integrated": 0.1, "model": 0.0}, "measured_fraction": 1.0},
    }
    return {
        "job": {
            "id": "4242",
            "unit": unit,
            "closed": True,
            "hosts": ["n1", "n2"],
            "labels": {"cluster": "wl", "nodes": "n[1-2]"},
        },
        "whole_run": {"energy_j": 1000.0, "energy_bound_j": 12.5, "units": units, "j_per_unit": 25.0},
        "warmup": {"by_component": [{"component": "accelerator", "energy_j": 100.0}]},
        "saturated": sat,
        "complete": True,
    }


def test_the_comments_form() -> None:
    text = admin_comment(report())
    assert text == (
        "wattline.energy/3 energy_j=1000.0 bound_j=12.5 j_per_unit=25 unit=documents accel_fraction=0.400 "
        "quality=integrated measured_fraction=1.000 hosts=2 complete=1"
    )
    assert parse_comment(text) == {
        "energy_j": "1000.0",
        "bound_j": "12.5",
        "j_per_unit": "25",
        "unit": "documents",
        "accel_fraction": "0.400",
        "quality": "integrated",
        "measured_fraction": "1.000",
        "hosts": "2",
        "complete": "1",
    }
    assert parse_comment("site note") is None
    assert parse_comment("wattline.energy/4 energy_j=1") is None
    assert len(text) < 200


def test_a_version_1_comment_still_parses() -> None:
    """Jobs written before the renames keep their version 1 comments: their measured_share is
    the measured fraction, their accel_share the accelerators' fraction."""
    v1 = (
        "wattline.energy/1 energy_j=1000.0 bound_j=12.5 accel_share=0.400 quality=integrated "
        "measured_share=0.750 hosts=2 complete=1"
    )
    keys = parse_comment(v1)
    assert keys is not None
    assert keys["measured_fraction"] == "0.750" and "measured_share" not in keys
    assert keys["accel_fraction"] == "0.400" and "accel_share" not in keys
    assert keys["energy_j"] == "1000.0" and keys["complete"] == "1"


def test_a_version_2_comment_still_parses() -> None:
    """Version 2 named the accelerators' fraction accel_share; its measured_fraction stays."""
    v2 = (
        "wattline.energy/2 energy_j=1000.0 bound_j=12.5 accel_share=0.250 quality=counter "
        "measured_fraction=0.750 hosts=1 complete=1"
    )
    keys = parse_comment(v2)
    assert keys is not None
    assert keys["accel_fraction"] == "0.250" and "accel_share" not in keys
    assert keys["measured_fraction"] == "0.750" and keys["hosts"] == "1"


def test_a_unit_name_cannot_break_the_form() -> None:
    """The unit name is the job's own (any string): one word of safe characters, 32 at most."""
    words = admin_comment(report(unit="docs energy_j=1 x" + "y" * 40)).split()
    assert [w.split("=")[0] for w in words[1:]].count("energy_j") == 1
    unit = dict(w.split("=", 1) for w in words[1:])["unit"]
    assert unit == "docs_energy_j_1_x" + "y" * 15


def test_no_units_no_j_per_unit() -> None:
    keys = parse_comment(admin_comment(report(units=0)))
    assert keys is not None and "j_per_unit" not in keys and "unit" not in keys


@pytest.mark.parametrize(
    ("nodelist", "count"),
    [("n[1-2]", 2), ("n[1-2],gpu[01-03,07]", 6), ("login1", 1), ("r[1-2]n[1-3]", 6), ("n1,n2", 2), ("x[a-b]", None)],
)
def test_node_count(nodelist: str, count: int | None) -> None:
    assert node_count(nodelist) == count


def test_a_multi_host_jobs_first_close_waits_for_the_others() -> None:
    """Its report has one host of its two nodes: marked incomplete and held ``partial_wait_s``;
    the report with both, offered then, is the one written (at once)."""
    runner = Sacctmgr(MODIFIED)
    w = writer(runner, partial_wait_s=30.0)
    first = report()
    first["job"]["hosts"] = ["n1"]
    assert parse_comment(admin_comment(first))["complete"] == "0"  # type: ignore[index]
    w.offer_json(first)
    time.sleep(0.3)  # time, not a state: the first must not be written within its wait
    assert runner.calls == [] and w.pending() == 1
    w.offer_json(report())
    wait_until(lambda: w.written == 1, "written")
    w.stop()
    assert runner.calls[0][-1] == "AdminComment=" + admin_comment(report())


def test_only_the_hooks_jobs_are_slurm_jobs() -> None:
    data = report()
    assert slurm_id(data) == ("4242", "wl")
    data["job"]["id"] = "train-7"  # a wattline job of another kind with the same labels
    assert slurm_id(data) is None
    data["job"]["id"] = "4242"
    data["job"]["labels"] = {"cluster": "wl"}  # not opened by the hooks
    assert slurm_id(data) is None


class Sacctmgr:
    """A scripted sacctmgr: each call takes the next answer (the last one repeats)."""

    def __init__(self, *answers: tuple[int, str]) -> None:
        self.answers = list(answers)
        self.calls: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, argv: list[str], timeout_s: float) -> tuple[int, str]:
        self.gate.wait(10)
        self.calls.append(argv)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


MODIFIED = (0, " Modified jobs...\n  4242 submitted at 2026-12-06T11:53:37\n")
DOWN = (1, "sacctmgr: error: Problem talking to the database: Connection refused")
UNKNOWN = (1, " Nothing modified\nsacctmgr: ... Request didn't affect anything or your user doesn't have privilege")
DENIED = (
    1,
    "sacctmgr: error: Your user doesn't have privilege to perform this action\n Error: Access/permission denied",
)


def writer(runner: Sacctmgr, **kw: Any) -> AdminCommentWriter:
    return AdminCommentWriter(runner, retry_s=0.05, max_retry_s=0.2, **kw).start()


def test_retried_while_slurmdbd_is_down_then_written(caplog: pytest.LogCaptureFixture) -> None:
    runner = Sacctmgr(DOWN, DOWN, DOWN, MODIFIED)
    w = writer(runner)
    with caplog.at_level(logging.INFO):
        w.queue("4242", "wl", "wattline.energy/1 energy_j=1")
        wait_until(lambda: w.written == 1, "written")
    w.stop()
    assert len(runner.calls) == 4
    assert runner.calls[-1][-4:] == ["jobid=4242", "cluster=wl", "set", "AdminComment=wattline.energy/1 energy_j=1"]
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "not written yet (retried)" in lines[0], lines


@pytest.mark.parametrize(
    ("answer", "said", "calls"),
    [(UNKNOWN, "not in Slurm's accounting after 3 looks", 3), (DENIED, "refused (run the collector as root", 1)],
)
def test_skipped_with_one_line(
    caplog: pytest.LogCaptureFixture, answer: tuple[int, str], said: str, calls: int
) -> None:
    runner = Sacctmgr(answer)
    w = writer(runner, not_found_tries=3)
    with caplog.at_level(logging.WARNING):
        w.queue("4242", "wl", "wattline.energy/1 energy_j=1")
        wait_until(lambda: w.skipped == 1, "skipped")
    w.stop()
    assert len(runner.calls) == calls and w.pending() == 0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and said in lines[0], lines


def test_given_up_after_its_time(caplog: pytest.LogCaptureFixture) -> None:
    runner = Sacctmgr(DOWN)
    w = writer(runner, give_up_s=0.3)
    with caplog.at_level(logging.WARNING):
        w.queue("4242", "wl", "wattline.energy/1 energy_j=1")
        wait_until(lambda: w.skipped == 1, "given up")
    w.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "given up after" in lines[1], lines


def test_never_blocks_and_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    """sacctmgr hangs: queueing returns at once, a job queued again keeps its latest text,
    beyond ``max_jobs`` a job is skipped with a line."""
    runner = Sacctmgr(MODIFIED)
    runner.gate.clear()
    w = writer(runner, max_jobs=2)
    w.queue("1", "wl", "first")
    wait_until(lambda: w.pending() == 0, "job 1 taken")  # its sacctmgr hangs
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        for job, text in (("2", "old"), ("3", "x"), ("2", "new"), ("4", "y")):
            w.queue(job, "wl", text)
    assert time.monotonic() - start < 0.1
    assert w.pending() == 2 and w.skipped == 1
    assert "job 4 skipped" in caplog.records[0].getMessage()
    runner.gate.set()
    wait_until(lambda: w.written == 3, "written")
    w.stop()
    assert [c[-1] for c in runner.calls] == ["AdminComment=first", "AdminComment=new", "AdminComment=x"]


def test_a_failing_runner_does_not_end_the_thread(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def runner(argv: list[str], timeout_s: float) -> tuple[int, str]:
        calls.append(argv[-1])
        if len(calls) == 1:
            raise ValueError("a bug")
        return MODIFIED

    w = AdminCommentWriter(runner).start()
    with caplog.at_level(logging.WARNING):
        w.queue("1", "wl", "a")
        wait_until(lambda: w.skipped == 1, "job 1 dropped")
        w.queue("2", "wl", "b")
        wait_until(lambda: w.written == 1, "job 2 written")
    w.stop()
    assert calls == ["AdminComment=a", "AdminComment=b"]
    assert "job 1: AdminComment not written: ValueError: a bug" in caplog.records[0].getMessage()
