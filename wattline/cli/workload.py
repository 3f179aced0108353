"""``wattline workload``: the study's two experiments as reference workloads.

Each command runs ``wattline run``'s machinery in-process: it opens the job (embedded
sampling into the local store, or a collector), starts the workload as a child
``python -m wattline.workloads.reference...`` that joins the job through the
environment and counts its own units, then prints the workload's own figures (ramp,
plateau, latency percentiles, step times) and the job's report.

The models have random weights and nothing is downloaded: they measure compute, not
accuracy. Comparing two CPU runs (fp32 against bf16, 1 thread against 2) with
``wattline compare`` is a demonstration of the method, not of accelerators.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from wattline.cli.agent_entry import agent_settings
from wattline.cli.daemons import (
    INFLUX_API,
    INFLUX_BUCKET,
    INFLUX_DATABASE,
    INFLUX_ORG,
    INFLUX_TOKEN_FILE,
)
from wattline.cli.jobs import (
    CARBON,
    CONFIG_HELP,
    IDLE,
    PRICE,
    PUE,
    SHARE,
    STORE_HELP,
    VERBOSE,
    StoreChoice,
    after_the_command,
    check_host,
    job_spec,
    open_reader,
    report_settings,
    sources_line,
    store_choice,
)
from wattline.config import ConfigError
from wattline.workloads.job import default_job_id
from wattline.workloads.reference.common import (
    DEMO_ONLY,
    DEVICES,
    DTYPES,
    EXTRA_HINT,
    RANDOM_WEIGHTS,
    import_torch,
    missing_extra,
    probe_devices,
    resolve_device,
)
from wattline.workloads.render import print_report, report_json
from wattline.workloads.report import Report, ReportSettings, build_complete_report, report_wait_s
from wattline.workloads.run import RunRequest, devices_from_env, parse_devices, resolve_gpu_claims, run_job
from wattline.workloads.saturation import detect_saturation

#: Version of the ``--json`` shape below (the report inside keeps its own schema).
WORKLOAD_SCHEMA = "wattline.workload/1"
MODULE = "wattline.workloads.reference"

app = typer.Typer(
    name="workload",
    help="Reference workloads: the study's LayoutLM inference and BERT-Large pre-training, "
    f"on CPU, CUDA or Neuron ({RANDOM_WEIGHTS}).",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help: "[agent]" is a TOML table, not markup
)

DEVICE = typer.Option("auto", "--device", help=f"{' | '.join(DEVICES)}: auto takes neuron, else cuda, else cpu.")
DTYPE = typer.Option("fp32", "--dtype", help=f"{' | '.join(DTYPES)} (recorded as a job label).")
THREADS = typer.Option(None, "--threads", help="torch CPU threads per process (default: torch's; a job label).")
DURATION = typer.Option(None, "--duration", help="Seconds measured after saturation (default by size).")
SATURATION = typer.Option(
    "mark", "--saturation", help="mark: the workload marks its saturation point; detect: the report finds it."
)
JOB = typer.Option(None, "--job", help="Job name (default: the workload, size and sequence length).")
JOB_ID = typer.Option(None, "--job-id", help="Job id (default: $SLURM_JOB_ID, $TORCHELASTIC_RUN_ID, or new).")
STORE = typer.Option(None, "--store", help=STORE_HELP)
CONFIG = typer.Option(None, "--config", "-c", help=CONFIG_HELP)
COLLECTORS = typer.Option(
    None, "--collector", help="Send job events to this collector (a host agent samples); default: embedded sampling."
)
DEVICES_OPT = typer.Option(
    None, "--devices", help="Devices charged in full (default: CUDA_VISIBLE_DEVICES / NEURON_RT_VISIBLE_CORES)."
)
INTERVAL = typer.Option(None, "--interval", "-i", help="Embedded sampling interval, seconds.")
AS_JSON = typer.Option(
    False, "--json", help=f"Print the workload's figures and the report as JSON ({WORKLOAD_SCHEMA})."
)
REPORT_JSON = typer.Option(None, "--report-json", help="Also write the report alone as JSON to this file.")
SEED = typer.Option(0, "--seed", help="Seed of the weights and the synthetic data.")
COMPILE = typer.Option(False, "--compile", help="torch.compile the model (compilation falls in the warm-up).")


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
    """Store, sampling and report options common to both commands."""

    job_id: str | None
    store: str | None
    config: Path | None
    collectors: list[str] | None
    devices: str | None
    interval: float | None
    as_json: bool
    report_json_path: Path | None
    settings: ReportSettings
    choice: StoreChoice
    verbose: bool = False


def require_extra() -> Any:
    """The torch module; one line and exit 2 when the ``workloads`` extra is missing."""
    if missing_extra() is not None:
        typer.echo(f"wattline: error: {EXTRA_HINT}", err=True)
        raise typer.Exit(2)
    try:
        return import_torch()
    except ImportError as exc:
        typer.echo(f"wattline: error: {EXTRA_HINT} ({exc})", err=True)
        raise typer.Exit(2) from None


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


def execute(launch: Launch, where: Where) -> None:
    """Run the workload under a job, then print its figures and the report; exits with its status."""
    claims = resolve_gpu_claims(parse_devices(where.devices) if where.devices else devices_from_env(os.environ))
    spec = job_spec(
        where.job_id or default_job_id(launch.name), launch.name, launch.kind, launch.units, launch.labels, claims
    )
    settings, doc = agent_settings(
        where.config, interval=where.interval, sysfs_root=None, host_id=None, collectors=where.collectors
    )
    check_host(spec, settings)
    with tempfile.TemporaryDirectory(prefix="wattline-workload-") as tmp:
        result_path = Path(tmp) / "result.json"
        command = [*(launch.launcher or [sys.executable, "-m"]), f"{MODULE}.{launch.module}", *launch.args]
        command += ["--result-json", str(result_path)]
        kept: list[str] = []
        request = RunRequest(command, spec, env=launch.env, stdout_to_stderr=where.as_json)
        live_out = sys.stderr if sys.stderr.isatty() else None  # progress: the live line (workloads/live.py)
        with sources_line(where.verbose) as on_sources:
            status = run_job(
                request,
                settings,
                doc,
                where.collectors,
                on_kept=kept.append,
                open_store=where.choice.open,
                on_sources=on_sources,
                live_out=live_out,
            )
        result = json.loads(result_path.read_text()) if result_path.exists() else None
    if kept or (where.collectors and where.store is None):
        recorded = f"job {spec.job_id} recorded; report: wattline report {spec.job_id} --store <the collector's store>"
        typer.echo(f"wattline: {kept[0]}" if kept else recorded, err=True)
        if where.as_json:
            out = {"schema": WORKLOAD_SCHEMA, "note": RANDOM_WEIGHTS, "workload": result, "check": None, "report": None}
            typer.echo(json.dumps(out, indent=2))
        elif result is not None:
            print_workload(result, None, Console(file=sys.stdout))
        raise typer.Exit(status)
    with after_the_command(status), open_reader(where.choice) as reader:
        report = build_complete_report(reader, spec.job_id, where.settings, report_wait_s(settings.batch_interval))
    check = cross_check(report, result)
    data = report_json(report)
    if where.report_json_path is not None:
        where.report_json_path.write_text(json.dumps(data, indent=2) + "\n")
    if where.as_json:
        out = {"schema": WORKLOAD_SCHEMA, "note": RANDOM_WEIGHTS, "workload": result, "check": check, "report": data}
        typer.echo(json.dumps(out, indent=2))
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
    raise typer.Exit(status)


def cross_check(report: Report, result: dict[str, Any] | None) -> dict[str, Any]:
    """Units counted by the job against units the workload processed, and where throughput
    detection alone (ignoring any mark) puts saturation."""
    job = report.job
    detected = detect_saturation(
        job.start_ns, report.end_ns, unit_events=job.unit_events or None, params=report.settings.saturation
    )
    processed = None if result is None else result.get("units_processed")
    return {
        "units_counted": job.units_total,
        "units_processed": processed,
        "units_match": processed is not None and float(processed) == job.units_total,
        "saturation_method": report.saturation.method,
        "saturation_at_s": _offset(report.saturation.at_ns, job.start_ns),
        "detection_alone": {
            "saturated": detected.saturated,
            "at_s": _offset(detected.at_ns, job.start_ns),
            "method": detected.method,
            "reason": detected.reason,
        },
    }


def _offset(at_ns: int | None, start_ns: int) -> float | None:
    return None if at_ns is None else (at_ns - start_ns) / 1e9


def _ms(summary: dict[str, Any], key: str) -> str:
    value = summary.get(key)
    return "n/a" if value is None else f"{value:,.2f}"


def print_workload(result: dict[str, Any], check: dict[str, Any] | None, console: Console) -> None:
    """The workload's own figures: model, ramp or warm-up, measured period, the cross-check."""
    model = result.get("model", {})
    console.print(
        f"[bold]{result.get('workload')}[/bold]: {model.get('class')} {model.get('size')} "
        f"({model.get('parameters', 0) / 1e6:.1f} M parameters) on {result.get('device')}, {result.get('dtype')}, "
        f"{result.get('threads')} CPU thread(s) - {RANDOM_WEIGHTS}"
    )
    measured = result.get("measured", {})
    if "ramp" in result:
        ramp = Table(title=f"Load ramp (a step must gain {result['ramp']['min_gain']:.0%})")
        for col in ("concurrency", "batch", "documents/s"):
            ramp.add_column(col, justify="right")
        for s in result["ramp"]["steps"]:
            ramp.add_row(str(s["concurrency"]), str(s["batch_size"]), f"{s['throughput_per_s']:,.1f}")
        console.print(ramp)
        plateau = result["plateau"]
        t = Table(
            title=f"Plateau held {measured['seconds']:.1f} s: concurrency {plateau['concurrency']}, "
            f"batch {plateau['batch_size']}"
        )
        t.add_column("latency, ms")
        for col in ("p50", "p90", "p99", "max"):
            t.add_column(col, justify="right")
        for label, key in (
            ("per batch (each document waits this)", "batch_latency_ms"),
            ("per document", "per_document_ms"),
        ):
            summary = measured.get(key, {})
            t.add_row(label, *(_ms(summary, k) for k in ("p50", "p90", "p99", "max")))
        console.print(t)
        console.print(
            f"Throughput at the plateau: {measured['throughput_per_s']:,.1f} documents/s "
            f"({measured['throughput_per_h']:,.0f} per hour)"
        )
    else:
        warm = result.get("warmup", {})
        step = measured.get("step_ms", {})
        console.print(
            f"seq {result.get('seq_len')}, batch {result.get('batch_size')} x {result.get('world_size')} process(es); "
            f"warm-up {warm.get('steps')} steps, {warm.get('seconds', 0):.1f} s ({warm.get('reason')})"
        )
        console.print(
            f"After warm-up: {measured.get('steps')} steps in {measured.get('seconds', 0):.1f} s, "
            f"{measured.get('throughput_per_s', 0):,.1f} sequences/s, step p50 {_ms(step, 'p50')} ms, "
            f"p99 {_ms(step, 'p99')} ms; final loss {result.get('final_loss', float('nan')):.3f}"
        )
    if check is not None:
        match = "yes" if check["units_match"] else "NO"
        console.print(
            f"Units counted by the job {check['units_counted']:,.0f}, processed by the workload "
            f"{check['units_processed'] if check['units_processed'] is not None else 'n/a'}: match {match}"
        )
        alone = check["detection_alone"]
        where = f"at {alone['at_s']:.1f} s" if alone["saturated"] else f"not found ({alone['reason']})"
        console.print(f"Throughput-plateau detection alone (ignoring any mark): {where}")


