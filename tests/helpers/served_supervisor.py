"""A supervisor as a deployment wraps a server: ``python served_supervisor.py PIDFILE CMD ...``.

It writes its pid to PIDFILE, runs CMD, and on SIGUSR1 restarts it: SIGTERM, wait for its end,
then CMD again (the same arguments: the same port). On SIGTERM or SIGINT it stops CMD and exits
with its status; when CMD ends by itself, it exits with CMD's status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    pidfile, command = Path(sys.argv[1]), sys.argv[2:]
    asked: list[int] = []
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: asked.append(signum))
    child = subprocess.Popen(command)
    pidfile.write_text(f"{os.getpid()}\n")
    while child.poll() is None:
        time.sleep(0.05)
        while asked:
            signum = asked.pop(0)
            child.send_signal(signal.SIGTERM)
            status = child.wait()
            if signum != signal.SIGUSR1:
                sys.exit(status)
            print(f"supervisor: restarting (the server exited {status})", file=sys.stderr, flush=True)
            child = subprocess.Popen(command)
    sys.exit(child.returncode)
