"""The agent's systemd-unit holder: a service named in ``[systemd]`` (:mod:`.unit_settings`)
is a job that is open while its unit runs.

Every ``poll_interval`` it looks at each unit's cgroup, ``<cgroup root>/system.slice/<unit>``
under the agent's sysfs root (cgroup v2, or v1's CPU-accounting hierarchy, where systemd
mirrors it). A unit *runs* while its cgroup holds processes (``cgroup.events``' ``populated 1``,
else a non-empty ``cgroup.procs``). A running unit opens its service job (``service`` set, the
spec's NAME its unit, as the pod and wrapper holders' do), which sends heartbeats while open;
its CPU time (the cgroup's, :mod:`.cgroup_cpu`) against the host's (the root cgroup's) goes
out as ``cpu:host`` USE periods (:class:`.cpu_use.CpuTally`, one tally for every holder); and
each look scrapes its metrics URL, a UNITS event per good scrape with the job's running total
(:class:`wattline.served_metrics.ServedCounters`: a restart's reset counters, a failed scrape,
a late series count once), and every other unit kind's and latency bucket's series apart
(:mod:`wattline.served_series`, as the pod watcher and ``wattline run --metrics`` send them).

A service is a job that does not end: a unit that stops and is back within ``grace`` (a
restart, a crash systemd restarts) goes on in the same job, since its figures over any window
are what an operator asks, and a restart is one of the things a window holds. A unit stopped
longer ends its job at the look that first saw it stopped, after a last scrape at that look
(a server already gone then is one line: what it served since the previous look is lost); one taken out
of the config (an agent restarted without it) gets no more heartbeats, and the lease ends its
job. A unit that runs again after its job closed opens a new job, ``<job>@<its open, unix
seconds>`` (the closed one keeps its close).

What is counted: a unit already running when this agent first looked (the agent started or
restarted since) opens then, counted from its first good scrape, its counters' past as a
baseline, and its CPU time from its second look. One that started while the agent watched opens
at the previous look (it started in between: the window may begin up to a poll interval before
the unit, a stretch in which it used no CPU and served nothing), its counters and CPU time from 0. A unit's
cgroup is made anew at each start, its CPU counter from 0: a counter lower than at the last
look, or a cgroup absent then, counts from 0. A cgroup that went away between two looks leaves
that stretch unmeasured (the report estimates and bounds it).

Each unit's open job (and how many it opened) is kept in a record of the agent's (``state``,
under the outbox root): a restarted agent goes on with that job and its open as sent, rather
than open it again later (the stores keep the last write of an event) or reuse a closed job's
id; a unit that stopped while no agent watched has its job closed after the grace.

Every event's identity is fixed by (job id, host) and its place (open, heartbeat period, CPU
reading, look, close), so a restarted agent sends the same events again and the stores keep one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.agent.holders.slurm.cgroups import CGROUP_DIR
from wattline.agent.holders.systemd.settings import SystemdSettings, UnitService
from wattline.agent.usage import cgroup_cpu
from wattline.agent.usage.cpu_use import CpuTally, cpu_place
from wattline.served_metrics import RESET, ServedCounters
from wattline.served_scrape import ScrapeError, scrape
from wattline.served_series import SeriesBook, ServerSeries, fixed_sender

log = logging.getLogger(__name__)

Deliver = Callable[[wire.pb.Host, list[wire.pb.JobEvent]], None]
Kind = wire.pb.JobEvent

#: Places in a (job, host) event_seq block, as the pod watcher lays them out (CPU periods:
#: ``cpu_use.CPU_AT``); a look's UNITS event: one place per look number.
OPEN_AT, BEATS_AT, SCRAPES_AT, CLOSE_AT = 1, 1 << 28, (1 << 31) + (1 << 29), (1 << 32) - 2
_LOOKS = 1 << 28
#: A scrape's timeout: half the poll interval at most, so a slow endpoint never delays the looks.
SCRAPE_TIMEOUT_S = 5.0


def seq_base(job_id: str, host_id: str) -> int:
    """The (job, host) block's base: ``(1..2**31-1) << 32``, fixed by its identity."""
    digest = int.from_bytes(hashlib.sha256(f"systemd\0{job_id}\0{host_id}".encode()).digest()[:8], "big")
    return (digest % (2**31 - 1) + 1) << 32


