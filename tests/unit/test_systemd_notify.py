"""sd_notify over real AF_UNIX datagram sockets: filesystem path and abstract namespace."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from wattline import systemd


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock


@pytest.fixture
def path_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    # A short directory: sun_path holds at most 107 bytes, pytest's tmp_path can be longer.
    directory = tempfile.mkdtemp(prefix="wl-sd-")
    path = os.path.join(directory, "notify")
    sock = _receiver(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    try:
        yield sock
    finally:
        sock.close()
        shutil.rmtree(directory)


@pytest.fixture
def abstract_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    name = f"wattline-test-{uuid.uuid4().hex}"
    sock = _receiver("\0" + name)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    try:
        yield sock
    finally:
        sock.close()


def test_path_socket_receives_each_message(path_socket: socket.socket) -> None:
    assert systemd.ready()
    assert path_socket.recv(4096) == b"READY=1"
    assert systemd.watchdog()
    assert path_socket.recv(4096) == b"WATCHDOG=1"
    assert systemd.stopping()
    assert path_socket.recv(4096) == b"STOPPING=1"
    assert systemd.status("sampling 5 sources")
    assert path_socket.recv(4096) == b"STATUS=sampling 5 sources"


def test_abstract_socket(abstract_socket: socket.socket) -> None:
    assert systemd.ready("listening on 127.0.0.1:50051")
    assert abstract_socket.recv(4096) == b"READY=1\nSTATUS=listening on 127.0.0.1:50051"
    assert systemd.notify("STATUS=x\nWATCHDOG=1")
    assert abstract_socket.recv(4096) == b"STATUS=x\nWATCHDOG=1"


def test_status_cannot_inject_assignments(path_socket: socket.socket) -> None:
    assert systemd.status("collector down\nREADY=1\r\nMAINPID=1")
    assert path_socket.recv(4096) == b"STATUS=collector down READY=1 MAINPID=1"


def test_unicode_status(abstract_socket: socket.socket) -> None:
    assert systemd.status("12.5 W · ok")
    assert abstract_socket.recv(4096).decode() == "STATUS=12.5 W · ok"


@pytest.mark.parametrize("value", [None, "", "relative/notify", "@", "vsock:2:1234"])
def test_no_op_outside_systemd(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is not None:
        monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert systemd.notify("READY=1") is False
    assert systemd.ready() is False
    assert systemd.watchdog() is False
    assert systemd.stopping() is False
    assert systemd.status("x") is False


def test_unreachable_socket_is_false_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tempfile.mkdtemp(prefix="wl-sd-")
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", os.path.join(directory, "absent"))
        assert systemd.ready() is False
        monkeypatch.setenv("NOTIFY_SOCKET", f"@wattline-absent-{uuid.uuid4().hex}")
        assert systemd.watchdog() is False
    finally:
        shutil.rmtree(directory)


def test_empty_state_is_not_sent(path_socket: socket.socket) -> None:
    assert systemd.notify("") is False
    path_socket.settimeout(0.05)
    with pytest.raises(TimeoutError):
        path_socket.recv(4096)


def test_watchdog_interval_is_half(monkeypatch: pytest.MonkeyPatch) -> None:
    assert systemd.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert systemd.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert systemd.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_USEC", "1")
    assert systemd.watchdog_interval() == 5e-7


@pytest.mark.parametrize(
    ("usec", "pid"),
    [("0", None), ("", None), ("-5", None), ("1.5e6", None), ("abc", None), ("30000000", "1"), ("30000000", "x")],
)
def test_watchdog_interval_disabled(monkeypatch: pytest.MonkeyPatch, usec: str, pid: str | None) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", usec)
    if pid is not None:
        if pid == "1" and os.getpid() == 1:
            pid = "2"
        monkeypatch.setenv("WATCHDOG_PID", pid)
    assert systemd.watchdog_interval() is None
