"""A job's CPU time against the host's (issue #42): the one tally every holder uses
(:class:`wattline.agent.usage.cpu_use.CpuTally`) and the wrapper's process-tree reader
(:class:`wattline.jobs.wrappers.processes.TreeCpu`).

Truths are constructed: counters advanced at known rates (the host's other processes at
``OTHERS`` CPUs, a job at ``JOB`` CPUs from its start to its end), ``/proc`` stat lines in the
recorded format (fixtures/proc) with known ticks, and real processes whose CPU time the
kernel reports to their parent at reaping (``os.wait4``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wattline.agent.usage.cpu_use import NS_PER_TICK, CpuTally, host_cpu_ns
from wattline.jobs.wrappers.processes import ProcessTree, TreeCpu

S = 10**9
OTHERS, JOB = 1.5, 0.75  #: CPUs the other processes and the job keep busy
FIXTURES = Path(__file__).parents[1] / "fixtures/proc"


def host_at(t: float, start: float, end: float) -> float:
    """The host's CPU time (ns) at ``t`` s: the others' and the job's while it ran."""
    return (OTHERS * t + JOB * max(0.0, min(t, end) - start)) * S


def job_at(t: float, start: float, end: float) -> float:
    return JOB * max(0.0, min(t, end) - start) * S


def share(period: object) -> float:
    return period.job_ns / period.host_ns  # type: ignore[attr-defined]


def test_a_job_starting_and_ending_between_readings_is_read_from_its_start_to_its_end() -> None:
    """Readings every 5 s; the job starts at 2 s (its counter from 0) and ends at 12.5 s. Its
    periods are (2, 5], (5, 10], (10, 12.5]: its CPU time in each, and the host's there (its
    own plus the others' at their rate), so its part is JOB / (JOB + OTHERS) in each, where
    a period of the readings would have given it less at both ends."""
    tally, start, end = CpuTally(), 2.0, 12.5
    tally.read(0, host_at(0, start, end), {})
    tally.start("j", int(start * S), 0.0, int(start * S))
    got = []
    for t in (5.0, 10.0, 15.0):
        ends = {"j": int(end * S)} if t > end else {}
        got += tally.read(int(t * S), host_at(t, start, end), {"j": job_at(t, start, end)}, ends)["j"]
    assert [(p.start_ns, p.end_ns) for p in got] == [(2 * S, 5 * S), (5 * S, 10 * S), (10 * S, 12_500_000_000)]
    assert [p.job_ns / S for p in got] == pytest.approx([3 * JOB, 5 * JOB, 2.5 * JOB])
    assert [share(p) for p in got] == pytest.approx([JOB / (JOB + OTHERS)] * 3)
    assert not tally.known("j")  # forgotten at its end


def test_an_end_learnt_after_the_next_reading_cuts_the_period_that_reached_past_it() -> None:
    """The job ends at 12.5 s, but its holder learns it only at the reading of 20 s (a pod's
    status comes late): the period (10, 15] sent at 15 s held its CPU time over 2.5 s only;
    it is sent again as (10, 12.5], in its place."""
    tally, start, end = CpuTally(), 0.0, 12.5
    tally.read(0, host_at(0, start, end), {})
    tally.start("j", 0, 0.0, 0)
    for t in (5.0, 10.0, 15.0):
        tally.read(int(t * S), host_at(t, start, end), {"j": job_at(t, start, end)})
    [again] = tally.read(20 * S, host_at(20, start, end), {"j": job_at(20, start, end)}, {"j": int(end * S)})["j"]
    assert again.replaces and (again.start_ns, again.end_ns) == (10 * S, 12_500_000_000)
    assert again.job_ns == pytest.approx(2.5 * JOB * S)
    assert share(again) == pytest.approx(JOB / (JOB + OTHERS))


