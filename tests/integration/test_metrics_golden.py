"""Every metric the agent and the collector expose, with its type and label names, is the list in
``tests/golden/metrics.txt`` (as node_exporter's end-to-end fixture): a metric added, renamed,
retyped or relabelled without that file changing fails here, with the difference.

Real processes, scraped over HTTP: ``wattline collector --processes 2`` into influxd (the
supervisor's /metrics: its own series and every process's) and ``wattline agent`` shipping to
it, reading three sources on a sysfs tree (a RAPL ``psys`` zone, a NIC, and the CPU model, which
stands down only beside a measured CPU package); two more streams under one host id make the
collector's per-host series appear. Every family must show a sample, so that its label names
are known. The client library's ``*_created`` companions of counters and histograms are left out.

After adding or changing a metric, regenerate the file and review its diff::

    WATTLINE_UPDATE_GOLDEN=1 python -m pytest tests/integration/test_metrics_golden.py
"""

from __future__ import annotations

import difflib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from collector_procs import Agent as Pusher
from collector_procs import Collector, run_all
from procs import Proc
from servers import Influxd, free_port, http
from sysfs_trees import Iface, Zone, net_tree, powercap_tree

GOLDEN = Path(__file__).parents[1] / "golden" / "metrics.txt"
UPDATE = "WATTLINE_UPDATE_GOLDEN"
REGENERATE = f"{UPDATE}=1 python -m pytest tests/integration/test_metrics_golden.py"
HEADER = f"""\
# Every metric the agent and the collector expose: exporter, name, type, label names (sorted).
# Checked by tests/integration/test_metrics_golden.py against the running processes; after a change run
#   {REGENERATE}
# and review this file's diff.
"""
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="(?:[^"\\]|\\.)*"')
#: Labels a type implies (a histogram's buckets): not part of a metric's own label set.
IMPLIED = {"histogram": {"le"}, "summary": {"quantile"}}


@dataclass
class Family:
    kind: str
    labels: set[str] = field(default_factory=set)
    samples: int = 0


def families(text: str) -> dict[str, Family]:
    """Each ``# TYPE`` family of a Prometheus text exposition, with its samples' label names."""
    out: dict[str, Family] = {}
    current: Family | None = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            current = out[name] = Family(kind)
        elif line and not line.startswith("#"):
            assert current is not None, f"a sample before any # TYPE line: {line}"
            current.samples += 1
            if "{" in line:
                current.labels.update(LABEL.findall(line[line.index("{") + 1 : line.rindex("}")]))
    return out


def surface(exporter: str, text: str) -> list[str]:
    """``exporter name type label,label`` per family of ``text``."""
    found = families(text)
    lines = []
    for name, family in found.items():
        base = name.removesuffix("_created")
        if base != name and (f"{base}_total" in found or base in found):
            continue  # the client library's creation time of a counter or histogram
        labels = ",".join(sorted(family.labels - IMPLIED.get(family.kind, set())))
        lines.append(f"{exporter} {name} {family.kind} {labels}".rstrip())
    return lines


def settled(scrape: Callable[[], str], alive: Callable[[], bool], what: str, timeout_s: float = 60.0) -> str:
    """The exposition once every family in it shows a sample."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert alive(), f"{what} exited"
        try:
            text = scrape()
        except OSError:  # not serving yet
            text = ""
        empty = sorted(name for name, family in families(text).items() if not family.samples)
        if text and not empty:
            return text
        assert time.monotonic() < deadline, f"{what}: no sample within {timeout_s:g} s of {empty or 'any family'}"
        time.sleep(0.2)


def agent_tree(root: Path) -> Path:
    powercap_tree(root, [Zone("intel-rapl:1", "psys", 10**6)])
    return net_tree(root, [Iface("eth0")])


def test_exposed_metrics_are_the_golden_list(tmp_path: Path, influxd: Influxd) -> None:
    collector = Collector(tmp_path, influxd)
    metrics_port = free_port()
    agent = Proc(
        [
            *("agent", "--sysfs-root", str(agent_tree(tmp_path / "tree")), "--host-id", "golden"),
            *("--source", "rapl", "--source", "nic", "--source", "cpu_model", "--interval", "0.2"),
            *("--collector", f"127.0.0.1:{collector.port}", "--batch-interval", "0.2", "--spool-dir", "memory"),
            *("--edge-socket", "off", "--prometheus-port", str(metrics_port)),
        ],
        tmp_path / "agent.log",
    )
    try:
        run_all([Pusher(collector.port, "twin", batches=1, stream=f"twin-{k}") for k in range(2)])

        def agent_text() -> str:
            status, body = http("GET", f"http://127.0.0.1:{metrics_port}/metrics")
            return body.decode() if status == 200 else ""

        got = surface("agent", settled(agent_text, agent.alive, "agent"))
        got += surface("collector", settled(collector.metrics_text, collector.proc.alive, "collector"))
    finally:
        agent.terminate()
        collector.proc.terminate()
    got.sort()
    if os.environ.get(UPDATE):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(HEADER + "".join(f"{line}\n" for line in got))
    want = [line for line in GOLDEN.read_text().splitlines() if line and not line.startswith("#")]
    diff = "\n".join(difflib.unified_diff(want, got, str(GOLDEN), "exposed now", lineterm=""))
    assert got == want, f"the exposed metrics changed; if meant, run {REGENERATE}\n{diff}"