def _where(
    job_id: str | None,
    store: str | None,
    config: Path | None,
    collectors: list[str] | None,
    devices: str | None,
    interval: float | None,
    as_json: bool,
    report_json_path: Path | None,
    price: float | None,
    carbon_intensity: str | None,
    pue: float,
    idle: str,
    share_rule: str,
    choice: StoreChoice,
    verbose: bool,
) -> Where:
    rsettings = report_settings(price, carbon_intensity, pue, idle, share_rule)
    return Where(
        job_id, store, config, collectors, devices, interval, as_json, report_json_path, rsettings, choice, verbose
    )


def _positive(value: float | int | None, option: str) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"option {option}: {value} must be > 0")


def _check_saturation(saturation: str) -> None:
    if saturation not in {"mark", "detect"}:
        raise ConfigError(f"option --saturation: {saturation!r} is not mark or detect")


@app.command("layoutlm-inference")
def layoutlm_inference(
    size: str = typer.Option(
        "base", "--size", help="base (LayoutLM-base, 512 tokens) or tiny (CI: seconds on 2 cores)."
    ),
    device: str = DEVICE,
    dtype: str = DTYPE,
    threads: int | None = THREADS,
    duration: float | None = DURATION,
    step_seconds: float | None = typer.Option(None, "--step-seconds", help="Seconds per ramp step (default by size)."),
    max_batch: int | None = typer.Option(None, "--max-batch", help="Largest batch size the ramp tries."),
    max_concurrency: int | None = typer.Option(
        None, "--max-concurrency", help="Most parallel clients the ramp tries (default 2 on CPU, else 4)."
    ),
    min_gain: float = typer.Option(
        0.05, "--min-gain", help="A ramp step must raise throughput this much (0.05 = 5 %)."
    ),
    saturation: str = SATURATION,
    compile_model: bool = COMPILE,
    seed: int = SEED,
    job: str | None = JOB,
    job_id: str | None = JOB_ID,
    store: str | None = STORE,
    config: Path | None = CONFIG,
    collectors: list[str] | None = COLLECTORS,
    devices: str | None = DEVICES_OPT,
    interval: float | None = INTERVAL,
    as_json: bool = AS_JSON,
    report_json_path: Path | None = REPORT_JSON,
    price: float | None = PRICE,
    carbon_intensity: str | None = CARBON,
    pue: float = PUE,
    idle: str = IDLE,
    share_rule: str = SHARE,
    influx_api: str | None = INFLUX_API,
    influx_database: str | None = INFLUX_DATABASE,
    influx_org: str | None = INFLUX_ORG,
    influx_bucket: str | None = INFLUX_BUCKET,
    influx_token_file: Path | None = INFLUX_TOKEN_FILE,
    verbose: bool = VERBOSE,
) -> None:
    """LayoutLM document understanding, driven to saturation; counts inferences (documents).

    A load generator raises batch size, then concurrency, until throughput gains less
    than --min-gain, then holds that plateau for --duration: latency p50/p90/p99 per
    batch and per document, energy per inference. Random weights, no download.
    """
    from wattline.workloads.reference.layoutlm_inference import SEQ_LEN, SIZES

    if size not in SIZES:
        raise ConfigError(f"option --size: {size!r} is not one of {', '.join(sorted(SIZES))}")
    _check_saturation(saturation)
    for value, option in ((duration, "--duration"), (step_seconds, "--step-seconds"), (max_batch, "--max-batch")):
        _positive(value, option)
    _positive(max_concurrency, "--max-concurrency")
    where = _where(
        job_id,
        store,
        config,
        collectors,
        devices,
        interval,
        as_json,
        report_json_path,
        price,
        carbon_intensity,
        pue,
        idle,
        share_rule,
        store_choice(store, config, influx_api, influx_database, influx_org, influx_bucket, influx_token_file),
        verbose,
    )
    torch = require_extra()
    labels = resolve(torch, device, dtype, threads)
    if compile_model and labels["device"] == "neuron":
        raise ConfigError("option --compile: does not apply to --device neuron (traced per batch size)")
    labels.update(workload="layoutlm-inference", size=size, seq_len=str(SEQ_LEN[size]))
    args = ["--size", size, "--device", labels["device"], "--dtype", dtype, "--threads", labels["threads"]]
    args += ["--saturation", saturation, "--seed", str(seed), "--min-gain", str(min_gain)]
    for flag, value in (
        ("--duration", duration),
        ("--step-seconds", step_seconds),
        ("--max-batch", max_batch),
        ("--max-concurrency", max_concurrency),
    ):
        if value is not None:
            args += [flag, str(value)]
    if compile_model:
        args.append("--compile")
    name = job or f"layoutlm-inference-{size}"
    execute(Launch(name, "inference", "inferences", "layoutlm_inference", args, labels), where)


