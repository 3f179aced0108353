"""A reference workload run as a job: the body of ``wattline workload``.

It opens the job (embedded sampling into the store, or a collector), starts the workload as
a child ``python -m wattline.reference...`` that joins the job through the
environment and counts its own units, then prints the workload's own figures
(:mod:`.figures`) and the job's report. The CLI parses options and calls :func:`run_workload`.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from wattline.agent.settings import AgentSettings
from wattline.config import ConfigError
from wattline.jobs.wrappers.job import default_job_id
from wattline.jobs.wrappers.job_command import (
    Job,
    JobStore,
    after_the_command,
    check_host,
    claimed_devices,
    job_spec,
    read_report,
    run_in_job,
)
from wattline.jobs.wrappers.run import RunRequest
from wattline.reference.common import (
    DEMO_ONLY,
    DTYPES,
    RANDOM_WEIGHTS,
    WORKLOAD_SCHEMA,
    probe_devices,
    resolve_device,
)
from wattline.reference.figures import cross_check, print_workload
from wattline.reports.model import Report, ReportSettings
from wattline.reports.output.render import print_report
from wattline.reports.report_json import report_json

MODULE = "wattline.reference"


@dataclass
class Launch:
    """One workload run: what to start, how to tag it, where the figures go."""

    name: str
    kind: str
    units: str
    module: str
    args: list[str]
    labels: dict[str, str]
    launcher: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Where:
    """The job's id and devices, where its events go, and how its figures are shown."""

    job_id: str | None
    collectors: list[str] | None
    devices: str | None
    store: JobStore
    as_json: bool
    report_json_path: Path | None
    settings: ReportSettings
    verbose: bool = False


def resolve(torch: Any, device: str, dtype: str, threads: int | None, processes: int = 1) -> dict[str, str]:
    """Device, dtype and threads as they will be in force: the job's labels."""
    if dtype not in DTYPES:
        raise ConfigError(f"option --dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    available = probe_devices(torch)
    try:
        resolved = resolve_device(device, available)
    except ValueError as exc:
        raise ConfigError(f"option {exc}") from None
    if threads is not None and threads < 1:
        raise ConfigError(f"option --threads: {threads} is below 1")
    n = threads or max(1, int(torch.get_num_threads()) // max(processes, 1))
    labels = {
        "device": resolved,
        "dtype": dtype,
        "threads": str(n),
        "torch": str(torch.__version__),
        "transformers": _version("transformers"),
        "weights": "random",
    }
    if resolved == "cuda":
        labels["device_name"] = available.cuda_name
    return labels


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def torchrun(nproc_per_node: int, nnodes: int, rdzv_endpoint: str | None, run_id: str) -> list[str]:
    """The launcher of several processes or hosts (``python -m torch.distributed.run ... -m``);
    none for one process."""
    launcher: list[str] = []
    if nproc_per_node > 1 or nnodes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc_per_node)]
        if nnodes > 1:
            assert rdzv_endpoint is not None
            launcher += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint]
            launcher += ["--rdzv-id", run_id]
        else:
            launcher += ["--standalone"]
        launcher.append("-m")
    return launcher


def run_workload(launch: Launch, where: Where, settings: AgentSettings, doc: dict[str, Any]) -> int:
    """Run the workload under a job, then print its figures and the report; its exit status."""
    spec = job_spec(
        where.job_id or default_job_id(launch.name),
        launch.name,
        launch.kind,
        launch.units,
        launch.labels,
        claimed_devices(where.devices),
    )
    check_host(spec, settings)
    with tempfile.TemporaryDirectory(prefix="wattline-workload-") as tmp:
        result_path = Path(tmp) / "result.json"
        command = [*(launch.launcher or [sys.executable, "-m"]), f"{MODULE}.{launch.module}", *launch.args]
        command += ["--result-json", str(result_path)]
        request = RunRequest(command, spec, env=launch.env, stdout_to_stderr=where.as_json)
        # progress: the live line (wattline/jobs/wrappers/live.py)
        live_out = sys.stderr if sys.stderr.isatty() else None
        job = Job(request, settings, doc, where.collectors, where.store, where.verbose, live_out)
        status, elsewhere = run_in_job(job, where.settings)
        result = json.loads(result_path.read_text()) if result_path.exists() else None
    if elsewhere:
        if where.as_json:
            _print_json(result, None, None)
        elif result is not None:
            print_workload(result, None, Console(file=sys.stdout))
        return status
    reports: list[Report] = []
    status = after_the_command(status, lambda: reports.append(read_report(job, where.settings)))
    if not reports:
        return status
    report = reports[0]
    check = cross_check(report, result)
    data = report_json(report)
    if where.report_json_path is not None:
        where.report_json_path.write_text(json.dumps(data, indent=2) + "\n")
    if where.as_json:
        _print_json(result, check, data)
    else:
        console = Console(file=sys.stdout)
        if result is not None:
            print_workload(result, check, console)
        print_report(report, console)
        console.print(
            f"Compare with another run: wattline compare {spec.job_id} OTHER_JOB_ID "
            f"(two CPU configurations: {DEMO_ONLY})."
        )
    if status == 0 and result is None:
        raise ConfigError("the workload ended without its result file")
    return status


def _print_json(result: dict[str, Any] | None, check: dict[str, Any] | None, report: dict[str, Any] | None) -> None:
    out = {"schema": WORKLOAD_SCHEMA, "note": RANDOM_WEIGHTS, "workload": result, "check": check, "report": report}
    print(json.dumps(out, indent=2), flush=True)
