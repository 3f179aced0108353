"""Ticks at a job's edges on request: the agent's local socket, and the wrappers' client.

A job's energy at its open and close instants is read, not apportioned from the samples
straddling them, when a sample boundary falls exactly on each: ``wattline run`` and ``Job``
ask the host's agent to tick now (:func:`ask_edge_tick`) and use the time stamp of that
tick (:meth:`Sampler.edge_tick <wattline.agent.sampler.Sampler.edge_tick>`) as the event's.

Where the socket is, for the agent and the wrappers alike, is one rule
(:func:`socket_places`): the agent serves wherever it runs (by hand, in a container, under
systemd), and a user's wrapper finds a root agent's as well as its own user's.

The protocol is a connection: the agent answers ``STAMP_NS\\n`` (or ``busy\\n``) and closes;
the client sends nothing. Who may ask is who may connect: the socket is mode 0666 inside its
folder, whose mode restricts it (0755 for root's ``/run/wattline``, 0700 for a user's).
Each peer's uid (``SO_PEERCRED``) has a budget of ticks, and so has the agent as a whole,
so no user makes it tick at a high rate; requests that arrive together share one tick.
The client waits at most :data:`ASK_TIMEOUT_S` in all: without an agent, or on any error,
the edge is the wrapper's own clock, as before, said only in a debug log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

#: The socket's file name in its folder.
SOCKET_NAME = "edge.sock"
#: The runtime folder's name: systemd's ``RuntimeDirectory=wattline``, and the one the agent
#: makes under ``/run`` (root) or ``$XDG_RUNTIME_DIR`` (any other user).
FOLDER = "wattline"
#: ``agent.edge_socket`` value that turns the socket off (agent) and the asking (wrappers).
OFF = "off"
#: The longest a wrapper waits for the agent's answer: a user's command is never held longer.
ASK_TIMEOUT_S = 0.01
#: An answer farther than this from the wrapper's own clock is not the time of a tick now.
PLAUSIBLE_NS = 1_000_000_000
#: Ticks on request: each peer uid may ask ``burst`` at once, then ``rate`` per second; the
#: agent as a whole ticks on request at most twice that.
PEER_RATE, PEER_BURST = 5.0, 10.0
TOTAL_RATE, TOTAL_BURST = 2 * PEER_RATE, 2 * PEER_BURST
#: A connect that fails so means nobody serves there: the next place is asked at once.
NOBODY_THERE = (FileNotFoundError, ConnectionRefusedError, NotADirectoryError, PermissionError)


@dataclass(frozen=True)
class Place:
    """One place the edge socket may be."""

    path: Path
    #: The mode the agent makes the socket's folder with when it is missing; None: the folder
    #: is someone else's to make (systemd's, the operator's).
    mode: int | None = None
    #: Root's place: only an agent running as root serves it (any user's wrapper asks it).
    root_only: bool = False


def socket_places(
    setting: str, root: Path = Path("/"), env: Mapping[str, str] | None = None, uid: int | None = None
) -> list[Place]:
    """Where the edge socket may be (``agent.edge_socket``), for a process of ``uid`` (default:
    this one's), in the order wrappers ask; the agent serves the first it may (:func:`serve_edges`).

    The setting's path alone; none when off. Else ``$RUNTIME_DIRECTORY/edge.sock`` (systemd's
    ``RuntimeDirectory=``), then, for a uid other than root, ``$XDG_RUNTIME_DIR/wattline/edge.sock``
    (folder 0700: that user's own agent), then ``ROOT/run/wattline/edge.sock`` (folder 0755:
    a root agent's, which every user's wrapper can reach; ``root`` is ``agent.sysfs_root``, the
    host's ``/`` as this process sees it)."""
    if setting == OFF:
        return []
    if setting:
        return [Place(Path(setting).expanduser())]
    env = os.environ if env is None else env
    uid = os.geteuid() if uid is None else uid
    places = []
    runtime = env.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if runtime:
        places.append(Place(Path(runtime) / SOCKET_NAME))
    user_runtime = env.get("XDG_RUNTIME_DIR", "")
    if uid != 0 and user_runtime.startswith("/"):  # the spec: a relative value is to be ignored
        places.append(Place(Path(user_runtime) / FOLDER / SOCKET_NAME, mode=0o700))
    places.append(Place(root / "run" / FOLDER / SOCKET_NAME, mode=0o755, root_only=True))
    return places


def ask_edge_tick(paths: Sequence[Path], timeout_s: float = ASK_TIMEOUT_S) -> int | None:
    """Ask the agent at the first of ``paths`` that someone serves to tick now: the time stamp
    (ns) of its tick, or None (no agent, busy, slow, or an implausible answer) within
    ``timeout_s`` for all of them."""
    deadline = time.monotonic() + timeout_s
    for path in paths:
        try:
            stamp = _ask(path, deadline)
        except NOBODY_THERE as exc:
            log.debug("no edge socket served at %s: %s", path, exc.strerror or type(exc).__name__)
            continue
        except (OSError, ValueError) as exc:  # timed out, busy, garbled
            log.debug("no edge tick from the agent at %s: %s", path, exc or type(exc).__name__)
            return None
        if abs(stamp - time.time_ns()) > PLAUSIBLE_NS:
            log.debug("edge tick from %s ignored: %d ns is not now", path, stamp)
            return None
        return stamp
    return None


def _ask(path: Path, deadline: float) -> int:
    """The stamp the agent at ``path`` answers by ``deadline`` (monotonic)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(max(deadline - time.monotonic(), 1e-4))
        sock.connect(str(path))
        answer = b""
        while not answer.endswith(b"\n") and len(answer) < 32:
            sock.settimeout(max(deadline - time.monotonic(), 1e-4))
            chunk = sock.recv(32)
            if not chunk:
                break
            answer += chunk
    return int(answer)


@dataclass
class Bucket:
    """A token bucket: ``burst`` tokens, refilled at ``rate`` per second."""

    rate: float
    burst: float
    tokens: float = -1.0
    at: float = field(default_factory=time.monotonic)

    def take(self, now: float) -> bool:
        """Take one token if there is one."""
        if self.tokens < 0:
            self.tokens = self.burst
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def peer_uid(conn: socket.socket) -> int:
    """The connecting process's uid, as the kernel says (``SO_PEERCRED``: pid, uid, gid)."""
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return int(uid)


class EdgeServer:
    """The agent's edge socket: one thread answering connections with ``tick()``'s stamp."""

    def __init__(self, path: Path, tick: Callable[[], int]) -> None:
        self.path = path
        self.tick = tick
        self.total = Bucket(TOTAL_RATE, TOTAL_BURST)
        self.peers: dict[int, Bucket] = {}
        self.ticks = self.refused = 0
        self._stop = threading.Event()
        self._sock = self._bind(path)
        # close() writes to this pipe: the thread sleeps in select() until a wrapper connects
        # or the agent stops, instead of waking a few times a second to look at a flag.
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="wattline-edges", daemon=True)
        self._thread.start()

    @staticmethod
    def _bind(path: Path) -> socket.socket:
        """Listen at ``path``, replacing a socket no process answers at (a dead agent's);
        OSError when another process serves it, or the path is not a socket."""
        if path.is_socket():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(str(path))
                except OSError:
                    path.unlink()
                else:
                    raise OSError(f"{path}: another process serves it")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            os.chmod(path, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH)
            sock.listen(64)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    def _serve(self) -> None:
        while not self._stop.is_set():
            listening = self._sock.fileno()
            ready, _, _ = select.select([listening, self._wake_r], [], [])
            if listening in ready and not self._stop.is_set():
                try:
                    self._answer(self._accept_all())
                except Exception:  # a bug here must not end the agent: the wrappers fall back
                    log.exception("edge socket: answering failed")

    def _accept_all(self) -> list[socket.socket]:
        """Every connection waiting now: they share the one tick taken after them all."""
        conns: list[socket.socket] = []
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return conns
            conns.append(conn)

    def _answer(self, conns: list[socket.socket]) -> None:
        now = time.monotonic()
        allowed = []
        for conn in conns:
            try:
                uid = peer_uid(conn)
            except OSError:
                uid = -1
            if self.peers.setdefault(uid, Bucket(PEER_RATE, PEER_BURST)).take(now):
                allowed.append(conn)
        answer = b"busy\n"
        if allowed and self.total.take(now):
            answer = b"%d\n" % self.tick()
            self.ticks += 1
        for conn in conns:
            reply = answer if conn in allowed else b"busy\n"
            self.refused += reply == b"busy\n"
            with contextlib.suppress(OSError), conn:
                conn.setblocking(True)
                conn.settimeout(0.01)
                conn.sendall(reply)

    def close(self) -> None:
        """Stop answering and remove the socket."""
        if self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self.path.unlink()
        if self._thread.is_alive():  # stuck in a tick: its descriptors go with the process
            log.warning("edge socket: its thread did not stop within 5 s")
            return
        self._sock.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)


