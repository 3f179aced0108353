"""``wattline run``: start a command inside a job window on this host.

The command gets ``$WATTLINE_JOB_ID`` and ``$WATTLINE_EVENTS`` (see
:mod:`wattline.jobs.events`); the Python API joins the job through them. Its exit
status is recorded and returned; a command that cannot start records nothing and is
:class:`CommandNotStarted` (127 not found, 126 not executable, as a shell says). While
the command runs, a heartbeat renews the job's lease (:mod:`.heartbeat`).

Signals reach the command once. In the foreground of a terminal the command shares our
process group, so Ctrl-C reaches it from the terminal and is not forwarded again (other
signals are). Anywhere else (``setsid``, a scheduler, a background job) the command gets
a process group of its own and every signal we receive, to our group or to us alone, is
forwarded to its group exactly once.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from wattline.agent.registry import SourceStatus
from wattline.agent.settings import AgentSettings
from wattline.config import ConfigError
from wattline.jobs.events import SATURATED, EventBuilder, EventsFileReader, JobSpec, UnitAccumulator
from wattline.jobs.job_env import ENV_EVENTS, ENV_JOB_ID
from wattline.jobs.wrappers.embedded import embedded_session
from wattline.jobs.wrappers.heartbeat import Heartbeat
from wattline.jobs.wrappers.holding import ended_ids, hold_job
from wattline.jobs.wrappers.served import ServedHolder, ServedUnits
from wattline.jobs.wrappers.session import CollectorSink, EventSink
from wattline.reports.summaries.summary import record_local_summary
from wattline.stores.base import Store

if TYPE_CHECKING:
    from wattline.jobs.wrappers.live import LiveLine
    from wattline.reports.model import ReportSettings
from wattline.jobs.wrappers.usage import JobUse

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


@dataclass
class RunRequest:
    """What to run and how to tag it."""

    command: list[str]
    spec: JobSpec
    saturated_after_s: float | None = None
    units_from_stdout: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: The command's stdout goes to our stderr (``--json``: our stdout holds only JSON).
    stdout_to_stderr: bool = False
    #: Called with each ``latency`` line's seconds and time (ns): ``wattline sweep`` keeps them.
    on_latency: Callable[[float, int], None] | None = None
    #: Units scraped from the command's server (``--metrics``, :mod:`.served`), instead of its stdout.
    served: ServedUnits | None = None


class CommandNotStarted(OSError):
    """The command could not be started; ``status`` is the shell's (127 not found, 126 not executable)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def check_command(command: list[str], env: Mapping[str, str] | None = None) -> None:
    """Raise :class:`CommandNotStarted` where a shell would refuse ``command`` (before the job opens)."""
    name = command[0]
    shown = name[:100]
    if "/" not in name:
        if shutil.which(name, path=(os.environ if env is None else env).get("PATH", os.defpath)) is None:
            raise CommandNotStarted(f"{shown}: command not found", 127)
        return
    path = Path(name)
    if not path.exists():
        raise CommandNotStarted(f"{shown}: No such file or directory", 127)
    if path.is_dir():
        raise CommandNotStarted(f"{shown}: Is a directory", 126)
    if not os.access(path, os.X_OK):
        raise CommandNotStarted(f"{shown}: Permission denied", 126)


def units_pattern(text: str | None) -> re.Pattern[str] | None:
    """The compiled ``--units-from-stdout`` regex; a bad one is a ConfigError (one line)."""
    if text is None:
        return None
    try:
        return re.compile(text)
    except re.error as exc:
        raise ConfigError(f"option --units-from-stdout: {text[:100]!r} is not a regular expression: {exc}") from None


def sources_summary(statuses: list[SourceStatus]) -> str:
    """One line: the sources measured, the ones estimated by a model, the channels unusable at
    the interval, the absent sources."""
    present = [s for s in statuses if s.available]
    measured = [s.name for s in present if any(ch.quality.measured for ch in s.channels)]
    estimated = [s.name for s in present if s.name not in measured]
    absent = [s.name for s in statuses if not s.available and not s.unusable]
    unusable = [u.brief for s in statuses for u in s.unusable]  # counters that wrap within the interval
    parts = ["measuring " + (", ".join(measured) or "nothing")]
    if estimated:
        parts.append("ESTIMATING " + ", ".join(estimated) + " (models, not measurements)")
    if unusable:
        parts.append("UNUSABLE at this interval, not sampled: " + ", ".join(unusable))
    if absent:
        parts.append("absent: " + ", ".join(absent))
    return "sources: " + "; ".join(parts) + " (-v for details)"