def test_a_period_is_cut_where_another_job_starts_or_ends_inside_it() -> None:
    """Readings every 5 s; A runs throughout at 1 CPU, B from 6.5 s to 8 s at 2 CPUs, the other
    processes at OTHERS. A's period (5, 10] is cut at 6.5 and 8 s: its share in each part is
    exact (1 / (1 + OTHERS), 1 / (3 + OTHERS), then again), where one mean over the period would
    have given it the same share throughout."""
    tally, cpus = CpuTally(), {"a": (0.0, 100.0, 1.0), "b": (6.5, 8.0, 2.0)}

    def used(job: str, t: float) -> float:
        start, end, n = cpus[job]
        return n * max(0.0, min(t, end) - start) * S

    def host(t: float) -> float:
        return OTHERS * t * S + used("a", t) + used("b", t)

    tally.read(0, host(0), {})
    tally.start("a", 0)
    tally.read(5 * S, host(5), {"a": used("a", 5)})
    tally.start("b", int(6.5 * S), 0.0, int(6.5 * S))
    got = tally.read(10 * S, host(10), {"a": used("a", 10), "b": used("b", 10)}, {"b": 8 * S})
    assert [(p.start_ns / S, p.end_ns / S, p.part) for p in got["a"]] == [(5, 6.5, 0), (6.5, 8, 1), (8, 10, 2)]
    assert [share(p) for p in got["a"]] == pytest.approx([1 / (1 + OTHERS), 1 / (3 + OTHERS), 1 / (1 + OTHERS)])
    assert [share(p) for p in got["b"]] == pytest.approx([2 / (3 + OTHERS)])


def test_a_reading_that_fails_leaves_no_period_and_the_next_ones_start_afresh() -> None:
    tally = CpuTally()
    tally.read(0, 0.0, {})
    tally.start("j", 0)
    times = [5, 10, 15, 20]
    values: list[float | None] = [5 * S, None, 15 * S, 20 * S]
    got = {t: tally.read(t * S, t * 2.0 * S, {"j": v}) for t, v in zip(times, values, strict=True)}
    assert [t for t, p in got.items() if p] == [5, 20]  # 10: unread; 15: its new baseline
    assert [share(p) for p in got[20]["j"]] == pytest.approx([0.5])


def test_without_a_host_counter_the_jobs_are_the_host() -> None:
    """Where every process's CPU time is not accounted (no root cgroup counter), two jobs at
    1 and 3 CPUs get a quarter and three quarters of what they used together."""
    tally = CpuTally()
    for job in ("a", "b"):
        tally.start(job, 0)
    got = tally.read(10 * S, None, {"a": 10.0 * S, "b": 30.0 * S})
    assert {j: share(p) for j, [p] in got.items()} == pytest.approx({"a": 0.25, "b": 0.75})


def test_the_hosts_cpu_time_is_read_from_proc_stat(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text((FIXTURES / "stat.txt").read_text() + "cpu0 1 2 3 4 5 6 7 8 9 10\n")
    # user 183542, nice 27, system 29839, irq 0, softirq 713 (idle, iowait, steal: no process's)
    assert host_cpu_ns(tmp_path) == (183542 + 27 + 29839 + 0 + 713) * NS_PER_TICK
    (tmp_path / "stat").write_text("intr 1 2 3\n")
    assert host_cpu_ns(tmp_path) is None
    assert host_cpu_ns(tmp_path / "missing") is None


class FakeTree(ProcessTree):
    """A tree whose members the test names (their stat files are under the test's /proc)."""

    def __init__(self) -> None:
        super().__init__([])
        self.members: set[int] = set()

    def refresh(self) -> frozenset[int]:
        self.current = frozenset(self.members)
        return self.current


def write_stat(proc: Path, pid: int, ppid: int, start: int, own: int, reaped: int) -> None:
    """A process's stat line in the recorded shape: ``own`` ticks (utime), ``reaped`` its
    reaped children's (cutime)."""
    fields = (FIXTURES / "pid_stat.txt").read_text().strip()
    comm_end = fields.rindex(")")
    rest = fields[comm_end + 2 :].split()
    rest[1], rest[11], rest[12], rest[13], rest[14], rest[19] = str(ppid), str(own), "0", str(reaped), "0", str(start)
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "stat").write_text(f"{pid} {fields[fields.index('(') : comm_end + 1]} {' '.join(rest)}\n")


