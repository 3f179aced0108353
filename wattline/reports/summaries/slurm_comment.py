"""Energy in Slurm's accounting (#45): a closed Slurm job's figures in its AdminComment.

When the collector has written a closed Slurm job's summary, :class:`AdminCommentWriter`
writes the same figures, in :func:`admin_comment`'s short versioned form, to the job's
AdminComment in Slurm's accounting (``sacctmgr -i modify job where jobid=N cluster=C set
AdminComment=...``), so ``sacct -j N -o JobID,AdminComment`` shows them. Only Slurm's
administrators (root, SlurmUser) may set AdminComment: a job's user cannot forge it.

It runs on one thread of its own fed by :meth:`AdminCommentWriter.offer`, which never
blocks: a bounded table of jobs due (a job rewritten keeps its latest figures; one whose
report has fewer hosts than its Slurm nodes waits ``partial_wait_s`` for the others). Each
``sacctmgr`` runs with a timeout; slurmdbd down or slow is retried with back-off for at
most ``give_up_s`` (one line at the first failure, one when it gives up); a job
accounting does not know (purged, or never recorded) is looked for ``not_found_tries``
times, then skipped with one line. Nothing here fails a job, a node or the store.
"""

from __future__ import annotations

import logging
import math
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from wattline.reports.model import Report
from wattline.reports.report_json import report_json
from wattline.reports.summaries.due_worker import DueWorker

log = logging.getLogger(__name__)

#: First word of every comment: the format's version (bumped on an incompatible change).
#: 2 renamed measured_share to measured_fraction, 3 accel_share to accel_fraction (#46).
VERSION = "wattline.energy/3"
#: Versions :func:`parse_comment` reads, each with its keys' old names -> today's.
READS = {
    "wattline.energy/1": {"measured_share": "measured_fraction", "accel_share": "accel_fraction"},
    "wattline.energy/2": {"accel_share": "accel_fraction"},
    VERSION: {},
}
#: Components whose energy is an accelerator's.
ACCELERATORS = ("gpu", "accelerator")
#: Qualities, worst first: a comment names the worst one that counted any energy.
QUALITIES = ("model", "integrated", "counter")
_JOB_ID = re.compile(r"[0-9]{1,12}")
_WORD = re.compile(r"[^A-Za-z0-9_.:-]")
_HOSTLIST_PART = re.compile(r"(?:[^,\[]|\[[^\]]*\])+")
#: Runs a command: (argv, timeout in seconds) -> (exit status, stdout + stderr).
Runner = Callable[[list[str], float], tuple[int, str]]


def _word(text: str, limit: int = 32) -> str:
    """``text`` as one token of the comment: characters outside [A-Za-z0-9_.:-] become '_'."""
    return _WORD.sub("_", text)[:limit] or "_"


def _num(value: float | None) -> str | None:
    if value is None or not math.isfinite(value):
        return None
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.4g}"


def admin_comment(data: Mapping[str, Any]) -> str:
    """The comment of a job's ``wattline report --json`` (``data``): whole-run energy and its
    bound (J), J per unit and the unit where units counted, accelerators' fraction of the
    energy, the worst quality that counted energy, the measured fraction, the hosts measured
    and completeness (not while fewer hosts than the job's Slurm nodes have closed)."""
    whole, parts = data["whole_run"], (data["warmup"], data["saturated"])
    energy = whole["energy_j"] or 0.0
    accel = math.fsum(c["energy_j"] for p in parts for c in p["by_component"] if c["component"] in ACCELERATORS)
    fractions = data["saturated"]["coverage"]["fractions"]
    quality = next((q for q in QUALITIES if fractions.get(q, 0.0) > 0), "none")
    fields: dict[str, str | None] = {
        "energy_j": _num(energy),
        "bound_j": _num(whole["energy_bound_j"]),
        "j_per_unit": _num(whole.get("j_per_unit")) if whole.get("units") else None,
        "unit": _word(data["job"]["unit"] or "units") if whole.get("units") else None,
        "accel_fraction": f"{accel / energy:.3f}" if energy > 0 else None,
        "quality": quality,
        "measured_fraction": f"{data['saturated']['coverage']['measured_fraction']:.3f}",
        "hosts": str(len(data["job"]["hosts"])),
        "complete": "1" if data["complete"] and not partial(data) else "0",
    }
    return " ".join([VERSION, *(f"{k}={v}" for k, v in fields.items() if v is not None)])