def exit_status(returncode: int) -> int:
    """Shell convention: 128+N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class JobRunner:
    """Runs one command in a job window and feeds its events to ``sink``."""

    def __init__(
        self,
        request: RunRequest,
        sink: EventSink,
        live_out: IO[str] | None = None,
        use: Callable[[EventBuilder, int], JobUse] | None = None,
    ) -> None:
        self.request = request
        self.sink = sink
        self.live_out = live_out  #: where the live line goes (a terminal), or None
        self.use = use  #: builds the recorder of the job's device use, rooted at the command's pid
        self.builder = EventBuilder(request.spec)
        self.units = UnitAccumulator(self.builder, sink.send)
        self.pattern = units_pattern(request.units_from_stdout)
        self.open_ns = 0
        self.close_ns = 0
        self.saturation_marked = False
        self.saturation_mark_ns: int | None = None

    def run(self) -> int:
        """Run the command to completion; returns its exit status (shell convention)."""
        workdir = Path(tempfile.mkdtemp(prefix="wattline-job-"))
        events_path = workdir / "events"
        events_path.touch(mode=0o600)
        env = {**os.environ, **self.request.env, ENV_JOB_ID: self.request.spec.job_id, ENV_EVENTS: str(events_path)}
        reader = EventsFileReader(events_path, self.units.add, self._phase, self._latency)
        # stamped by a reading taken now (sent once the command has started: none for one that cannot)
        opened = self.builder.open(self.sink.edge_tick())
        self.open_ns = opened.time_ns
        interactive = _terminal_delivered()
        stdout: int | None = None
        if self.pattern:
            stdout = subprocess.PIPE
        elif self.request.stdout_to_stderr:
            stdout = sys.stderr.fileno()
        try:
            child = subprocess.Popen(
                self.request.command,
                env=env,
                stdout=stdout,
                text=True if self.pattern else None,
                bufsize=1 if self.pattern else -1,
                process_group=None if interactive else 0,
            )
        except OSError as exc:
            shutil.rmtree(workdir, ignore_errors=True)
            status = 126 if exc.errno in (errno.EACCES, errno.ENOEXEC, errno.EISDIR, errno.EPERM) else 127
            raise CommandNotStarted(f"{self.request.command[0][:100]}: {exc.strerror}", status) from None
        self.sink.send([opened])
        holding = hold_job(self.sink, self.builder, opened)
        heartbeat = Heartbeat(self.builder, self.sink.send).start()
        served = self.request.served and ServedHolder(self.request.served, self.units, self.open_ns).start()
        live = self._live_line()
        use = self.use(self.builder, child.pid).start(self.open_ns) if self.use is not None else None
        previous = {sig: signal.signal(sig, self._forwarder(child, interactive)) for sig in FORWARDED}
        pump = None
        if self.pattern is not None and child.stdout is not None:
            pump = threading.Thread(target=self._pump_stdout, args=(child.stdout,), daemon=True)
            pump.start()
        try:
            with _ExitWatch(child.pid) as exited:
                while not exited.wait(0.2):
                    reader.poll()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            heartbeat.stop()
            if served:
                served.stop()
            if live is not None:
                live.stop()
            if use is not None:
                use.stop()  # before the command is reaped: its last CPU time is read from what it left
        returncode = child.wait()
        if pump is not None:
            pump.join(timeout=5)
        if served:  # its last scrape, while the job is open
            served.finish()
        reader.poll()
        self.units.flush()
        self.close_ns = self.sink.edge_tick() or time.time_ns()
        self._saturated_after()
        status = exit_status(returncode)
        scope = use.scope if use is not None else ()
        if use is not None:
            use.finish(self.close_ns)
        self.sink.send([self.builder.close(status, self.close_ns, scope)])
        if holding is not None:
            holding.release()
        shutil.rmtree(workdir, ignore_errors=True)
        return status

    def _latency(self, seconds: float, time_ns: int | None) -> None:
        if self.request.on_latency is not None:
            self.request.on_latency(seconds, time_ns or time.time_ns())

    def _phase(self, name: str, time_ns: int | None) -> None:
        self.units.flush()
        if name == SATURATED:
            self.saturation_marked = True
            self.saturation_mark_ns = time_ns or time.time_ns()
        self.sink.send([self.builder.phase(name, time_ns)])

    def _live_line(self) -> LiveLine | None:
        if self.live_out is None:
            return None
        from wattline.jobs.wrappers.live import LiveLine

        spec = self.request.spec
        meter = getattr(self.sink, "meter", None)  # embedded sampling measures here; an agent elsewhere
        line = LiveLine(spec.name, spec.unit_name, lambda: self.units.total, self._saturated_at_s, meter, self.live_out)
        return line.start()

    def _saturated_at_s(self) -> float | None:
        """Seconds from open to a known saturation point (the mark, or --saturated-after)."""
        if self.saturation_mark_ns is not None:
            return (self.saturation_mark_ns - self.open_ns) / 1e9
        return self.request.saturated_after_s

    def _saturated_after(self) -> None:
        after = self.request.saturated_after_s
        if after is None or self.saturation_marked:
            return
        at = self.open_ns + int(after * 1e9)
        if at < self.close_ns:
            self.sink.send([self.builder.phase(SATURATED, at)])

    def _pump_stdout(self, stream: IO[str]) -> None:
        assert self.pattern is not None
        out = sys.stderr if self.request.stdout_to_stderr else sys.stdout
        for line in stream:
            out.write(line)
            out.flush()
            match = self.pattern.search(line)
            if match is None:
                continue
            try:
                self.units.add(float(match.group(1)) if match.groups() else 1.0)
            except (TypeError, ValueError):  # not a count, or not finite and >= 0: the line counts nothing
                continue

    @staticmethod
    def _forwarder(
        child: subprocess.Popen[str] | subprocess.Popen[bytes], interactive: bool
    ) -> Callable[[int, FrameType | None], None]:
        """The handler of a forwarded signal: to the child (``interactive``: it shares our
        process group, and the terminal sends it Ctrl-C itself), else to its own group."""

        def forward(signum: int, _frame: FrameType | None) -> None:
            if child.poll() is not None:
                return
            if not interactive:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signum)
            elif signum != signal.SIGINT or not _terminal_delivered():
                child.send_signal(signum)

        return forward


class _ExitWatch:
    """Waits for a child to end without reaping it (its ``/proc`` entry, with its final CPU
    time and its reaped children's, stays until :meth:`subprocess.Popen.wait`): a pidfd that
    becomes readable at its end, else a poll every few ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd: int | None = None

    def __enter__(self) -> _ExitWatch:
        with contextlib.suppress(OSError, AttributeError):  # a kernel before 5.3, or a seccomp filter
            self._fd = os.pidfd_open(self.pid)
        return self

    def __exit__(self, *_: object) -> None:
        if self._fd is not None:
            os.close(self._fd)

    def wait(self, timeout_s: float) -> bool:
        """True once the child has ended (within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._fd is not None:
                select.select([self._fd], [], [], max(0.0, deadline - time.monotonic()))
            try:
                if os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    return True
            except ChildProcessError:  # already reaped
                return True
            if time.monotonic() >= deadline:
                return False
            if self._fd is None:
                time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))


def _terminal_delivered() -> bool:
    """True when we are the foreground process group of our controlling terminal, the one
    whose Ctrl-C reaches our whole group (stdin may be a file or a pipe all the same)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:  # no controlling terminal: setsid, a scheduler, a daemon
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def run_job(
    request: RunRequest,
    settings: AgentSettings,
    doc: Mapping[str, Any] | None = None,
    collectors: list[str] | None = None,
    store_url: str | None = None,
    on_kept: Callable[[str], None] | None = None,
    open_store: Callable[[], Store] | None = None,
    on_sources: Callable[[str], None] | None = None,
    live_out: IO[str] | None = None,
    report_settings: ReportSettings | None = None,
) -> int:
    """Run ``request`` under a job window; returns the command's exit status.

    With ``collectors``, job events go there (a host agent samples, with the same TLS /
    token settings as the agent), through the host's outbox: when no collector
    acknowledges them within a few seconds of the command's end, ``on_kept`` gets one
    line saying where they wait. Otherwise this process samples the host itself into the
    store ``open_store()`` opens (else the local store ``store_url``) and writes the job's
    summary there, and ``on_sources`` gets the one line
    of :func:`sources_summary`. ``live_out`` (a terminal) gets the live line (:mod:`.live`);
    ``report_settings``: those of the summary an embedded run writes (the report's).
    Raises :class:`CommandNotStarted` (nothing recorded) when the command cannot start.
    """
    check_command(request.command, {**os.environ, **request.env})
    sink: EventSink
    if collectors:
        settings.collectors = list(collectors)
        sink = CollectorSink(settings.validate(), on_kept=on_kept)
    else:
        session = embedded_session(store_url, settings, doc, store=open_store() if open_store else None)
        if on_sources is not None:
            on_sources(sources_summary(session.discovery.statuses))
        sink = session
    discovery = getattr(sink, "discovery", None)

    def use(builder: EventBuilder, pid: int) -> JobUse:
        return JobUse(builder, sink.send, [pid], discovery=discovery, settings=settings, doc=doc)

    try:
        status = JobRunner(request, sink, live_out, use).run()
    finally:
        sink.close()
    if not collectors:  # embedded: the run writes its job's summary (a collector does otherwise)
        record_local_summary(store_url, request.spec.job_id, open_store, ended_ids(sink), report_settings)
    return status
