"""A service pod's units, counted from its own Prometheus endpoint (docs/operations/kubernetes.md,
"Services: units from a pod's own metrics").

A job's pod annotated with :data:`COUNT` (unit specs, one a line, :mod:`wattline.served_specs`)
or :data:`PRESET` (a known server) is a service: its job's open says so, the first spec's NAME
(the preset's first unit) is the job's unit, and at every look the watcher scrapes the pod at
``http://POD_IP:PORT/PATH`` (:data:`METRICS`, else the common ``prometheus.io/port`` and
``prometheus.io/path``) and counts what its counters rose (:class:`ServedCounters`: resets,
late series, failed scrapes). Every other unit kind (a preset's tokens per model) and a preset's
latency histograms are counted too, each series apart (:mod:`wattline.served_series`, as
``wattline run --metrics`` counts them). A pod that ended (deleted, or its containers exited) is
scraped once more at the look that sees it end, before its job closes, so the requests it
finished since the previous look count; a server already gone then is one line. Only the pod's
own IP is scraped: an absolute URL in an annotation would let whoever writes pods make the agent
ask any address its network reaches.

What is counted: a pod first seen before its containers started is counted from 0; one
already running when this agent first saw it (the agent started, or restarted, since) from
its first good scrape on, as a baseline (a series whose ``_created`` is at or after that
first sight counts from 0). So a restarted agent never counts a server's past twice; what was
served while no agent watched is not counted.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from wattline.agent.holders.kube.pods import Pod
from wattline.served_metrics import REFUSED, RESET, RETURNED, ServedCounters
from wattline.served_scrape import ScrapeError, scrape
from wattline.served_series import SeriesCount, ServerSeries, added
from wattline.served_specs import Spec, service_specs
from wattline.text import clip

log = logging.getLogger(__name__)

#: The annotations a service pod carries: what to count (one of the first two), and where.
COUNT, PRESET, METRICS = "wattline.io/count", "wattline.io/preset", "wattline.io/metrics"
#: Where, when :data:`METRICS` is absent: the annotations many charts already set for Prometheus.
PROMETHEUS_PORT, PROMETHEUS_PATH, PROMETHEUS_SCHEME = "prometheus.io/port", "prometheus.io/path", "prometheus.io/scheme"
DEFAULT_PATH = "/metrics"
#: ``[:]PORT[/PATH]``: a path of printable ASCII, no space, backslash or fragment.
_WHERE = re.compile(r":?([0-9]{1,5})(/[!-\[\]-~]{0,255})?")
#: Note kinds said (once each): what changes how far a pod's count can be trusted.
SAID_NOTES = (RESET, RETURNED, REFUSED)
#: Most distinct lines said about one pod's scrapes (a changing error must not fill the log).
MAX_SAID = 20
#: Scrapes under way at once: a node's slow endpoints cost one timeout per look, not one each.
WORKERS = 8


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where on its IP a service pod exposes its metrics, and what to count there: its unit
    specs (the job's own first) and latency histograms."""

    port: int
    path: str
    specs: tuple[Spec, ...]
    latencies: tuple[Spec, ...] = ()

    @property
    def spec(self) -> Spec:
        """The job's own unit."""
        return self.specs[0]

    def url(self, ip: str) -> str:
        return f"http://{f'[{ip}]' if ':' in ip else ip}:{self.port}{self.path}"


def endpoint_of(annotations: Mapping[str, str]) -> Endpoint | None:
    """The pod's endpoint; None when it asks for no units; ValueError (one line) when it asks badly."""
    if not any(key in annotations for key in (COUNT, PRESET, METRICS)):
        return None
    count, name = annotations.get(COUNT), annotations.get(PRESET)
    if (count is None) == (name is None):
        neither = "both are given" if count is not None else "neither is given"
        raise ValueError(f"give one of {COUNT} (a unit spec) and {PRESET} (a known server): {neither}")
    specs, latencies = service_specs(count, name)
    key, where = METRICS, annotations.get(METRICS)
    if where is None:
        scheme = annotations.get(PROMETHEUS_SCHEME, "http")
        if scheme != "http":
            raise ValueError(f"{PROMETHEUS_SCHEME} {clip(scheme)}: only http is scraped (a pod IP has no certificate)")
        if PROMETHEUS_PORT not in annotations:
            raise ValueError(f"no {METRICS} (or {PROMETHEUS_PORT}): where are the metrics?")
        path = annotations.get(PROMETHEUS_PATH, DEFAULT_PATH)
        key, where = PROMETHEUS_PORT, annotations[PROMETHEUS_PORT] + ("" if path.startswith("/") else "/") + path
    match = _WHERE.fullmatch(where)
    if match is None or not 0 < int(match.group(1)) < 65536:
        raise ValueError(f"{key} {clip(where)}: expected PORT[/PATH] on the pod's IP, e.g. 8000/metrics")
    return Endpoint(int(match.group(1)), match.group(2) or DEFAULT_PATH, specs, latencies)


@dataclass
class _Served:
    """One service pod's counting."""

    name: str  #: namespace/name, for its lines
    endpoint: Endpoint
    counters: ServedCounters
    server: ServerSeries  #: its reading as the job's units and its other series' counts
    ip: str = ""  #: its IP when last listed with one (a pod that ended may be listed without)
    good: int = 0  #: good scrapes so far
    last_ns: int = 0
    said: set[str] = field(default_factory=set)

    def say(self, line: str) -> None:
        """``line`` once; past :data:`MAX_SAID` lines, nothing more."""
        if line not in self.said and len(self.said) < MAX_SAID:
            self.said.add(line)
            log.warning("pod %s: %s", self.name, line)


