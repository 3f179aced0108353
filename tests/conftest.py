"""Test session set-up: the real-server fixtures, and a private state and data home.

``wattline run`` keeps undelivered job events and the records of the jobs it holds in
``$XDG_STATE_HOME/wattline/outbox`` and the embedded store in ``$XDG_DATA_HOME/wattline``;
every wattline process delivers the outbox leftovers of dead ones to the collector it
reaches, and ends the jobs of dead holders it finds there. Each test gets a state home of
its own, so a job a test left undelivered or held by a killed wrapper never lands in
another test's store, and nothing is written to the home of whoever runs the tests.

A test marked ``needs(why)`` skips with that reason when *why* is not empty (a tool missing
here); under ``CI=true`` it fails instead: CI installs everything, so a skip there would hide a
test that never ran.
"""

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from grafana_data import dashboard_schema  # noqa: F401
from servers import influxd, prometheus, victoria_metrics, victoria_metrics_defaults  # noqa: F401

_HOME = tempfile.mkdtemp(prefix="wattline-tests-")
os.environ["XDG_STATE_HOME"] = os.path.join(_HOME, "state")
os.environ["XDG_DATA_HOME"] = os.path.join(_HOME, "data")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        why = str(mark.args[0]) if mark.args else ""
        if not why:
            continue
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why} (CI=true: a missing tool is a failure, not a skip)", pytrace=False)
        pytest.skip(why)


@pytest.fixture(autouse=True)
def own_state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state home of the test's own (outbox, holder records), and a runtime folder: an agent
    run by a user other than root serves its edge socket in ``$XDG_RUNTIME_DIR/wattline``,
    which must be neither the user's real one nor another test's. (Root's agents serve under
    their ``--sysfs-root``: each test's own tree.)"""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    runtime = tmp_path_factory.mktemp("runtime")
    runtime.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    yield state
