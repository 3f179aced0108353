"""The pod-jobs' CPU time against the node's, from the pods' cgroups, as ``cpu:host`` periods.

At each look at the pod list the watcher reads the cgroup of every pod of a job, pending
ones included, and the node's (:class:`.cgroups.PodCgroups`); a job's CPU time is the sum
of its pods'. Where a pod's reading has a baseline:

* a pod read while pending: from that reading (what it did before was no job's window);
* a pod whose cgroup is not there yet (pending, or not made when first listed): from 0 (the
  kernel's counter starts with the cgroup);
* a pod that was not in the previous list: from 0 since that list (its cgroup is newer);
* a pod already running when first read (the watcher's first look, an agent restarted),
  or read again after its cgroup could not be read: none, so its job has no period from
  the look before (that stretch is the report's to estimate and bound), and one from this
  look on.

A pod that ended is read once more, its counter frozen since its end, and not again. So a
job's first period runs from its open (its first container's start) and its last to its
end (:class:`wattline.agent.usage.cpu_use.CpuTally`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from wattline.agent.holders.kube.cgroups import PodCgroups
from wattline.agent.usage.cpu_use import CpuPeriod, CpuTally


@dataclass
class JobCpu:
    """One job's CPU bookkeeping: its pods' last readings and its own total."""

    pods: dict[str, int] = field(default_factory=dict)  #: pod UID -> its last reading (0: no cgroup yet)
    done: set[str] = field(default_factory=set)  #: pods whose last reading (after their end) was taken
    total_ns: float = 0.0  #: the job's CPU time since its pods' baselines
    reading: int = 0  #: the number of the look that made its last periods (one sent again goes there)


@dataclass(frozen=True)
class PodState:
    """What the CPU reading needs of a job's pod at this look."""

    uid: str
    started: bool  #: a container runs or ran
    ended: bool  #: its end is known (listed terminal, or gone from the list)


class PodCpu:
    """See the module doc; :meth:`read` at each look."""

    def __init__(self, cgroups: PodCgroups) -> None:
        self.cgroups = cgroups
        self.tally = CpuTally()
        self.jobs: dict[str, JobCpu] = {}
        self._listed: frozenset[str] | None = None  #: the pods of the previous list (None: none yet)
        self._last_ns: int | None = None  #: when the previous list was read

    def read(
        self,
        now_ns: int,
        pods: Mapping[str, Iterable[PodState]],
        opens: Mapping[str, int],
        ends: Mapping[str, int],
        listed: Collection[str] | None,
    ) -> dict[str, list[CpuPeriod]]:
        """The periods of the jobs (job -> its pods) that end at this look; ``opens``: the jobs
        whose window has opened (its start); ``ends``: those whose every pod ended (when);
        ``listed``: every pod of this look's list (None: the list did not answer)."""
        values: dict[str, float | None] = {}
        gaps: set[str] = set()
        for job, states in pods.items():
            new = job not in self.jobs
            kept = self.jobs.setdefault(job, JobCpu())
            if not self._job(kept, list(states)):
                gaps.add(job)
            elif new and self._last_ns is not None:  # its pods' baselines hold since the last look
                self.tally.start(job, self._last_ns)
            values[job] = kept.total_ns
        for job, open_ns in opens.items():
            self.tally.opened(job, open_ns)
        periods = self.tally.read(now_ns, self.cgroups.host_cpu_ns(), values, ends, gaps)
        for gone in set(self.jobs) - set(pods):
            del self.jobs[gone]
        if listed is not None:
            self._listed, self._last_ns = frozenset(listed), now_ns
        return {job: p for job, p in periods.items() if job in opens}

    def _job(self, job: JobCpu, states: list[PodState]) -> bool:
        """Add the job's pods' CPU time since the last look to its total; False where one pod's
        is unknown (the total then lacks it: the job's period since the last look is unknown)."""
        delta, known = 0.0, True
        for pod in states:
            if pod.uid in job.done:
                continue
            value = self.cgroups.pod_cpu_ns(pod.uid)
            before = job.pods.get(pod.uid)
            if pod.ended:
                job.done.add(pod.uid)
            if value is None:
                if before:  # read before, unreadable now (gone with its pod): what it ran since is unknown
                    del job.pods[pod.uid]
                    known = False
                elif before is None and not pod.ended:
                    job.pods[pod.uid] = 0  # its cgroup is still to be made: its counter starts at 0
                continue
            if before is None:
                before = value if not pod.started and not pod.ended else (0 if self._fresh(pod) else None)
            job.pods[pod.uid] = value
            if before is None:
                known = False
            else:
                delta += max(0, value - before)
        job.total_ns += delta
        return known

    def _fresh(self, pod: PodState) -> bool:
        """Whether the pod was not in the previous list (its cgroup, if any, is newer than it)."""
        return self._listed is not None and pod.uid not in self._listed