@dataclass(frozen=True, slots=True)
class Counted:
    """A job's units at one look: its UNITS event's time, units, running total here, whether
    it is only its pods' first readings (a restarted agent's baseline: its place differs), and
    its other series' counts (its pods' added)."""

    time_ns: int
    units: float
    total: float
    first: bool
    extra: tuple[SeriesCount, ...] = ()


class ServiceUnits:
    """The service pods of the node's jobs, each scraped at every look (``timeout_s`` at most)."""

    def __init__(self, timeout_s: float, fetch: Callable[[str, float], str] = scrape) -> None:
        self.timeout_s, self.fetch = timeout_s, fetch
        self.pods: dict[str, _Served | None] = {}  #: uid -> its counting (None: not counted)
        self.units: dict[str, str] = {}  #: job id -> its unit ("": a service asked badly, no units)
        self.totals: dict[str, float] = {}  #: job id -> its units counted here so far
        self._pool: ThreadPoolExecutor | None = None

    def see(self, job_id: str, pod: Pod, now_ns: int) -> None:
        """A job's pod, at its first sight: whether and what it counts (a bad annotation: one line)."""
        if pod.uid in self.pods:
            return
        self.pods[pod.uid] = None
        name = f"{pod.namespace}/{pod.name}"
        try:
            endpoint = endpoint_of(pod.annotations)
        except ValueError as exc:
            log.warning("pod %s: %s; its job is a service without units", name, exc)
            self.units.setdefault(job_id, "")
            return
        if endpoint is None:
            return
        unit = self.units[job_id] = self.units.get(job_id) or endpoint.spec.name
        if unit != endpoint.spec.name:
            log.warning("pod %s counts %s but its job counts %s: not counted", name, endpoint.spec.name, unit)
            return
        # Started before this agent saw it: its counters hold a past that is not (or was already) counted.
        started = not (pod.started or pod.terminal)
        counters = ServedCounters(endpoint.specs, endpoint.latencies, start_ns=now_ns, started_server=started)
        self.pods[pod.uid] = _Served(name, endpoint, counters, ServerSeries(endpoint.spec.name), pod.ip)

    def unit_of(self, job_id: str) -> str | None:
        """The job's unit when it is a service ("": without units), else None."""
        return self.units.get(job_id)

    def forget(self, job_id: str, uids: Sequence[str]) -> None:
        for uid in uids:
            self.pods.pop(uid, None)
        self.units.pop(job_id, None)
        self.totals.pop(job_id, None)

    def count(
        self, live: Mapping[str, Sequence[Pod]], now_ns: int | None = None, last: Collection[str] = ()
    ) -> dict[str, Counted]:
        """Scrapes every counted pod of ``live`` (job id -> its pods to scrape) at once; each job's
        units since its previous count, at its last answer's time (``now_ns``: the caller's).
        ``last``: the uids of pods that ended, scraped a last time (a failure is said, always)."""
        asks = []
        for job_id, pods in live.items():
            for pod in pods:
                served = self.pods.get(pod.uid)
                if served is not None and (pod.ip or served.ip):
                    served.ip = pod.ip or served.ip
                    asks.append((job_id, served, pod.uid in last))
        if not asks:
            return {}
        self._pool = self._pool or ThreadPoolExecutor(WORKERS, thread_name_prefix="wattline-scrape")
        pool = self._pool
        answers = [pool.submit(self._scrape, served.endpoint.url(served.ip)) for _job, served, _last in asks]
        counted: dict[str, Counted] = {}
        for (job_id, served, final), answer in zip(asks, answers, strict=True):
            text, error, answered_ns = answer.result()
            served.last_ns = t = max(now_ns or answered_ns, served.last_ns + 1)
            try:
                if text is None:
                    raise ScrapeError(error)
                reading = served.counters.update(text, t)
            except ScrapeError as exc:
                served.counters.failed(t, str(exc))
                if final:  # not once: each pod has one last scrape
                    log.warning("pod %s ended: its last scrape failed: %s (what it served since the previous "
                                "look is not counted; its job closes)", served.name, exc)  # fmt: skip
                else:
                    served.say(f"scrape failed: {exc} (said once; the next good scrape counts what it missed)")
                continue
            served.good += 1
            if served.good == 1 and not reading.units:
                served.say(f"exposes no series {served.endpoint.spec} selects: none counted until one appears")
            for kind in SAID_NOTES:  # a restart resets every series: one line, not one per series
                said = [note.message for note in reading.notes if note.kind == kind]
                if said:
                    served.say(said[0] + (f" (and {len(said) - 1} more series)" if len(said) > 1 else ""))
            units, extra = served.server.counts(reading)
            total = self.totals[job_id] = self.totals.get(job_id, 0.0) + units
            first = served.good == 1
            before = counted.get(job_id)
            if before is not None:
                units, t, first = units + before.units, max(t, before.time_ns), first and before.first
                extra = added([*before.extra, *extra])
            counted[job_id] = Counted(t, units, total, first, tuple(extra))
        return counted

    def _scrape(self, url: str) -> tuple[str | None, str, int]:
        """(the exposition or None, why not, when it answered): run in the pool."""
        try:
            return self.fetch(url, self.timeout_s), "", time.time_ns()
        except ScrapeError as exc:
            return None, str(exc), time.time_ns()
