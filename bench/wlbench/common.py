"""Shared pieces: process CPU/RSS from /proc, daemons started by PID, the fixture host, medians."""

from __future__ import annotations

import abc
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from influxd_peer import BENCH_EXTRA, influxd_config, query_rows
from victoria_peer import victoria_argv

BENCH = Path(__file__).resolve().parent.parent
REPO = BENCH.parent
TESTS = REPO / "tests"  #: with tests/helpers on sys.path (see __init__): sysfs_trees, pipeline, the NVML stand-in

CLK_TCK = os.sysconf("SC_CLK_TCK")
PYTHON = sys.executable


# -- /proc ----------------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads, live or exited), seconds; CLK_TCK resolution."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kib(pid: int, key: str) -> int:
    """A ``/proc/PID/status`` size in KiB (``VmHWM``, ``VmRSS``); 0 when absent."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def shared_objects() -> list[Path]:
    """The extension modules and shared libraries of this interpreter's environment."""
    roots = {Path(sysconfig.get_paths()[k]) for k in ("platlib", "purelib")}
    roots.add(Path(sysconfig.get_paths()["stdlib"]) / "lib-dynload")
    return sorted({f for root in roots if root.is_dir() for f in root.rglob("*.so*") if f.is_file()})


def evict_page_cache(files: Sequence[Path | str]) -> int:
    """Drop the cached pages of ``files`` that no process maps (``POSIX_FADV_DONTNEED``); their bytes.

    A process's peak RSS counts the clean file pages the kernel maps around each page fault
    (fault-around), and it maps only pages already in the page cache: just after an install,
    gRPC's whole library is cached and a gRPC client peaks several MiB higher than with
    only the pages some process touched. Evicting first makes every run start from that state.
    """
    total = 0
    for name in files:
        with contextlib.suppress(OSError):
            fd = os.open(name, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def machine() -> dict[str, Any]:
    """What ran the benchmark: CPU model, cores, memory, kernel, Python."""
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    mem_kib = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as fh:
        mem_kib = int(next(ln for ln in fh if ln.startswith("MemTotal")).split()[1])
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": os.uname().release,
        "python": sys.version.split()[0],
        "clk_tck": CLK_TCK,
        "loadavg_at_start": os.getloadavg()[0],
    }


# -- numbers --------------------------------------------------------------------------------


def median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def rounded(value: Any, digits: int = 4) -> Any:
    """``value`` with floats rounded to ``digits`` significant digits, recursively (for JSON)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v, digits) for v in value]
    return value


# -- processes ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RusagePopen(subprocess.Popen[bytes]):
    """Popen that reaps with ``os.wait4`` and keeps the child's rusage (its waited children included)."""

    rusage: Any = None

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        try:
            pid, status, self.rusage = os.wait4(self.pid, wait_flags)
        except ChildProcessError:
            pid, status = self.pid, 0
        return pid, status

    def cpu_s(self) -> float | None:
        return None if self.rusage is None else self.rusage.ru_utime + self.rusage.ru_stime


class Proc:
    """A child process with its output in a log file; stopped by PID (SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        argv: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        stdout: int | None = None,
        popen: type[subprocess.Popen[bytes]] = subprocess.Popen,
    ) -> None:
        self.argv = argv
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._fh = log.open("wb")
        self.popen = popen(
            argv,
            stdout=stdout if stdout is not None else self._fh,
            stderr=self._fh,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu_s(self) -> float:
        return cpu_s(self.pid)

    def hwm_mib(self) -> float:
        return status_kib(self.pid, "VmHWM") / 1024

    def tail(self, chars: int = 2000) -> str:
        self._fh.flush()
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=timeout)
        self._fh.close()
        return self.popen.returncode


@contextlib.contextmanager
def running(procs: list[Proc]) -> Iterator[list[Proc]]:
    """Stop every process of ``procs`` (appended to meanwhile too) on the way out."""
    try:
        yield procs
    finally:
        for proc in reversed(procs):
            proc.stop()


def wait_idle(proc: Proc, below: float = 0.05, max_s: float = 60.0) -> float:
    """Until ``proc`` uses under ``below`` of a core over a second (InfluxDB compacting after a
    bulk write skews whatever runs next); returns the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < max_s:
        c0 = proc.cpu_s()
        time.sleep(1.0)
        if proc.cpu_s() - c0 < below:
            break
    return time.monotonic() - start