@dataclass
class _Unit:
    """One configured unit: what was seen of it, and its job while one is open."""

    service: UnitService
    job_id: str = ""  #: its open job ("": none)
    base: int = 0
    open_ns: int = 0
    stopped_ns: int = 0  #: the look that first saw it stopped while its job is open (0: running)
    beat: int = -1
    counters: ServedCounters | None = None
    server: ServerSeries | None = None  #: its readings as the job's units and its other series' counts
    series: SeriesBook | None = None  #: its job's other series (unit kinds, latency buckets)
    total: float = 0.0  #: units counted in its job so far
    scraped_ns: int = 0
    cpu_last: int | None = None  #: its cgroup's CPU time at the last look (None: none known)
    absent: bool | None = None  #: its cgroup was absent at the last look (None: not looked yet)
    up: bool | None = None  #: its cgroup held processes at the last look (None: not looked yet)
    cpu_total: float = 0.0  #: its CPU time since its baseline, as the tally takes it
    lives: int = 0  #: jobs it has opened
    resume: tuple[str, int] | None = None  #: (job id, open) of a job an earlier agent left open
    good: int = 0  #: good scrapes in its job
    resumed: bool = False  #: its job was opened by an earlier agent (whose running total this one lacks)
    said: set[str] = field(default_factory=set)

    def event(self, kind: wire.pb.JobEvent.Kind, time_ns: int, at: int, **fields: Any) -> wire.pb.JobEvent:
        return wire.JobEvent(job_id=self.job_id, kind=kind, time_ns=time_ns, event_seq=self.base | at, **fields)

    def say(self, line: str) -> None:
        if line not in self.said and len(self.said) < 20:  # a changing error must not fill the log
            self.said.add(line)
            log.warning("unit %s: %s", self.service.unit, line)


