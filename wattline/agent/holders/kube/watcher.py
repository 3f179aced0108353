"""The agent's pod watcher: this node's pods become jobs, their use of the node job data.

Every ``poll_interval`` it reads the node's pod list (:mod:`.podlist`) and, where asked, the
devices the kubelet gave each pod (:mod:`.podresources`). A selected pod (:func:`.pods.job_of`)
opens its job on this host when its first container starts; the pods of one job on this
host share the job's window, which closes when the last of them ends, saying how
(``pod_end``, ``pod_containers``, the exit status). While the job runs the watcher sends
its heartbeats (the lease ends the job if the agent dies) and USE events: the job's CPU
time against the node's (device ``cpu:host``, metric ``cpu-time``: the ``cpu-time`` share
rule splits CPU, DRAM and NIC by it) and, every second, each GPU's per-process use summed
over the job's processes (a process's pod from ``/proc/PID/cgroup``) for GPUs shared by
time-slicing or MPS. A pod that is no job is remembered by UID: one map lookup per poll.
A job whose pods are services (:mod:`.pod_units`) opens as one, and each look scrapes their
metrics: a UNITS event per look with a good scrape, at its time, with the job's running total,
and its other series' counts (:mod:`wattline.served_series`: each unit kind's and latency
bucket's series in an event_seq block of its own, at the look's place); a pod that ended is
scraped a last time before its job closes.

Every event's identity is fixed by (job id, host) and its place (open, heartbeat period,
use period and device, events-file line, service look, close: :mod:`.event_places`), so a
restarted agent sends the same events again and the stores keep one copy. Events go to the
host outbox (``deliver``); what it cannot take now is kept and offered again at the next poll.
A pod's own events file is read by :mod:`.pod_events`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wattline import wire
from wattline.agent.holders.event_lines import line_event
from wattline.agent.holders.kube import podresources
from wattline.agent.holders.kube.cgroups import PodCgroups
from wattline.agent.holders.kube.event_places import (
    CLOSE_AT,
    OPEN_AT,
    beat_place,
    line_place,
    scrape_place,
    seq_base,
    use_place,
)
from wattline.agent.holders.kube.pod_cpu import PodCpu, PodState
from wattline.agent.holders.kube.pod_events import EventsFile
from wattline.agent.holders.kube.pod_units import ServiceUnits
from wattline.agent.holders.kube.podlist import PodList, PodSourceError
from wattline.agent.holders.kube.pods import PRECEDENCE, JobOf, Pod, PodEnd, job_of, pod_end
from wattline.agent.holders.kube.settings import KubeSettings
from wattline.agent.usage.cpu_use import cpu_place
from wattline.agent.usage.process_use import Tally, UseTallies, use_fields
from wattline.served_series import SeriesBook, fixed_sender

log = logging.getLogger(__name__)

Deliver = Callable[[wire.pb.Host, list[wire.pb.JobEvent]], None]
Kind = wire.pb.JobEvent

#: A scrape's timeout: half the poll interval at most, so a slow endpoint never delays the look's pace.
SCRAPE_TIMEOUT_S = 5.0


@dataclass
class NodeJob:
    """One job on this host: its pods here and what has been sent of it."""

    job: JobOf
    base: int
    pods: dict[str, Pod] = field(default_factory=dict)
    ended: dict[str, PodEnd] = field(default_factory=dict)
    opened: bool = False
    open_ns: int = 0  #: its first container's start (0: its pods are all pending yet)
    claimed: set[str] = field(default_factory=set)
    beat: int = -1
    lines: dict[str, EventsFile] = field(default_factory=dict)
    series: SeriesBook | None = None  #: a service's other series (unit kinds, latency buckets)
    scraped_last: set[str] = field(default_factory=set)  #: pods that ended, scraped a last time

    def event(self, kind: wire.pb.JobEvent.Kind, time_ns: int, at: int, **fields: Any) -> wire.pb.JobEvent:
        return wire.JobEvent(job_id=self.job.job_id, kind=kind, time_ns=time_ns, event_seq=self.base | at, **fields)

    @property
    def live(self) -> list[str]:
        return [uid for uid in self.pods if uid not in self.ended]

    @property
    def end_ns(self) -> int:
        """When its last pod here ended (once every one has)."""
        return max(max(e.time_ns for e in self.ended.values()), self.open_ns)

    def cpu_states(self) -> list[PodState]:
        return [PodState(uid, p.started or p.terminal, uid in self.ended) for uid, p in self.pods.items()]


class PodWatcher:
    """Turns the node's pods into job events (see the module doc); :meth:`run` until stopped."""

    def __init__(
        self,
        settings: KubeSettings,
        host: wire.pb.Host,
        root: Path,
        deliver: Deliver,
        use_sources: Callable[[], Sequence[Any]] = list,
    ) -> None:
        self.settings = settings
        self.host = host
        self.root = root
        self.deliver = deliver
        self.use_sources = use_sources
        self.pod_list = PodList(settings)
        self.cgroups = PodCgroups(root)
        self.jobs: dict[str, NodeJob] = {}
        self.not_jobs: set[str] = set()  #: UIDs of pods that stay node energy
        self.closed: set[str] = set()  #: jobs closed here: a later pod of theirs does not reopen them
        self.use = UseTallies()  #: each job's GPU use since its last USE events
        self.cpu = PodCpu(self.cgroups)  #: each job's CPU time against the node's
        self.served = ServiceUnits(min(SCRAPE_TIMEOUT_S, settings.poll_interval / 2))  #: service pods' units
        self.pending: list[wire.pb.JobEvent] = []
        self.errors: dict[str, str] = {}  #: source -> its last error (said once per change)
        self._gpu_from = 0  #: start of the GPU use period being tallied (the previous look)
        self._poll_ns = 0
        self._clock = True  #: the looks take the clock's time (else the caller's)

    # ----------------------------------------------------------------- the loop

    def run(self, stop: threading.Event, sample_s: float = 1.0) -> None:
        """Poll the pods every ``poll_interval`` and sample GPU use every ``sample_s`` until ``stop``."""
        due = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() >= due:
                    due = time.monotonic() + self.settings.poll_interval
                    self.poll()
                else:
                    self.sample_use()
            except Exception:  # a bug here must not end the agent's sampling
                log.exception("pod watcher: pass failed")
            stop.wait(sample_s)

    def _said(self, source: str, error: str | None) -> None:
        """Report a failing source once per new error, and its recovery."""
        if error != self.errors.get(source):
            if error:
                log.warning("pod watcher: %s (the other sources go on)", error)
            elif source in self.errors:
                log.info("pod watcher: %s answers again", source)
        if error:
            self.errors[source] = error
        else:
            self.errors.pop(source, None)

    def poll(self, now_ns: int | None = None) -> None:
        """One look at the pods: open, close, heartbeat, CPU and GPU use, events-file lines
        (``now_ns``: the look's time, else the clock's: the CPU time then when it is read)."""
        self._clock = now_ns is None
        now_ns = self._poll_ns = now_ns or time.time_ns()
        listed: set[str] = set()
        try:
            # Pods already judged no job are not parsed again: one set lookup each per poll.
            pods: list[Pod] | None = self.pod_list.fetch(self.not_jobs, listed)
            self._said("pod list", None)
        except PodSourceError as exc:
            pods = None  # unknown: the jobs keep their lease until the list answers again
            self._said("pod list", str(exc))
        devices = self._devices() if pods is not None else {}
        self.sample_use(now_ns)
        if pods is not None:
            self._track(pods, listed, devices, now_ns)
        self._cpu(now_ns, listed if pods is not None else None)  # a closing job's last period before its close
        for nj in list(self.jobs.values()):
            self._tend(nj, now_ns)
        self._units(now_ns)  # a pod that ended: its last scrape, before its job's close
        for nj in list(self.jobs.values()):
            if nj.opened and not nj.live:
                self._close(nj)
        for nj in self.jobs.values():
            self._flush_use(nj, now_ns)
        self._gpu_from = now_ns
        self.flush()

    def _devices(self) -> dict[tuple[str, str], podresources.PodDevices]:
        if not self.settings.pod_resources_socket:
            return {}
        try:
            found = podresources.list_devices(self.settings.pod_resources_socket)
            self._said("pod-resources", None)
            return found
        except OSError as exc:
            self._said("pod-resources", str(exc))
            return {}

    # ----------------------------------------------------------------- pods -> jobs

    def _track(
        self, pods: Iterable[Pod], listed: set[str], devices: dict[tuple[str, str], podresources.PodDevices], now: int
    ) -> None:
        """``pods``: the parsed pods; ``listed``: every uid of the list, parsed or not."""
        for pod in pods:
            if pod.uid in self.not_jobs:
                continue
            job = job_of(pod, self.settings.pod_labels)
            if job is None or job.job_id in self.closed:
                self.not_jobs.add(pod.uid)
                continue
            nj = self.jobs.get(job.job_id)
            if nj is None:  # pending pods too: their cgroups are read from now, so a job's first period is known
                nj = self.jobs[job.job_id] = NodeJob(job, seq_base(job.job_id, self.host.host_id))
            if pod.uid not in nj.pods:
                self.served.see(job.job_id, pod, now)
            nj.pods[pod.uid] = pod
            given = devices.get((pod.namespace, pod.name))
            if given is not None and not nj.opened:
                nj.claimed |= given.claimed
            if pod.terminal and pod.uid not in nj.ended:
                nj.ended[pod.uid] = pod_end(pod, False, now)
            if not nj.opened and (pod.started or pod.terminal):  # its work has begun: the job opens then
                start = pod.started_ns or now
                nj.open_ns = min(nj.open_ns or start, start)
        self.not_jobs &= listed  # forget pods that left the list
        for nj in self.jobs.values():
            for uid, pod in nj.pods.items():
                if uid not in listed and uid not in nj.ended:
                    nj.ended[uid] = pod_end(pod, True, now)

    def _tend(self, nj: NodeJob, now: int) -> None:
        if not nj.open_ns:  # pending still, or gone before any container started: no job here
            if not nj.live:
                del self.jobs[nj.job.job_id]
                self.served.forget(nj.job.job_id, list(nj.pods))
                for uid in nj.pods:
                    self.cgroups.forget(uid)
            return
        if not nj.opened:
            labels = dict(nj.job.labels)
            unit = self.served.unit_of(nj.job.job_id)
            if len(nj.pods) > 1:
                labels["pod"] = ",".join(sorted(p.name for p in nj.pods.values()))[:256]
            self.pending.append(
                nj.event(
                    Kind.KIND_OPEN,
                    nj.open_ns,
                    OPEN_AT,
                    name=nj.job.name,
                    job_kind="other",
                    unit_name=unit or "units",
                    labels=labels,
                    devices=sorted(nj.claimed),
                    service=unit is not None,
                )
            )
            nj.opened = True
        for uid in list(nj.pods):
            self._read_lines(nj, uid)
        if nj.live:
            period_ns = max(1, int(wire.heartbeat_s() * 1e9))
            number = now // period_ns
            if number != nj.beat:
                beat_ns = max(number * period_ns, nj.open_ns)
                self.pending.append(nj.event(Kind.KIND_HEARTBEAT, beat_ns, beat_place(number)))
                nj.beat = number

    def _close(self, nj: NodeJob) -> None:
        """The job's close: every pod of it here has ended."""
        worst = min(nj.ended.values(), key=lambda e: PRECEDENCE.index(e.state))
        end_ns = nj.end_ns
        self._flush_use(nj, end_ns)
        self.pending.append(
            nj.event(
                Kind.KIND_CLOSE,
                end_ns,
                CLOSE_AT,
                exit_code=worst.exit_code,
                pod_end=worst.state,
                pod_containers=",".join(e.containers for e in nj.ended.values() if e.containers)[:1024],
                use_scope=sorted(self.use.scope),
            )
        )
        del self.jobs[nj.job.job_id]
        self.closed.add(nj.job.job_id)
        self.served.forget(nj.job.job_id, list(nj.pods))
        for uid in nj.pods:
            self.cgroups.forget(uid)
            self.not_jobs.add(uid)

    # ----------------------------------------------------------------- use

    def _look(self) -> int:
        """The number of the current look (looks are a poll_interval apart)."""
        return self._poll_ns // int(self.settings.poll_interval * 1e9)

    def _use_event(self, nj: NodeJob, device: str, end_ns: int, span_ns: int, use: Tally) -> wire.pb.JobEvent:
        """``use``: the job's and every process's use of ``device`` over the period of
        ``span_ns`` ending at ``end_ns`` (integrated over the time its asks covered)."""
        fields = use_fields(device, span_ns, use.mine, use.total, use.metric, use.covered_ns)
        return nj.event(Kind.KIND_USE, end_ns, use_place(self._look(), device, self.use.scope), **fields)

    def _cpu(self, now: int, listed: set[str] | None) -> None:
        """One ``cpu:host`` USE event per open job whose CPU time since the last look is known:
        its pods' CPU time against every process's (:mod:`.pod_cpu`); a job whose pods all
        ended, to its end."""
        opens = {j: nj.open_ns for j, nj in self.jobs.items() if nj.open_ns}
        ends = {j: nj.end_ns for j, nj in self.jobs.items() if nj.open_ns and not nj.live}
        states = {j: nj.cpu_states() for j, nj in self.jobs.items()}
        number = self._look()
        # stamped when the cgroups are read, after the list answered (a busy node's answer comes
        # late: the CPU time read then is not the CPU time at the look's start)
        read_ns = time.time_ns() if self._clock else now
        for job_id, parts in self.cpu.read(read_ns, states, opens, ends, listed).items():
            nj = self.jobs[job_id]
            kept = self.cpu.jobs[job_id]
            reading = kept.reading if parts and parts[0].replaces else number
            kept.reading = reading
            for p in parts:
                self.pending.append(nj.event(Kind.KIND_USE, p.end_ns, cpu_place(reading, p.part), **p.fields()))

    def sample_use(self, now_ns: int | None = None) -> None:
        """Ask the per-process sources once; add each job's use of each GPU since the last ask."""
        pod_job = {uid: nj.job.job_id for nj in self.jobs.values() for uid in nj.live}

        def job_of_pid(pid: int) -> str | None:
            uid = self.cgroups.pod_of_pid(pid)
            return None if uid is None else pod_job.get(uid)

        sources = self.use_sources() if self.jobs else ()
        owners = frozenset(pod_job.items())
        for error in self.use.sample(sources, job_of_pid, now_ns or time.time_ns(), owners=owners):
            self._said("per-process use", error)

    def _flush_use(self, nj: NodeJob, end_ns: int) -> None:
        span = end_ns - self._gpu_from if self._gpu_from else 0
        tallies = self.use.take(nj.job.job_id)
        for device, t in sorted(tallies.items()) if span > 0 else ():
            # A pod that ended between two asks: the last that saw its processes reached past its end.
            self.pending.append(self._use_event(nj, device, end_ns, span, t))

    # ----------------------------------------------------------------- units from inside

    def _units(self, now: int) -> None:
        """Each open service job's units since its last UNITS event, from its live pods' scrapes
        and the last scrape of each pod that ended since the previous look; its other series too."""
        asks: dict[str, list[Pod]] = {}
        ended: set[str] = set()
        for job_id, nj in self.jobs.items():
            if nj.opened:
                last = [uid for uid in nj.ended if uid not in nj.scraped_last]
                nj.scraped_last.update(last)
                ended.update(last)
                asks[job_id] = [nj.pods[uid] for uid in (*nj.live, *last)]
        look = self._look()
        for job_id, c in self.served.count(asks, None if self._clock else now, ended).items():
            nj = self.jobs[job_id]
            at = scrape_place(look, c.first)
            time_ns = max(c.time_ns, nj.open_ns)  # a kubelet's clock ahead of ours: never before the open
            if not nj.live:  # its last scrapes: what they count was served by its end
                time_ns = max(min(time_ns, nj.end_ns), nj.open_ns)
            self.pending.append(nj.event(Kind.KIND_UNITS, time_ns, at, units=c.units, units_total=c.total))
            if c.extra:
                if nj.series is None:
                    sender = fixed_sender("k8s", job_id, self.host.host_id, nj.base, self._pend)
                    nj.series = SeriesBook(sender)
                nj.series.count(c.extra, time_ns, at)

    def _read_lines(self, nj: NodeJob, uid: str) -> None:
        """New complete lines of the pod's events file as UNITS/PHASE events at their place."""
        state = nj.lines.setdefault(uid, EventsFile())
        lines = state.new_lines(self.root, uid)
        where = f"pod {uid} of job {nj.job.job_id[:100]}: events file"
        for line in lines:
            state.number += 1
            event = line_event(line, where)
            if event is not None:
                kind, fields, stamp = event
                at = line_place(uid, state.number)
                self.pending.append(nj.event(kind, max(stamp or time.time_ns(), nj.open_ns), at, **fields))

    # ----------------------------------------------------------------- delivery

    def _pend(self, event: wire.pb.JobEvent) -> None:
        self.pending.append(event)  # the list of the moment: flush replaces it

    def flush(self) -> None:
        """Hand the pending events to the outbox; kept for the next poll if it cannot take them."""
        if not self.pending:
            return
        try:
            self.deliver(self.host, self.pending)
            self.pending = []
            self._said("outbox", None)
        except Exception as exc:
            self._said("outbox", f"job events kept for the next poll: {exc}")
