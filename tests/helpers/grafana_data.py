"""What both Grafana dashboard tests share: the data the dashboards are run on (real
``wire.Batch`` objects: two hosts, RAPL with subzones and psys, GPUs, a Neuron device, modelled
CPU and NICs, 1 Hz for 10 min, an unhealthy GPU interval, three jobs: two Slurm jobs with
user/account/partition labels and one without), the figures they should show, and Grafana's
Dashboard JSON schema (tests/grafana_schema).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from jsonschema.exceptions import best_match

from wattline import wire

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PROJECT = ROOT / "tests" / "grafana_schema"
SCHEMA_BUILD = ROOT / "tests" / "_build" / "grafana_schema"
SCHEMA_INPUTS = ("package.json", "package-lock.json", "generate.mjs")


def load_dashboard(path: Path) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


# -- Grafana's Dashboard schema ----------------------------------------------------------------


def run_tool(argv: list[str], cwd: Path, timeout_s: float) -> None:
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(argv)} (in {cwd}) took over {timeout_s:.0f} s", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)} (in {cwd}) exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def dashboard_schema() -> dict[str, Any]:
    """JSON Schema of @grafana/schema's Dashboard, built once per input change (npm ci + generate.mjs)."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: validating the dashboards needs Node.js >= 20 and npm "
            "(e.g. apt-get install nodejs npm), which install @grafana/schema from tests/grafana_schema",
            pytrace=False,
        )
    inputs = {name: (SCHEMA_PROJECT / name).read_bytes() for name in SCHEMA_INPUTS}
    key = hashlib.sha256(b"".join(hashlib.sha256(inputs[name]).digest() for name in SCHEMA_INPUTS)).hexdigest()
    schema_path = SCHEMA_BUILD / f"dashboard-schema-{key[:16]}.json"
    SCHEMA_BUILD.mkdir(parents=True, exist_ok=True)
    # pytest-xdist workers share tests/_build: one builds the schema, the others wait for it.
    with open(SCHEMA_BUILD.parent / "grafana_schema.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not schema_path.exists():
            _build_schema(inputs, schema_path)
    schema: dict[str, Any] = json.loads(schema_path.read_text())
    return schema


def _build_schema(inputs: dict[str, bytes], schema_path: Path) -> None:
    for name, data in inputs.items():
        (SCHEMA_BUILD / name).write_bytes(data)
    lock_hash = hashlib.sha256(inputs["package-lock.json"]).hexdigest()
    stamp = SCHEMA_BUILD / "node_modules" / ".wattline-lock-sha256"
    if not stamp.exists() or stamp.read_text() != lock_hash:
        run_tool(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], SCHEMA_BUILD, 600)
        stamp.write_text(lock_hash)
    partial = schema_path.with_suffix(".partial")
    run_tool(["node", "generate.mjs", str(partial)], SCHEMA_BUILD, 300)
    partial.replace(schema_path)
    for stale in SCHEMA_BUILD.glob("dashboard-schema-*.json"):
        if stale != schema_path:
            stale.unlink()