class UnitWatcher:
    """Turns the configured units into service jobs (see the module doc); :meth:`run` until stopped."""

    def __init__(
        self,
        settings: SystemdSettings,
        host: wire.pb.Host,
        root: Path,
        deliver: Deliver,
        fetch: Callable[[str, float], str] = scrape,
        state: Path | None = None,
    ) -> None:
        """``state``: where each unit's record is kept across agent restarts (None: not kept)."""
        self.settings, self.host, self.deliver, self.fetch, self.state = settings, host, deliver, fetch, state
        found = cgroup_cpu.mount(root / CGROUP_DIR)
        self.base, self.version = found if found is not None else (root / CGROUP_DIR, 2)
        self.units = [_Unit(s) for s in settings.parsed()]
        for unit in self.units:
            record = self._recorded(unit)
            unit.lives = int(record.get("lives", 0))
            if record.get("job_id") and record.get("host") == host.host_id:
                unit.resume = (str(record["job_id"]), int(record["open_ns"]))
        self.tally = CpuTally()
        self.timeout_s = min(SCRAPE_TIMEOUT_S, settings.poll_interval / 2)
        self.pending: list[wire.pb.JobEvent] = []
        self._last_ns = 0  #: the previous look (0: none: the next look is this agent's first)

    def run(self, stop: threading.Event) -> None:
        """Look every ``poll_interval`` until ``stop``; at its end, nothing is closed (the lease
        or the next agent's looks decide)."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.look()
            except Exception:  # a bug here must not end the agent's sampling
                log.exception("unit watcher: look failed")
            stop.wait(max(0.0, self.settings.poll_interval - (time.monotonic() - started)))

    def look(self, now_ns: int | None = None) -> None:
        """One look at every unit: open, scrape, CPU time, heartbeat, close; then deliver."""
        now = now_ns or time.time_ns()
        number = now // int(self.settings.poll_interval * 1e9)
        changed: set[str] = set()  #: jobs whose unit started or stopped since the last look
        for unit in self.units:
            up = _populated(self.base / "system.slice" / unit.service.unit)
            came_or_went, unit.up = unit.up is not None and up != unit.up, up
            if unit.resume is not None and not up:  # stopped while no agent watched: closes after the grace
                self._open(unit, now)
                unit.stopped_ns = now
            elif up and not unit.job_id:
                self._open(unit, now)
            elif up:
                unit.stopped_ns = 0
            elif unit.job_id and not unit.stopped_ns:
                unit.stopped_ns = now
            if came_or_went and unit.job_id:
                changed.add(unit.job_id)
        self._cpu(now, number, changed)
        for unit in self.units:
            if unit.job_id:
                self._scrape(unit, now, number)
                if unit.stopped_ns and now - unit.stopped_ns >= self.settings.grace * 1e9:
                    self._close(unit)
                else:
                    self._beat(unit, now)
        self._last_ns = now
        self.flush()

    # ----------------------------------------------------------------- the job

    def _open(self, unit: _Unit, now: int) -> None:
        """The unit's job opens: at the previous look where this agent saw it stopped (it started
        since: its CPU time and units from then are its job's), else (running when this agent first
        looked) now, its counters and CPU time from here on."""
        s = unit.service
        unit.resumed = unit.resume is not None
        if unit.resume is not None:  # an earlier agent's job goes on, its open as it was sent
            (unit.job_id, open_ns), unit.resume = unit.resume, None
        else:
            unit.lives += 1
            unit.job_id = s.job_id if unit.lives == 1 else f"{s.job_id}@{now // 10**9}"
            open_ns = self._last_ns or now
        unit.base, unit.open_ns, unit.stopped_ns = seq_base(unit.job_id, self.host.host_id), open_ns, 0
        unit.beat, unit.total, unit.good = -1, 0.0, 0
        self._record(unit)
        # Running when this agent first looked: its counters hold a past that is not (or was already,
        # by an earlier agent) counted; only a series made since (its _created) counts from 0.
        unit.counters = ServedCounters(s.specs, s.latencies, start_ns=now, started_server=bool(self._last_ns))
        unit.server = ServerSeries(s.spec.name)
        sender = fixed_sender("systemd", unit.job_id, self.host.host_id, unit.base, lambda e: self.pending.append(e))
        unit.series = SeriesBook(sender)
        if self._last_ns and unit.absent is not None:  # its CPU time at the previous look is known
            self.tally.start(unit.job_id, self._last_ns, unit.cpu_total, open_ns)
        self.pending.append(
            unit.event(
                Kind.KIND_OPEN,
                open_ns,
                OPEN_AT,
                name=s.name,
                job_kind=s.kind,
                unit_name=s.spec.name,
                labels={"systemd_unit": s.unit},
                service=True,
            )
        )
        log.info("unit %s runs: its service job %s is open", s.unit, unit.job_id)

    def _beat(self, unit: _Unit, now: int) -> None:
        period_ns = max(1, int(wire.heartbeat_s() * 1e9))
        number = now // period_ns
        if number != unit.beat:
            self.pending.append(
                unit.event(Kind.KIND_HEARTBEAT, max(number * period_ns, unit.open_ns), BEATS_AT + number % (1 << 28))
            )
            unit.beat = number

    def _close(self, unit: _Unit) -> None:
        end = max(unit.stopped_ns, unit.open_ns)
        self.pending.append(unit.event(Kind.KIND_CLOSE, end, CLOSE_AT))  # its processes' exit status is unknown here
        log.info(
            "unit %s stopped %.0f s ago: its service job %s is closed",
            unit.service.unit,
            self.settings.grace,
            unit.job_id,
        )
        unit.job_id, unit.counters, unit.server, unit.series = "", None, None, None
        self._record(unit)

    # ----------------------------------------------------------------- across agent restarts

    def _path(self, unit: _Unit) -> Path | None:
        name = hashlib.sha256(unit.service.unit.encode()).hexdigest()[:16]
        return None if self.state is None else self.state / f"{name}.json"

    def _recorded(self, unit: _Unit) -> dict[str, Any]:
        """The unit's record an earlier agent kept ({} where none, or another unit's job's)."""
        path = self._path(unit)
        try:
            record = json.loads(path.read_text()) if path is not None else {}
        except (OSError, ValueError):
            return {}
        same = isinstance(record, dict) and record.get("unit") == unit.service.unit
        job_id = str(record.get("job_id", "")) if same else None
        return record if job_id is not None and (not job_id or job_id.startswith(unit.service.job_id)) else {}

    def _record(self, unit: _Unit) -> None:
        """Keep the unit's open job (or none) and its lives, so that a restarted agent neither
        opens it again later (its open event would replace this one) nor reuses a closed job's id."""
        path = self._path(unit)
        if path is None:
            return
        record = {"unit": unit.service.unit, "host": self.host.host_id, "job_id": unit.job_id,
                  "open_ns": unit.open_ns, "lives": unit.lives}  # fmt: skip
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary = path.with_suffix(".new")
            temporary.write_text(json.dumps(record))
            temporary.replace(path)
        except OSError as exc:
            unit.say(f"its record is not kept in {path.parent}: {exc}")

    # ----------------------------------------------------------------- units

    def _scrape(self, unit: _Unit, now: int, number: int) -> None:
        """The unit's units since its last good scrape, as a UNITS event at this look's place."""
        assert unit.counters is not None and unit.server is not None and unit.series is not None
        t = unit.scraped_ns = max(now, unit.scraped_ns + 1)
        try:
            reading = unit.counters.update(self.fetch(unit.service.metrics, self.timeout_s), t)
        except ScrapeError as exc:
            unit.counters.failed(t, str(exc))
            if not unit.stopped_ns:
                unit.say(f"scrape failed: {exc} (said once; the next good scrape counts what it missed)")
            elif unit.stopped_ns == now:  # the look that saw it stop: its last scrape (later ones: nothing to say)
                log.warning("unit %s stopped: its last scrape failed: %s (what it served since the previous look "
                            "is not counted)", unit.service.unit, exc)  # fmt: skip
            return
        resets = [n.message for n in reading.notes if n.kind == RESET]
        if resets:
            log.info("unit %s: %s", unit.service.unit, resets[0])
        units, extra = unit.server.counts(reading)
        unit.total += units
        unit.good += 1
        # A restarted agent's first scrape, a baseline, takes the odd place: never that of the last look before.
        at = SCRAPES_AT + 2 * (number % _LOOKS) + (unit.good == 1 and not unit.counters.started_server)
        # units_total counts this process's events of the job: a resumed job's would restart from 0
        # under the same event_seq base, so readers sum its events instead
        total = {} if unit.resumed else {"units_total": unit.total}
        self.pending.append(unit.event(Kind.KIND_UNITS, t, at, units=units, **total))
        unit.series.count(extra, t, at)

    # ----------------------------------------------------------------- CPU time

    def _cpu(self, now: int, number: int, changed: set[str]) -> None:
        """One ``cpu:host`` USE event per part of each open job's CPU period since the last look;
        not steady for the ``changed`` jobs (their unit started or stopped inside it: the report
        bounds what spreading its CPU time over the whole period may be off)."""
        values: dict[str, float] = {}
        gaps: set[str] = set()
        for unit in self.units:
            known = self._read_cpu(unit)  # every unit's, so a job that opens now has its baseline
            if not unit.job_id:
                continue
            values[unit.job_id] = unit.cpu_total
            if not known:
                gaps.add(unit.job_id)
        host = cgroup_cpu.usage_ns(self.base, self.version)
        for job_id, parts in self.tally.read(now, host, values, gaps=gaps, changed=changed).items():
            unit = next(u for u in self.units if u.job_id == job_id)
            for p in parts:
                self.pending.append(unit.event(Kind.KIND_USE, p.end_ns, cpu_place(number, p.part), **p.fields()))

    def _read_cpu(self, unit: _Unit) -> bool:
        """Add the unit's CPU time since the last look to its total; False where it is unknown."""
        value = cgroup_cpu.usage_ns(self.base / "system.slice" / unit.service.unit, self.version)
        before, absent = unit.cpu_last, unit.absent
        unit.cpu_last, unit.absent = value, value is None
        if value is None:
            return bool(absent)  # absent at both looks: nothing ran in it; else its last stretch is lost
        if before is not None:
            unit.cpu_total += value - before if value >= before else value  # lower: made anew, from 0
            return True
        if absent:  # made since the last look: its counter started at 0 then
            unit.cpu_total += value
            return True
        return False  # first read, already running: a baseline

    def flush(self) -> None:
        """Hand the pending events to the outbox; kept for the next look if it cannot take them."""
        if not self.pending:
            return
        try:
            self.deliver(self.host, self.pending)
            self.pending = []
        except Exception as exc:
            log.warning("unit watcher: job events kept for the next look: %s", exc)


def _populated(directory: Path) -> bool:
    """Whether the cgroup at ``directory`` holds processes (it or its children)."""
    try:
        for line in (directory / "cgroup.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "populated":
                return value.strip() == "1"
    except OSError:
        pass
    try:
        return bool((directory / "cgroup.procs").read_text().strip())
    except OSError:
        return False