def node_count(nodelist: str) -> int | None:
    """How many nodes a Slurm hostlist names (``n[1-2],gpu[01-03,07]``: 6); None if unreadable."""
    count = 0
    for part in _HOSTLIST_PART.findall(nodelist):
        names = 1
        for group in re.findall(r"\[([^\]]*)\]", part):
            ranges = [item.partition("-")[::2] for item in group.split(",")]
            if not all(low.isdigit() and (high == "" or high.isdigit()) for low, high in ranges):
                return None
            names *= sum(int(high or low) - int(low) + 1 for low, high in ranges)
        count += names
    return count or None


def partial(data: Mapping[str, Any]) -> bool:
    """Fewer hosts in the report than nodes in the job's Slurm nodelist (others' closes to come)."""
    nodes = node_count(data["job"]["labels"].get("nodes", ""))
    return nodes is not None and len(data["job"]["hosts"]) < nodes


def parse_comment(text: str) -> dict[str, str] | None:
    """The keys of a comment of a version in :data:`READS`, under today's names (a version 1
    comment's measured_share is its measured fraction, a version 1 or 2 comment's
    accel_share its accel_fraction); None for any other text."""
    words = text.split()
    renames = READS.get(words[0]) if words else None
    if renames is None:
        return None
    keys = (word.partition("=")[::2] for word in words[1:])
    return {renames.get(key, key): value for key, value in keys}


def slurm_id(data: Mapping[str, Any]) -> tuple[str, str] | None:
    """(job id, cluster) of a job the Slurm hooks opened; None for any other job."""
    job = data["job"]
    cluster = job["labels"].get("cluster", "")
    if not _JOB_ID.fullmatch(job["id"]) or not cluster or "nodes" not in job["labels"]:
        return None
    return job["id"], _word(cluster, 64)


