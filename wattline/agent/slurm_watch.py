"""The agent's part in a Slurm node's jobs (README "Slurm"), between the prolog and the epilog
and after it.

Every ``every_s`` it looks at the jobs whose holder is a slurmd of this host (the prolog's
holder records, :mod:`.holders`) and reads the new complete lines of each one's events file,
so a ``units N`` line without a time counts when it was written (within ``every_s``), not at
the epilog; the file counts only while the job's user owns it, a link is never followed, and
the reader's progress is shared with the epilog under a lock (:func:`.slurm_node.progress`),
so each line is sent once. And it answers the epilogs' requests (``<job>.ending``): once the
controller has settled how a job ended (on 22.05 every job is COMPLETING during its epilog, a
cancelled one too), the epilog's close is sent again with its ``end_state``: the same
identity, so the store keeps one close, now saying "cancelled".
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from wattline import wire
from wattline.agent import holders, slurm_node

log = logging.getLogger(__name__)

Deliver = Callable[[wire.pb.Host, list[wire.pb.JobEvent]], None]

#: Seconds between two asks of the controller about one ended job, and how long it is asked.
ASK_EVERY_S, ASK_FOR_S = 2.0, 300.0
#: The controller's answer to the agent may take this long (the agent holds no job up).
ASK_TIMEOUT_S = 2.0


class SlurmWatcher:
    """See the module doc; :meth:`run` until stopped, or :meth:`poll` once."""

    def __init__(self, outbox_root: Path, slurm_dir: Path, host: wire.pb.Host, deliver: Deliver) -> None:
        self.outbox_root, self.slurm_dir, self.host, self.deliver = outbox_root, slurm_dir, host, deliver
        self.asked: dict[str, float] = {}  #: ending request -> monotonic time of its last ask
        self.errors: dict[str, str] = {}  #: job -> its events file's last problem (said once)

    def run(self, stop: threading.Event, every_s: float = 0.5) -> None:
        while not stop.is_set():
            try:
                self.poll()
            except Exception:  # a bug here must not end the agent's sampling
                log.exception("slurm: pass failed")
            stop.wait(every_s)

    def poll(self, now_ns: int | None = None) -> None:
        if not self._root_dir():
            return
        now_ns = time.time_ns() if now_ns is None else now_ns
        for _, record in holders.records(self.outbox_root):
            if record.holder_name == "slurmd" and record.host_id == self.host.host_id and record.owner_uid >= 0:
                self._lines(record, now_ns)
        self._endings()

    def _root_dir(self) -> bool:
        """The events directory is there and only root can change it (no file in it counts otherwise)."""
        try:
            st = os.lstat(self.slurm_dir)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022

    def _lines(self, record: holders.HolderRecord, now_ns: int) -> None:
        path = slurm_node.events_path(self.slurm_dir, record.job_id)
        if not path.exists():
            return  # not made, or the epilog has taken it: no progress file to leave behind
        try:
            with slurm_node.progress(self.slurm_dir, record.job_id) as state:
                data = slurm_node.read_events_file(path, record.owner_uid, state[0])
                base = slurm_node.seq_base(record.job_id, record.host_id)
                events, _ = slurm_node.new_line_events(record.job_id, base, data, state, now_ns)
                if events:
                    self.deliver(record.host(), events)  # raises: progress not kept, read again next time
            self.errors.pop(record.job_id, None)
        except (OSError, slurm_node.SlurmError) as exc:
            if self.errors.get(record.job_id) != str(exc):
                log.warning("slurm job %s: events file not read: %s", record.job_id[:100], exc)
                self.errors[record.job_id] = str(exc)

    def _endings(self) -> None:
        try:
            requests = sorted(self.slurm_dir.glob("*.ending"))
        except OSError:
            return
        for path in requests:
            if time.monotonic() - self.asked.get(path.name, 0.0) >= ASK_EVERY_S:
                self.asked[path.name] = time.monotonic()
                try:
                    self._ending(path)
                except Exception as exc:  # the outbox refused it: the request stays for the next look
                    log.warning("slurm: %s not answered yet: %s", path.name, exc)
        self.asked = {k: v for k, v in self.asked.items() if (self.slurm_dir / k).exists()}

    def _ending(self, path: Path) -> None:
        found = slurm_node.read_ending(path)
        if found is None or found[0].host_id != self.host.host_id:
            return
        host, close, conf = found
        view = slurm_node.controller_view(close.job_id, ASK_TIMEOUT_S, conf)
        settled = view.get("state", "") not in slurm_node.UNSETTLED and bool(view)
        if not settled and time.time_ns() - close.time_ns < ASK_FOR_S * 1e9:
            return
        close.end_state = slurm_node.end_state(view)
        if close.end_state:
            self.deliver(host, [close])
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