def schema_errors(schema: dict[str, Any], document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    out = []
    for error in sorted(validator.iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path]):
        where = "/".join(str(p) for p in error.absolute_path) or "(top)"
        # An anyOf (Panel | RowPanel) error says only "not valid under any": name the likeliest cause.
        cause = best_match(error.context) if error.context else error
        out.append(f"{where}: {cause.message[:300]}")
    return out


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def find_panel(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    matches = [p for p in all_panels(dashboard) if p["title"] == title]
    assert len(matches) == 1, f"no (single) panel titled {title!r}"
    return matches[0]


def query_text(variable: dict[str, Any]) -> str:
    query = variable.get("query", "")
    return str(query.get("query", "")) if isinstance(query, dict) else str(query)


def choose(
    variable: dict[str, Any],
    found: list[str],
    select: dict[str, str | list[str]],
    values: dict[str, list[str]],
    raw: dict[str, str],
) -> None:
    """Grafana's selection of ``variable`` among its options ``found``, into ``values`` (or
    ``raw``: a custom all value, inserted as is): ``select[name]``, else "All" where the
    variable allows it (its custom all value if it has one, else every option), else the
    first option. Only a hidden variable, or one whose All is a value of its own (a filter
    by labels that no job has: a fleet without Slurm), may have no options."""
    name = variable["name"]
    assert found or variable["hide"] == 2 or "allValue" in variable, (
        f"variable ${name} has no options: {query_text(variable)!r}"
    )
    raw.pop(name, None)
    if name in select:
        chosen = [select[name]] if isinstance(select[name], str) else list(select[name])
        assert set(chosen) <= set(found), (name, found)
        values[name] = chosen
    elif variable.get("includeAll") and "allValue" in variable:
        raw[name] = variable["allValue"]
    elif variable.get("includeAll"):
        values[name] = found
    else:
        values[name] = found[:1]


# -- the data ----------------------------------------------------------------------------------

S = 1_000_000_000
HOST_A = "gpu-node-01.dc1"  # '-' and '.' exercise Grafana's regex escaping
HOST_B = "inf-node-02.dc1"
LLAMA = "job-7f3a-llama"
RESNET = "job-91c2-resnet"
EVAL = "job-5e1f-eval"
DURATION_S = 600
INTERVAL_S = 10
SUBZONES = {"cpu_core", "cpu_uncore", "psys"}
UNITS_EVERY_S = 10  #: a job's units event on each host: the units done since its last one


@dataclass(frozen=True)
class Channel:
    host: str
    source: str
    component: str
    device: str
    quality: str
    utilization: float | None = None
    gauges: tuple[str, ...] = ()


CHANNELS = [
    Channel(HOST_A, "rapl", "cpu_package", "package-0", "counter"),
    Channel(HOST_A, "rapl", "cpu_core", "package-0", "counter"),
    Channel(HOST_A, "rapl", "cpu_uncore", "package-0", "counter"),
    Channel(HOST_A, "rapl", "dram", "package-0", "counter"),
    Channel(HOST_A, "rapl", "psys", "psys", "counter"),
    Channel(HOST_A, "nvml", "gpu", "GPU-0a1b", "counter", 0.9, ("memory_used_bytes", "power_limit_w")),
    Channel(HOST_A, "nvml", "gpu", "GPU-2c3d", "integrated", 0.8, ("memory_used_bytes", "power_limit_w")),
    Channel(HOST_A, "nic", "nic", "eth0", "model", None, ("rx_bytes",)),
    Channel(HOST_B, "cpu_model", "cpu", "cpu", "model", 0.5),
    Channel(HOST_B, "neuron", "accelerator", "neuron0", "integrated", 0.7, ("memory_used_bytes",)),
    Channel(HOST_B, "nic", "nic", "eth0", "model", None, ("rx_bytes",)),
]


@dataclass(frozen=True)
class JobPlan:
    job_id: str
    name: str
    kind: str
    unit_name: str
    hosts: dict[str, tuple[int, int | None, int]]  #: host -> (open s, saturated s or None, close s)
    units_per_10s: dict[str, float]  #: per units event (one each UNITS_EVERY_S)
    #: Labels of its opens, and of its closes (Slurm's epilog: what the prolog could not learn).
    labels: dict[str, str] = field(default_factory=dict)
    close_labels: dict[str, str] = field(default_factory=dict)


JOBS = [
    JobPlan(
        LLAMA,
        "llama-bench",
        "inference",
        "tokens",
        {HOST_A: (60, 180, 540), HOST_B: (61, 185, 541)},
        {HOST_A: 128.0, HOST_B: 64.0},
        {"user": "alice", "partition": "gpu"},
        {"account": "ml-research"},  # the controller answered the prolog late
    ),
    JobPlan(
        RESNET,
        "resnet-train",
        "training",
        "images",
        {HOST_B: (300, None, 420)},
        {HOST_B: 32.0},
        {"user": "bob", "partition": "inf", "account": "vision"},
    ),
    # Not a Slurm job (`wattline run`): no user, account or partition.
    JobPlan(EVAL, "eval-harness", "evaluation", "samples", {HOST_A: (420, None, 480)}, {HOST_A: 16.0}),
]
#: Each job's device claims on a host, as its open event carries them: the GPUs by UUID (as
#: the wrapper sends them: wattline/jobs/wrappers/claims.py), a NeuronCore (of neuron0).
JOB_DEVICES = {
    HOST_A: [wire.claim_key(c.component, c.device) for c in CHANNELS if c.host == HOST_A and c.component == "gpu"],
    HOST_B: ["neuroncore:0"],
}
UNHEALTHY = ("GPU-2c3d", range(300, 305), "GPU is lost")
#: build_batches' arguments for a store with holes: 15 s of one GPU's samples lost inside its
#: stream (its counter bridges them), and HOST_B's agent down 3 s before its restart's new
#: stream (nothing measured them)
HOLED: dict[str, Any] = {"restarts": {HOST_B: 305}, "lost": ("GPU-0a1b", range(201, 216)), "down_s": 3}


def channel_power(ch: Channel, t: int) -> float:
    """Mean power of ``ch`` over the second ending at offset ``t`` (deterministic, job-shaped)."""
    load = 0.0
    for job in JOBS:
        if ch.host in job.hosts:
            open_s, sat_s, close_s = job.hosts[ch.host]
            if open_s < t <= close_s:
                sat = sat_s if sat_s is not None else close_s
                load = max(load, min(1.0, 0.4 + 0.6 * (t - open_s) / (sat - open_s)) if t < sat else 1.0)
    wobble = 0.03 * math.sin(t / 7.0 + len(ch.device))
    peak = {
        "cpu_package": 160.0,
        "cpu_core": 110.0,
        "cpu_uncore": 20.0,
        "dram": 18.0,
        "psys": 950.0,
        "gpu": 310.0,
        "nic": 6.0,
        "cpu": 90.0,
        "accelerator": 120.0,
    }[ch.component]
    return round(peak * (0.25 + 0.75 * load) * (1 + wobble), 6)


@dataclass
class Fixture:
    """The data written, and what the dashboards should show for it."""

    start_ns: int
    end_ns: int
    points: list[dict[str, Any]] = field(default_factory=list)  #: one per sample
    events: list[dict[str, Any]] = field(default_factory=list)  #: one per job event

    @property
    def start_ms(self) -> int:
        return self.start_ns // 1_000_000

    @property
    def end_ms(self) -> int:
        return self.end_ns // 1_000_000

    def at(self, offset_s: float) -> int:
        return self.start_ns + int(offset_s * S)


def build_batches(
    fx: Fixture, restarts: dict[str, int] | None = None, lost: tuple[str, range] | None = None, down_s: int = 0
) -> list[wire.pb.Batch]:
    """The batches of the fixture (one a minute per host); ``restarts``: host -> the second
    after which its agent runs again (a new stream, counters from 0), after ``down_s`` seconds
    down (their samples never measured); ``lost``: a device and the seconds whose samples the
    store lacks (its counter counted them: a hole the stream's running total bridges)."""
    batches: list[wire.pb.Batch] = []
    labels = {
        HOST_A: {"instance_type": "p4d.24xlarge", "cluster": "train-a"},
        HOST_B: {"instance_type": "inf2.xlarge", "cluster": "infer-b"},
    }
    cumulative: dict[Channel, float] = defaultdict(float)
    seqs: dict[tuple[str, str], int] = defaultdict(int)
    sent: dict[str, int] = defaultdict(int)  #: stream id -> batches
    for minute in range(DURATION_S // 60):
        for host in (HOST_A, HOST_B):
            restart = (restarts or {}).get(host, DURATION_S)
            first, last = 60 * minute + 1, 60 * (minute + 1)
            spans = [(first, restart), (restart + 1, last)] if first <= restart < last else [(first, last)]
            for lo, hi in spans:
                stream = f"stream-{host}" if hi <= restart else f"stream-{host}-2"
                sent[stream] += 1
                batch = wire.Batch(stream_id=stream, seq=sent[stream], sent_ns=fx.at(hi))
                batch.host.host_id = host
                batch.host.agent_version = "0.1.0"
                batch.host.labels.update(labels[host])
                for t in range(lo, hi + 1):
                    if t == restart + down_s + 1:  # the new stream's first sample: its totals from 0
                        cumulative.update((ch, 0.0) for ch in CHANNELS if ch.host == host)
                    for ch in (c for c in CHANNELS if c.host == host):
                        unhealthy = ch.device == UNHEALTHY[0] and t in UNHEALTHY[1]
                        power = 0.0 if unhealthy else channel_power(ch, t)
                        cumulative[ch] += power
                        down = restart < t <= restart + down_s
                        if down or (lost is not None and ch.device == lost[0] and t in lost[1]):
                            fx.points.append(
                                {"ch": ch, "t": t, "time_ms": fx.at(t) // 1_000_000, "energy_j": power,
                                 "power_w": power, "healthy": True, "stored": False, "counted": not down}
                            )  # fmt: skip
                            continue
                        sample = batch.samples.add(
                            source=ch.source,
                            component=ch.component,
                            device=ch.device,
                            start_ns=fx.at(t - 1),
                            end_ns=fx.at(t),
                            energy_j=power,
                            power_w=power,
                            cumulative_j=cumulative[ch],
                            quality=wire.QUALITY_BY_NAME[ch.quality],
                            healthy=not unhealthy,
                        )
                        if unhealthy:
                            sample.status = UNHEALTHY[2]
                        if ch.utilization is not None and not unhealthy:
                            sample.utilization = ch.utilization
                        if ch.component == "accelerator":
                            sample.energy_error_j = 2.0
                        for gauge in ch.gauges:
                            sample.gauges[gauge] = {"memory_used_bytes": 4.0e10, "power_limit_w": 400.0}.get(
                                gauge, 1e6 * t
                            )
                        fx.points.append(
                            {
                                "ch": ch,
                                "t": t,
                                "time_ms": fx.at(t) // 1_000_000,
                                "energy_j": power,
                                "power_w": power,
                                "healthy": not unhealthy,
                                "stored": True,
                                "counted": True,
                            }
                        )
                    for job in JOBS:
                        if host not in job.hosts:
                            continue
                        open_s, sat_s, close_s = job.hosts[host]
                        kinds: list[tuple[str, dict[str, Any]]] = []
                        if t == open_s:
                            kinds.append(("open", {}))
                        if open_s < t <= close_s and (t - open_s) % UNITS_EVERY_S == 0:
                            kinds.append(("units", {"units": job.units_per_10s[host]}))
                        if t == sat_s:
                            kinds.append(("phase", {"phase": "saturated"}))
                        if t == close_s:
                            kinds.append(("close", {"exit_code": 0}))
                        for kind, fields in kinds:
                            seqs[job.job_id, host] += 1
                            event = batch.job_events.add(
                                job_id=job.job_id,
                                time_ns=fx.at(t),
                                event_seq=seqs[job.job_id, host],
                                kind=getattr(wire.pb.JobEvent, f"KIND_{kind.upper()}"),
                                **fields,
                            )
                            if kind == "open":
                                event.name, event.job_kind, event.unit_name = job.name, job.kind, job.unit_name
                                event.devices.extend(JOB_DEVICES[host])
                                event.labels["team"] = "ml-platform"
                                event.labels.update(job.labels)
                            if kind == "close":
                                event.labels.update(job.close_labels)
                            fx.events.append(
                                {
                                    "job_id": job.job_id,
                                    "host": host,
                                    "event": kind,
                                    "t": t,
                                    "time_ms": fx.at(t) // 1_000_000,
                                    **fields,
                                }
                            )
                batches.append(batch)
    bridge_ends(fx.points)
    return batches


def bridge_ends(points: list[dict[str, Any]]) -> None:
    """Give each sample lost inside a stream (not stored, counted by the counter) the times of
    the stored samples on both sides of its hole: ``bridge`` (ms, ms)."""
    by_channel: dict[Channel, list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        by_channel[p["ch"]].append(p)
    for mine in by_channel.values():
        mine.sort(key=lambda p: p["t"])
        stored = [p["time_ms"] for p in mine if p["stored"]]
        for p in mine:
            if p["counted"] and not p["stored"]:
                before = max(t for t in stored if t < p["time_ms"])
                p["bridge"] = (before, min(t for t in stored if t > p["time_ms"]))


# -- expected figures, computed from the fixture -------------------------------------------------


def in_totals(ch: Channel) -> bool:
    return ch.component not in SUBZONES


def expected_energy(
    fx: Fixture, key: str, from_ms: int, to_ms: int, hosts: set[str], left_open: bool = False
) -> dict[str, float]:
    """Energy of the samples ending in [from, to] (InfluxQL's time filter), or in (from, to]
    (``left_open``: a range selector's, which leaves out the sample that ended at ``from``)."""
    out: dict[str, float] = defaultdict(float)
    for p in fx.points:
        if in_totals(p["ch"]) and p["ch"].host in hosts and counted(p, from_ms, to_ms, left_open):
            out[getattr(p["ch"], key)] += p["energy_j"]
    return out


def counted(p: dict[str, Any], from_ms: int, to_ms: int, left_open: bool = False) -> bool:
    """Whether a dashboard's energy over [from, to] (``left_open``: (from, to]) counts the sample
    ``p``: a stored one that ends in it; a lost one whose hole the stream's counter bridges
    (its stored samples on both sides in it); never one no stream measured."""
    ends = p.get("bridge", (p["time_ms"], p["time_ms"])) if p["counted"] else None
    if ends is None:
        return False
    return (ends[0] > from_ms if left_open else ends[0] >= from_ms) and ends[1] <= to_ms


def stored_power(
    fx: Fixture, host: str, from_ms: int, to_ms: int, left_open: bool = False
) -> dict[tuple[str, str, str], tuple[float, float]]:
    """Per channel of ``host`` (component, device, source): the mean and the peak power of its
    stored samples ending in [from, to] (``left_open``: (from, to]); a lost sample has none."""
    powers: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for p in fx.points:
        after = p["time_ms"] > from_ms if left_open else p["time_ms"] >= from_ms
        if p["ch"].host == host and p["stored"] and after and p["time_ms"] <= to_ms:
            powers[p["ch"].component, p["ch"].device, p["ch"].source].append(p["power_w"])
    return {k: (sum(v) / len(v), max(v)) for k, v in powers.items()}


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def whole_run_j(report: dict[str, Any]) -> float:
    """A `wattline report --json`'s energy from open to close (for tests of the report itself)."""
    return float(report["measured"]["energy_j"]) + float(report["warmup"]["energy_j"])


@dataclass(frozen=True)
class JobTruth:
    """A job's figures as the fixture builds them (never from wattline's report code)."""

    start_ms: int  #: its first open
    saturated_ms: int  #: where its measured (saturated) window starts
    whole_j: float  #: energy from each host's open to its close
    by_host_j: dict[str, float]  #: ``whole_j`` by host
    measured_j: float  #: energy from ``saturated_ms`` to each host's close
    measured_by_quality: dict[str, float]
    measured_units: float

    @property
    def j_per_unit(self) -> float:
        return self.measured_j / self.measured_units

    @property
    def kwh_per_million(self) -> float:
        return self.j_per_unit * 1e6 / 3.6e6

    @property
    def measured_fraction(self) -> float:
        """Fraction of the measured window's energy from measurements (counter, integrated)."""
        return sum(self.measured_by_quality.get(q, 0.0) for q in ("counter", "integrated")) / self.measured_j


def saturated_s(job: JobPlan) -> int:
    """The offset where ``job`` is saturated: the last of its hosts' marks (a job is saturated
    when every host is); a job without marks counts units at one rate from its open: saturated there."""
    marks = [sat for _, sat, _ in job.hosts.values() if sat is not None]
    return max(marks) if marks else min(open_s for open_s, _, _ in job.hosts.values())


def running(host: str, t: int) -> list[JobPlan]:
    """The jobs open on ``host`` during the second ending at offset ``t``."""
    return [j for j in JOBS if host in j.hosts and j.hosts[host][0] < t <= j.hosts[host][2]]


def job_truths(fx: Fixture) -> dict[str, JobTruth]:
    """Each job's figures from the construction: every channel of a host in totals (the GPUs
    and neuron0 each job claims, the host-wide ones: no job's CPU time is sent) split equally
    among the jobs open on the host in each second, a second no stream measured counting for
    none; its units done at a constant rate over the :data:`UNITS_EVERY_S` each units event reports."""
    out = {}
    for job in JOBS:
        sat = saturated_s(job)
        by_host: dict[str, float] = defaultdict(float)
        by_quality: dict[str, float] = defaultdict(float)
        for p in fx.points:
            sharing = running(p["ch"].host, p["t"])
            if in_totals(p["ch"]) and p["counted"] and job in sharing:
                by_host[p["ch"].host] += p["energy_j"] / len(sharing)
                if p["t"] > sat:
                    by_quality[p["ch"].quality] += p["energy_j"] / len(sharing)
        units = sum(
            e["units"] * (e["t"] - max(e["t"] - UNITS_EVERY_S, sat)) / UNITS_EVERY_S
            for e in fx.events
            if e["job_id"] == job.job_id and e["event"] == "units" and e["t"] > sat
        )
        out[job.job_id] = JobTruth(
            start_ms=fx.at(min(o for o, _, _ in job.hosts.values())) // 1_000_000,
            saturated_ms=fx.at(sat) // 1_000_000,
            whole_j=sum(by_host.values()),
            by_host_j=dict(by_host),
            measured_j=sum(by_quality.values()),
            measured_by_quality=dict(by_quality),
            measured_units=units,
        )
    return out


def claimed_by_host(truths: dict[str, JobTruth], from_ms: int, to_ms: int) -> dict[str, float]:
    """The energy jobs claim per host, of the jobs whose summary (stamped at the job's start) is in (from, to]."""
    claimed: dict[str, float] = defaultdict(float)
    for truth in truths.values():
        if from_ms < truth.start_ms <= to_ms:
            for host, energy in truth.by_host_j.items():
                claimed[host] += energy
    return dict(claimed)


#: The Jobs dashboard's filters (variable -> selected values; absent: All) and the jobs they select.
FILTER_CASES: list[tuple[dict[str, str | list[str]], list[str]]] = [
    ({}, [LLAMA, RESNET, EVAL]),  # All: the job without Slurm labels too
    ({"user": "alice"}, [LLAMA]),
    ({"account": "ml-research"}, [LLAMA]),  # learnt by the epilog: on the close only
    ({"account": "vision"}, [RESNET]),
    ({"partition": "inf"}, [RESNET]),
    ({"user": ["alice", "bob"], "partition": "gpu"}, [LLAMA]),
    ({"user": "bob", "account": "ml-research"}, []),
]
FILTER_OPTIONS = {"user": ["alice", "bob"], "account": ["ml-research", "vision"], "partition": ["gpu", "inf"]}