def test_a_process_tree_counts_reaped_children_once_and_an_orphans_last_read(tmp_path: Path) -> None:
    """Root 10 with children 11 and 12, and 12's child 13. 11 and 12 end and 10 reaps them
    (10's cutime takes all of theirs, more than last read); 13, orphaned by 12, is reparented
    to init and reaped there (its ticks as last read count, what it did after does not); a
    new process reuses pid 13 (another start: not the job's); the total never goes back."""
    proc, tree = tmp_path / "proc", FakeTree()
    cpu = TreeCpu(tree, proc)
    tree.members = {10, 11, 12, 13}
    write_stat(proc, 10, 1, 100, 40, 0)
    write_stat(proc, 11, 10, 110, 20, 0)
    write_stat(proc, 12, 10, 120, 30, 0)
    write_stat(proc, 13, 12, 130, 10, 0)
    assert cpu.read() == 100 * NS_PER_TICK
    tree.members = {10}  # 13 left the tree with its parent
    write_stat(proc, 10, 1, 100, 45, 25 + 35)  # 11 ended at 25 ticks, 12 at 35: 10 reaped both
    write_stat(proc, 13, 1, 130, 12, 0)
    for gone in (11, 12):
        (proc / str(gone) / "stat").unlink()
    assert cpu.read() == (45 + 60 + 12) * NS_PER_TICK
    write_stat(proc, 13, 1, 999, 7, 0)  # 13 reaped by init at 14 ticks; a stranger now has its pid
    assert cpu.read() == (45 + 60 + 12) * NS_PER_TICK
    write_stat(proc, 10, 1, 100, 44, 60)  # a counter read a tick low does not take the total back
    assert cpu.read() == 117 * NS_PER_TICK


def test_the_tree_cpu_of_real_processes_is_what_the_kernel_reports_at_reaping() -> None:
    """A real tree: a Python root that spins, forks two children that spin and exits after
    reaping them, and a grandchild reaped by its parent; read every 0.1 s, last while the root
    is a zombie. Truth: the root's rusage from ``wait4`` (its CPU time and its reaped
    descendants'), within a tick per process read."""
    code = (
        "import os, time\n"
        "def spin(s):\n"
        "    t = time.process_time()\n"
        "    while time.process_time() - t < s: pass\n"
        "kids = []\n"
        "for i in range(2):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        if i == 1:\n"
        "            g = os.fork()\n"
        "            if g == 0:\n"
        "                spin(0.15); os._exit(0)\n"
        "            os.waitpid(g, 0)\n"
        "        spin(0.2); os._exit(0)\n"
        "    kids.append(pid)\n"
        "spin(0.3)\n"
        "for k in kids: os.waitpid(k, 0)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    cpu = TreeCpu(ProcessTree([child.pid]))
    readings = [cpu.read()]
    while os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        time.sleep(0.1)
        readings.append(cpu.read())
    readings.append(cpu.read())  # the zombie's final counts
    _, _, usage = os.wait4(child.pid, 0)
    child.returncode = 0
    truth = (usage.ru_utime + usage.ru_stime) * S
    assert readings == sorted(readings)
    # the kernel's rusage is in µs, the stat ticks in 1/CLK_TCK s: a tick per count summed (4 counts, 4 processes)
    assert readings[-1] == pytest.approx(truth, abs=16 * NS_PER_TICK)
    assert truth > 0.8 * S  # the spins: 0.3 + 2 x 0.2 + 0.15 s