@app.command("bert-pretrain")
def bert_pretrain(
    size: str = typer.Option("large", "--size", help="large (BERT-Large) or tiny (CI: seconds on 2 cores)."),
    seq_len: int = typer.Option(128, "--seq-len", help="128 or 512 (BERT's two pre-training phases)."),
    batch_size: int | None = typer.Option(
        None, "--batch-size", help="Sequences per step per process (default: large 32 / 8, tiny 8 / 2 at 128 / 512)."
    ),
    device: str = DEVICE,
    dtype: str = typer.Option("fp32", "--dtype", help="fp32 | bf16 (autocast mixed precision; a job label)."),
    threads: int | None = THREADS,
    duration: float | None = DURATION,
    warmup_steps: int = typer.Option(3, "--warmup-steps", help="Steps always counted as warm-up."),
    saturation: str = SATURATION,
    compile_model: bool = COMPILE,
    nproc_per_node: int = typer.Option(
        1, "--nproc-per-node", help="Processes on this host (torchrun; one per GPU / NeuronCore)."
    ),
    nnodes: int = typer.Option(1, "--nnodes", help="Hosts in the job (needs --rdzv-endpoint and one --job-id)."),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of torchrun's rendezvous."),
    seed: int = SEED,
    job: str | None = JOB,
    job_id: str | None = JOB_ID,
    store: str | None = STORE,
    config: Path | None = CONFIG,
    collectors: list[str] | None = COLLECTORS,
    devices: str | None = DEVICES_OPT,
    interval: float | None = INTERVAL,
    as_json: bool = AS_JSON,
    report_json_path: Path | None = REPORT_JSON,
    price: float | None = PRICE,
    carbon_intensity: str | None = CARBON,
    pue: float = PUE,
    idle: str = IDLE,
    share_rule: str = SHARE,
    influx_api: str | None = INFLUX_API,
    influx_database: str | None = INFLUX_DATABASE,
    influx_org: str | None = INFLUX_ORG,
    influx_bucket: str | None = INFLUX_BUCKET,
    influx_token_file: Path | None = INFLUX_TOKEN_FILE,
    verbose: bool = VERBOSE,
) -> None:
    """BERT masked-LM pre-training from scratch; counts sequences.

    Warm-up (first steps, compilation) ends when the step time is steady; the workload
    marks saturation there and trains --duration seconds more. Several processes or
    hosts run under torchrun with one job id. Random weights, no download.
    """
    from wattline.workloads.reference.bert_pretrain import DEFAULT_BATCH, SEQ_LENS, SIZES

    if size not in SIZES:
        raise ConfigError(f"option --size: {size!r} is not one of {', '.join(sorted(SIZES))}")
    if seq_len not in SEQ_LENS:
        raise ConfigError(f"option --seq-len: {seq_len} is not one of {', '.join(map(str, SEQ_LENS))}")
    _check_saturation(saturation)
    _positive(batch_size, "--batch-size")
    _positive(duration, "--duration")
    _positive(nproc_per_node, "--nproc-per-node")
    _positive(nnodes, "--nnodes")
    if warmup_steps < 0:
        raise ConfigError(f"option --warmup-steps: {warmup_steps} is negative")
    run_id = job_id or default_job_id(job or f"bert-pretrain-{size}-seq{seq_len}")
    if nnodes > 1 and (rdzv_endpoint is None or (job_id is None and not _launcher_job_id())):
        raise ConfigError("option --nnodes: several hosts need --rdzv-endpoint and the same --job-id on every host")
    where = _where(
        run_id,
        store,
        config,
        collectors,
        devices,
        interval,
        as_json,
        report_json_path,
        price,
        carbon_intensity,
        pue,
        idle,
        share_rule,
        store_choice(store, config, influx_api, influx_database, influx_org, influx_bucket, influx_token_file),
        verbose,
    )
    torch = require_extra()
    processes = nproc_per_node
    labels = resolve(torch, device, dtype, threads, processes)
    labels.update(workload="bert-pretrain", size=size, seq_len=str(seq_len), world_size=str(nproc_per_node * nnodes))
    args = ["--size", size, "--seq-len", str(seq_len), "--device", labels["device"], "--dtype", dtype]
    args += ["--threads", labels["threads"], "--saturation", saturation, "--seed", str(seed)]
    args += ["--warmup-steps", str(warmup_steps)]
    if batch_size is not None:
        args += ["--batch-size", str(batch_size)]
    if duration is not None:
        args += ["--duration", str(duration)]
    if compile_model:
        args.append("--compile")
    labels["batch_size"] = str(batch_size or DEFAULT_BATCH[(size, seq_len)])
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
        if nnodes > 1 and not collectors and (store is None or store.startswith("sqlite")):
            typer.echo(
                "wattline: warning: each host's SQLite store holds that host alone; "
                "use --collector or a shared InfluxDB --store for the whole job",
                err=True,
            )
    name = job or f"bert-pretrain-{size}-seq{seq_len}"
    env = {"OMP_NUM_THREADS": labels["threads"]} if launcher else {}
    execute(Launch(name, "training", "sequences", "bert_pretrain", args, labels, launcher, env), where)


def _launcher_job_id() -> bool:
    return any(os.environ.get(v) for v in ("WATTLINE_JOB_ID", "SLURM_JOB_ID"))


def register(root: typer.Typer) -> None:
    """Add the ``workload`` command group to ``root``."""
    root.add_typer(app, name="workload")