def serve_edges(
    setting: str,
    tick: Callable[[], int],
    root: Path = Path("/"),
    env: Mapping[str, str] | None = None,
    uid: int | None = None,
) -> EdgeServer | None:
    """The agent's edge socket per ``agent.edge_socket`` at the first of :func:`socket_places`
    it may serve (as ``uid``, default this process's), its folder made if missing; None when
    off or when there is none. Where it serves, or why not, is one log line; a socket that
    cannot be made is one warning: the agent samples on, the wrappers fall back to their own
    clock."""
    if setting == OFF:
        log.info("edge socket off (agent.edge_socket = off): jobs' edges are apportioned")
        return None
    uid = os.geteuid() if uid is None else uid
    place = next((p for p in socket_places(setting, root, env, uid) if uid == 0 or not p.root_only), None)
    if place is None:
        log.warning(
            "edge socket off (jobs' edges are apportioned): not root and no $XDG_RUNTIME_DIR; "
            "set agent.edge_socket to a path the jobs' users can reach"
        )
        return None
    try:
        if place.mode is not None:
            _make_folder(place.path.parent, place.mode, parents=place.root_only)
        server = EdgeServer(place.path, tick)
    except OSError as exc:
        where = exc.filename or place.path  # the folder that could not be made, else the socket
        log.warning("edge socket off (jobs' edges are apportioned): %s: %s", where, exc.strerror or exc)
        return None
    log.info("edge socket: ticking at jobs' edges on request at %s", place.path)
    return server


def _make_folder(folder: Path, mode: int, parents: bool) -> None:
    """Make the socket's ``folder`` with ``mode`` unless it exists (systemd's, an earlier agent's:
    its mode stays whoever made it chose). ``parents``: root's ``run/`` too (a test's root tree;
    ``/run`` itself always exists), never a missing ``$XDG_RUNTIME_DIR`` (the login manager's)."""
    try:
        folder.mkdir(mode=mode, parents=parents)
    except FileExistsError:
        return
    os.chmod(folder, mode)  # the umask must not narrow who may ask