def http(method: str, url: str, body: bytes | None = None, timeout_s: float = 10.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_http(url: str, proc: Proc, timeout_s: float = 30.0) -> None:
    """Until ``GET url`` answers 2xx; raises with the log tail if ``proc`` dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.argv[0]} exited:\n{proc.tail()}")
        with contextlib.suppress(OSError):
            if 200 <= http("GET", url, timeout_s=1.0)[0] < 300:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{proc.argv[0]} not ready at {url}:\n{proc.tail()}")


def wait_port(port: int, proc: Proc, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.argv[0]} exited:\n{proc.tail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}:\n{proc.tail()}")


# -- peers ----------------------------------------------------------------------------------


def binary(env: str, name: str) -> str | None:
    path = os.environ.get(env) or f"/usr/bin/{name}"
    return path if os.access(path, os.X_OK) else None


@dataclass
class Influxd:
    proc: Proc
    url: str

    def query(self, influxql: str, database: str | None = None) -> list[dict[str, Any]]:
        params = {"q": influxql, "epoch": "ns", **({"db": database} if database else {})}
        status, body = http("POST", self.url + "/query", urllib.parse.urlencode(params).encode())
        if status != 200:
            raise RuntimeError(f"influxd query {influxql!r}: {status} {body[:300]!r}")
        return query_rows(body)


def start_server(
    env: str, name: str, package: str, root: Path, argv: Callable[[str, int], list[str]], ready: str
) -> tuple[Proc, str]:
    """The server ``name`` (binary from ``$env``, else /usr/bin) on a free port, its files under
    ``root``, once ``GET ready`` answers; ``argv(binary, port)`` is its command line."""
    path = binary(env, name)
    if path is None:
        raise RuntimeError(f"{name} not found (Debian package {package}; or set {env})")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = Proc(argv(path, port), root / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + ready, proc)
    return proc, url


def start_influxd(root: Path) -> Influxd:
    def argv(path: str, port: int) -> list[str]:
        config = root / "influxdb.conf"
        config.write_text(influxd_config(root, port, free_port(), **BENCH_EXTRA))
        return [path, "-config", str(config)]

    return Influxd(*start_server("INFLUXD", "influxd", "influxdb", root, argv, "/ping"))


@dataclass
class Victoria:
    proc: Proc
    url: str

    def flush(self) -> None:
        """Make what it took searchable now (new rows wait in memory before they are)."""
        http("GET", self.url + "/internal/force_flush")

    def query(self, promql: str, time_s: float) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        params = urllib.parse.urlencode({"query": promql, "time": f"{time_s:.3f}"})
        status, body = http("GET", f"{self.url}/api/v1/query?{params}")
        if status != 200:
            raise RuntimeError(f"victoria-metrics query {promql!r}: {status} {body[:300]!r}")
        result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
        return result


def start_victoria_metrics(root: Path) -> Victoria:
    def argv(path: str, port: int) -> list[str]:
        return victoria_argv(path, root / "data", port)

    return Victoria(*start_server("VICTORIA_METRICS", "victoria-metrics", "victoria-metrics", root, argv, "/health"))


class Poller(abc.ABC):
    """Calls :meth:`tick` (each subclass's own) every ``every_s`` on a thread of its own from ``start_at`` (wall
    clock; default at once) between :meth:`start` and :meth:`stop`."""

    def __init__(self, every_s: float, start_at: float = 0.0) -> None:
        self.every_s, self.start_at = every_s, start_at
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        self._stop.wait(max(0.0, self.start_at - time.time()))
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.every_s)

    @abc.abstractmethod
    def tick(self) -> None:
        """One poll."""
