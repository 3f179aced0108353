"""The README documents every option the daemons take (the brief: --help and the README)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from wattline.agent.registry import SOURCES, source_class
from wattline.agent.settings import AgentSettings
from wattline.collector.settings import CollectorSettings

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


@pytest.mark.parametrize("cls", [AgentSettings, CollectorSettings])
def test_every_daemon_option_is_in_the_readme(cls: type) -> None:
    missing = [f.name for f in dataclasses.fields(cls) if f"| `{f.name}` |" not in README]
    assert missing == []


@pytest.mark.parametrize("name", list(SOURCES))
def test_every_source_option_is_in_the_readme(name: str) -> None:
    _, options = source_class(name)
    row = next(line for line in README.splitlines() if line.startswith(f"| `[sources.{name}]` |"))
    assert [f.name for f in dataclasses.fields(options) if f"`{f.name}`" not in row] == []


def test_two_command_quick_start() -> None:
    quick = README.split("## Quick start", 1)[1].split("## ", 1)[0]
    commands = [b.split("```", 1)[0].strip() for b in quick.split("```sh\n")[1:3]]
    assert commands[0].startswith("python3 -m venv .venv") and "wattline run" in commands[0]
    assert commands[1] == "bash .ci/run"


#: Each numeric promise of the README's Jobs and Delivery guarantee sections (times, sizes,
#: counts) and the others issue #29 named, word for word, and the test (``file::function``)
#: that checks it. A promise here without a test is listed in UNTESTED with its issue, so
#: neither list can quietly go stale.
PROMISES: list[tuple[str, str]] = [
    ("older than three heartbeat periods\n(90 s; one late or lost heartbeat never ends a live job)",
     "test_job_lease.py::test_one_late_heartbeat_never_ends_a_live_job"),
    ("sends a `heartbeat` event every 30 s", "test_job_lease.py::test_the_job_api_renews_its_lease_until_it_closes"),
    ("waits, at most two\nbatch intervals plus 3 s after the close",
     "test_report_complete.py::test_report_at_job_end_waits_for_the_last_samples"),
    ("budget of ticks (10 at once, then 5 a second)", "test_edge_socket.py::test_a_peer_beyond_its_budget_is_refused"),
    ("exits with CMD's status at most about 3 s after CMD ends",
     "test_outbox.py::test_collector_down_exit_status_kept_then_a_later_run_delivers"),
    ("up to an hour after the\nclose",
     "test_job_summary.py::test_an_incomplete_summary_is_computed_again_up_to_an_hour_after_the_close"),
    ("(2 s, doubling to 60 s)", "test_job_summary.py::test_a_failed_write_is_retried_at_2_s_doubling_to_60_s"),
    ("(10,000 due jobs)", "test_job_summary.py::test_the_due_table_takes_10000_jobs_and_names_the_one_it_cannot_take"),
    ("Bounds: 256 MiB", "test_outbox.py::test_past_its_size_bound_exactly_the_oldest_events_are_dropped_and_said"),
    ("30 days per process; beyond, the oldest are dropped and logged",
     "test_outbox.py::test_past_30_days_exactly_the_older_events_are_dropped_and_said"),
    ("Always one line on stderr, never a traceback", "test_cli_table.py::test_bad_input_is_one_line_and_a_status"),
]  # fmt: skip

#: Promises no test checks yet (issue #29, item 5): said here, not hidden.
UNTESTED: list[str] = []


def _normal(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("promise", "test_id"), PROMISES)
def test_each_numeric_promise_is_named_by_a_test(promise: str, test_id: str) -> None:
    """The promise is in the README as written, and the test that checks it exists."""
    assert _normal(promise) in _normal(README), promise
    file, function = test_id.split("::")
    source = (Path(__file__).parent / file).read_text()
    assert f"def {function}(" in source, test_id


def test_untested_promises_are_still_promised() -> None:
    """An entry of UNTESTED that left the README (or got a test: move it up) must leave the list."""
    assert [p for p in UNTESTED if _normal(p) not in _normal(README)] == []
