"""Per-process use tallied by job (:mod:`wattline.agent.usage.process_use`): the figures against what
the test's source says each process used, and what a process costs once its job is known: while
the open jobs stay the same, a listed process is looked up once, however many samples (a pod or
Slurm job's processes, and those of no job, read /proc once, not every second)."""

from __future__ import annotations

from wattline.agent.sources.use import DeviceUse
from wattline.agent.usage.process_use import UseTallies

S = 10**9


class Source:
    """A GPU on which the listed processes used what ``use`` says, each ask."""

    def __init__(self) -> None:
        self.use = {10: 50.0, 11: 30.0, 12: 10.0}

    def process_use(self, since_us: int | None = None) -> list[DeviceUse]:
        return [DeviceUse("gpu", "GPU-a", "sm", frozenset(self.use), dict(self.use))]


def test_a_process_is_looked_up_once_while_the_jobs_stay() -> None:
    source, asked = Source(), []
    jobs = {10: "a", 11: "b"}  # 12: a process of no job (an unselected pod's)

    def job_of(pid: int) -> str | None:
        asked.append(pid)
        return jobs.get(pid)

    tallies = UseTallies()
    for t in range(6):  # the first ask only sets where the next counts from
        tallies.sample([source], job_of, t * S, owners=frozenset({"a", "b"}))
    assert sorted(asked) == [10, 11, 12]
    a, b = tallies.take("a")["gpu:GPU-a"], tallies.take("b")["gpu:GPU-a"]
    assert (a.mine, a.total) == (50.0 * 5 * S, 90.0 * 5 * S) and b.mine == 30.0 * 5 * S

    asked.clear()
    jobs[12] = "c"  # a job opened: every process is asked again
    tallies.sample([source], job_of, 6 * S, owners=frozenset({"a", "b", "c"}))
    assert sorted(asked) == [10, 11, 12] and tallies.take("c")["gpu:GPU-a"].mine == 10.0 * S

    asked.clear()
    del source.use[11]  # gone from the list; its pid back later may be another process's
    tallies.sample([source], job_of, 7 * S, owners=frozenset({"a", "b", "c"}))
    source.use[11] = 30.0
    tallies.sample([source], job_of, 8 * S, owners=frozenset({"a", "b", "c"}))
    assert asked == [11]


def test_without_owners_every_sample_looks_again() -> None:
    """A wrapper's process tree changes under it: it gives no ``owners``, and is asked each time."""
    source, asked = Source(), []
    tallies = UseTallies()
    for t in range(3):
        tallies.sample([source], lambda pid: asked.append(pid) or ("" if pid == 10 else None), t * S)
    assert sorted(asked) == [10, 10, 11, 11, 12, 12]  # the first ask counts nothing: no lookup