def run_command(argv: list[str], timeout_s: float) -> tuple[int, str]:
    """:data:`Runner` by subprocess; a command that is absent or timed out is status -1."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, f"{type(exc).__name__}: {exc}"
    return done.returncode, done.stdout + done.stderr


@dataclass
class _Due:
    cluster: str
    comment: str
    at: float  #: when to try (clock time)
    first: float  #: when it was first offered
    tries: int = 0
    missing: int = 0  #: tries that found no such job


class AdminCommentWriter(DueWorker[_Due]):
    """Writes closed Slurm jobs' comments on one background thread (module doc)."""

    def __init__(
        self,
        runner: Runner = run_command,
        *,
        sacctmgr: str = "sacctmgr",
        timeout_s: float = 10.0,
        retry_s: float = 2.0,
        max_retry_s: float = 60.0,
        give_up_s: float = 3600.0,
        not_found_tries: int = 5,
        partial_wait_s: float = 60.0,
        max_jobs: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner, self.sacctmgr, self.timeout_s = runner, sacctmgr, timeout_s
        self.retry_s, self.max_retry_s, self.give_up_s = retry_s, max_retry_s, give_up_s
        self.not_found_tries, self.max_jobs, self._clock = not_found_tries, max_jobs, clock
        self.partial_wait_s = partial_wait_s
        super().__init__("slurm-admin-comment")
        #: Counters (for tests and metrics): comments written, jobs skipped or given up.
        self.written = 0
        self.skipped = 0

    def offer(self, report: Report) -> None:
        """A closed job's summary was written: write its comment if it is a Slurm job. Never blocks."""
        try:
            self.offer_json(report_json(report))
        except Exception as exc:  # a bug here never stops the summaries
            log.warning("slurm AdminComment of %s: %s: %s", report.job.job_id[:100], type(exc).__name__, exc)

    def offer_json(self, data: Mapping[str, Any]) -> None:
        """:meth:`offer` of a report's JSON."""
        ids = slurm_id(data)
        if ids is not None and data["job"]["closed"]:  # a multi-host job's first closes: others' may follow
            self.queue(*ids, admin_comment(data), self.partial_wait_s if partial(data) else 0.0)

    def queue(self, job_id: str, cluster: str, text: str, delay_s: float = 0.0) -> None:
        """Write ``text`` to job ``job_id`` of ``cluster`` in ``delay_s`` (replacing what is due
        for it). Never blocks."""
        now = self._clock()
        with self._cond:
            due = self._due.get(job_id)
            if due is not None:
                due.comment, due.at = text, min(due.at, now + delay_s)
            elif len(self._due) >= self.max_jobs:
                self.skipped += 1
                log.warning("slurm AdminComment: %d jobs already due; job %s skipped", len(self._due), job_id)
                return
            else:
                self._due[job_id] = _Due(cluster, text, now + delay_s, now)
            self._cond.notify()

    def _next(self) -> tuple[str, _Due] | None:
        with self._cond:
            while not self._stop:
                if self._due:
                    job_id, due = min(self._due.items(), key=lambda item: item[1].at)
                    wait = due.at - self._clock()
                    if wait <= 0:
                        del self._due[job_id]
                        return job_id, due
                    self._cond.wait(wait)
                else:
                    self._cond.wait()
            return None

    def _run(self) -> None:
        while (item := self._next()) is not None:
            try:
                self._write(*item)
            except Exception as exc:  # a bug must not end the thread: the job is dropped, said
                self.skipped += 1
                log.warning("slurm job %s: AdminComment not written: %s: %s", item[0], type(exc).__name__, exc)

    def _write(self, job_id: str, due: _Due) -> None:
        argv = [self.sacctmgr, "-i", "modify", "job", "where", f"jobid={job_id}", f"cluster={due.cluster}"]
        code, out = self.runner([*argv, "set", f"AdminComment={due.comment}"], self.timeout_s)
        said = " ".join(out.split())[:300]
        if code == 0 and "Modified" in out:
            self.written += 1
            log.info("slurm job %s: AdminComment written (%s)", job_id, due.comment)
            return
        due.tries += 1
        if code == 0 or "Nothing modified" in out:  # accounting has no such job (yet, or any more)
            due.missing += 1
            if due.missing >= self.not_found_tries:
                self.skipped += 1
                log.warning(
                    "slurm job %s: AdminComment skipped: not in Slurm's accounting after %d looks (purged, never "
                    "recorded, or this user may not modify it): %s",
                    job_id,
                    due.missing,
                    said,
                )
                return
        elif "permission denied" in out:  # not root, SlurmUser nor an operator: no try will do
            self.skipped += 1
            log.warning("slurm job %s: AdminComment refused (run the collector as root or SlurmUser): %s", job_id, said)
            return
        elif due.tries == 1:
            log.warning("slurm job %s: AdminComment not written yet (retried): %s", job_id, said)
        if self._clock() - due.first >= self.give_up_s:
            self.skipped += 1
            log.warning("slurm job %s: AdminComment given up after %d tries: %s", job_id, due.tries, said)
            return
        due.at = self._clock() + min(self.retry_s * 2 ** (due.tries - 1), self.max_retry_s)
        with self._cond:
            newer = self._due.get(job_id)
            if newer is None:
                self._due[job_id] = due
            else:  # offered again meanwhile: its figures, this job's history
                newer.first, newer.tries, newer.missing = due.first, due.tries, due.missing
