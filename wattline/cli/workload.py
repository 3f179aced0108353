"""``wattline workload``: the study's two experiments as reference workloads.

Each command parses its options, then runs ``wattline run``'s machinery in-process
(:mod:`wattline.reference.launch`): it opens the job (embedded
sampling into the local store, or a collector), starts the workload as a child
``python -m wattline.reference...`` that joins the job through the
environment and counts its own units, then prints the workload's own figures (ramp,
plateau, latency percentiles, step times) and the job's report.

The models have random weights and nothing is downloaded: they measure compute, not
accuracy. Comparing two CPU runs (fp32 against bf16, 1 thread against 2) with
``wattline compare`` is a demonstration of the method, not of accelerators.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from wattline.cli import panels
from wattline.cli.agent_entry import agent_settings
from wattline.cli.options import VERBOSE, StoreChoice, option_group, report_options, store_options
from wattline.config import ConfigError
from wattline.reference.common import (
    DEVICES,
    DTYPES,
    EXTRA_HINT,
    RANDOM_WEIGHTS,
    WORKLOAD_SCHEMA,
    import_torch,
    missing_extra,
)
from wattline.reports.model import ReportSettings

if TYPE_CHECKING:  # the launcher (jobs, reports) loads in the commands that run a workload
    from wattline.reference.launch import Launch

app = typer.Typer(
    name="workload",
    cls=panels.PanelGroup,
    help="Reference workloads: the study's LayoutLM inference (run to saturation, or served over HTTP) "
    f"and BERT-Large pre-training, on CPU, CUDA or Neuron ({RANDOM_WEIGHTS}); a stepped load for services.",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help: "[agent]" is a TOML table, not markup
)

DEVICE = typer.Option(
    "auto",
    "--device",
    help=f"{' | '.join(DEVICES)}: auto takes neuron, else cuda, else cpu.",
    rich_help_panel=panels.WORKLOAD,
)
DTYPE = typer.Option(
    "fp32", "--dtype", help=f"{' | '.join(DTYPES)} (recorded as a job label).", rich_help_panel=panels.WORKLOAD
)
THREADS = typer.Option(
    None,
    "--threads",
    help="torch CPU threads per process (default: torch's; a job label).",
    rich_help_panel=panels.WORKLOAD,
)
DURATION = typer.Option(
    None, "--duration", help="Seconds measured after saturation (default by size).", rich_help_panel=panels.WORKLOAD
)
SATURATION = typer.Option(
    "mark",
    "--saturation",
    help="mark: the workload marks its saturation point; detect: the report finds it.",
    rich_help_panel=panels.WORKLOAD,
)
JOB = typer.Option(
    None, "--job", help="Job name (default: the workload, size and sequence length).", rich_help_panel=panels.JOB
)
JOB_ID = typer.Option(
    None, "--job-id", help="Job id (default: $SLURM_JOB_ID, $TORCHELASTIC_RUN_ID, or new).", rich_help_panel=panels.JOB
)
COLLECTORS = typer.Option(
    None,
    "--collector",
    help="Send job events to this collector (a host agent samples); default: embedded sampling.",
    rich_help_panel=panels.STORE,
)
DEVICES_OPT = typer.Option(
    None,
    "--devices",
    help="Devices charged in full (default: CUDA_VISIBLE_DEVICES / NEURON_RT_VISIBLE_CORES).",
    rich_help_panel=panels.JOB,
)
INTERVAL = typer.Option(
    None, "--interval", "-i", help="Embedded sampling interval, seconds.", rich_help_panel=panels.HOST
)
AS_JSON = typer.Option(
    False,
    "--json",
    help=f"Print the workload's figures and the report as JSON ({WORKLOAD_SCHEMA}).",
    rich_help_panel=panels.OUTPUT,
)
REPORT_JSON = typer.Option(
    None, "--report-json", help="Also write the report alone as JSON to this file.", rich_help_panel=panels.OUTPUT
)
SEED = typer.Option(0, "--seed", help="Seed of the weights and the synthetic data.", rich_help_panel=panels.WORKLOAD)
COMPILE = typer.Option(
    False,
    "--compile",
    help="torch.compile the model (compilation falls in the warm-up).",
    rich_help_panel=panels.WORKLOAD,
)


@dataclass
class Common:
    """The options both workloads take beside the store's and the report's."""

    job: str | None
    job_id: str | None
    collectors: list[str] | None
    devices: str | None
    interval: float | None
    as_json: bool
    report_json_path: Path | None
    verbose: bool


#: The command gets ``common: Common``.
common_options = option_group(
    "common",
    Common,
    job=(str | None, JOB),
    job_id=(str | None, JOB_ID),
    collectors=(list[str] | None, COLLECTORS),
    devices=(str | None, DEVICES_OPT),
    interval=(float | None, INTERVAL),
    as_json=(bool, AS_JSON),
    report_json_path=(Path | None, REPORT_JSON),
    verbose=(bool, VERBOSE),
)


def _run(
    launch: Launch, common: Common, choice: StoreChoice, rsettings: ReportSettings, job_id: str | None = None
) -> None:
    """Run the workload as a job (:func:`run_workload`) and exit with its status."""
    from wattline.reference.launch import Where, run_workload

    settings, doc = agent_settings(
        choice.config, interval=common.interval, sysfs_root=None, host_id=None, collectors=common.collectors
    )
    store = choice.job_store()
    where = Where(
        job_id or common.job_id,
        common.collectors,
        common.devices,
        store,
        common.as_json,
        common.report_json_path,
        rsettings,
        common.verbose,
    )
    raise typer.Exit(run_workload(launch, where, settings, doc))


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


def positive(value: float | int | None, option: str) -> None:
    """ConfigError (one line) when ``value`` is given and not above 0."""
    if value is not None and value <= 0:
        raise ConfigError(f"option {option}: {value} must be > 0")


def _check_saturation(saturation: str) -> None:
    if saturation not in {"mark", "detect"}:
        raise ConfigError(f"option --saturation: {saturation!r} is not mark or detect")


@app.command("layoutlm-inference", cls=panels.PanelCommand)
@store_options
@report_options
@common_options
def layoutlm_inference(
    size: str = typer.Option(
        "base",
        "--size",
        help="base (LayoutLM-base, 512 tokens) or tiny (CI: seconds on 2 cores).",
        rich_help_panel=panels.WORKLOAD,
    ),
    device: str = DEVICE,
    dtype: str = DTYPE,
    threads: int | None = THREADS,
    duration: float | None = DURATION,
    step_seconds: float | None = typer.Option(
        None, "--step-seconds", help="Seconds per ramp step (default by size).", rich_help_panel=panels.WORKLOAD
    ),
    max_batch: int | None = typer.Option(
        None, "--max-batch", help="Largest batch size the ramp tries.", rich_help_panel=panels.WORKLOAD
    ),
    batch_size: int | None = typer.Option(
        None,
        "--batch-size",
        help="Hold this batch size (concurrency 1) after one warm-up step: no ramp.",
        rich_help_panel=panels.WORKLOAD,
    ),
    max_concurrency: int | None = typer.Option(
        None,
        "--max-concurrency",
        help="Most parallel clients the ramp tries (default 2 on CPU, else 4).",
        rich_help_panel=panels.WORKLOAD,
    ),
    min_gain: float = typer.Option(
        0.05,
        "--min-gain",
        help="A ramp step must raise throughput this much (0.05 = 5 %).",
        rich_help_panel=panels.WORKLOAD,
    ),
    saturation: str = SATURATION,
    compile_model: bool = COMPILE,
    seed: int = SEED,
    *,
    common: Common,
    choice: StoreChoice,
    rsettings: ReportSettings,
) -> None:
    """LayoutLM document understanding, driven to saturation; counts inferences (documents).

    A load generator raises batch size, then concurrency, until throughput gains less
    than --min-gain (or, with --batch-size, warms up at that size), then holds that plateau
    for --duration: latency p50/p90/p99 per batch and per document, energy per inference.
    Random weights, no download.
    """
    from wattline.reference.launch import Launch, resolve
    from wattline.reference.layoutlm_inference import SEQ_LEN, SIZES

    if size not in SIZES:
        raise ConfigError(f"option --size: {size!r} is not one of {', '.join(sorted(SIZES))}")
    _check_saturation(saturation)
    for value, option in (
        (duration, "--duration"), (step_seconds, "--step-seconds"), (max_batch, "--max-batch"),
        (max_concurrency, "--max-concurrency"), (batch_size, "--batch-size"),
    ):  # fmt: skip
        positive(value, option)
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
        ("--batch-size", batch_size),
    ):
        if value is not None:
            args += [flag, str(value)]
    if compile_model:
        args.append("--compile")
    name = common.job or f"layoutlm-inference-{size}"
    _run(Launch(name, "inference", "inferences", "layoutlm_inference", args, labels), common, choice, rsettings)


@app.command("bert-pretrain", cls=panels.PanelCommand)
@store_options
@report_options
@common_options
def bert_pretrain(
    size: str = typer.Option(
        "large", "--size", help="large (BERT-Large) or tiny (CI: seconds on 2 cores).", rich_help_panel=panels.WORKLOAD
    ),
    seq_len: int = typer.Option(
        128, "--seq-len", help="128 or 512 (BERT's two pre-training phases).", rich_help_panel=panels.WORKLOAD
    ),
    batch_size: int | None = typer.Option(
        None,
        "--batch-size",
        help="Sequences per step per process (default: large 32 / 8, tiny 8 / 2 at 128 / 512).",
        rich_help_panel=panels.WORKLOAD,
    ),
    device: str = DEVICE,
    dtype: str = typer.Option(
        "fp32", "--dtype", help="fp32 | bf16 (autocast mixed precision; a job label).", rich_help_panel=panels.WORKLOAD
    ),
    threads: int | None = THREADS,
    duration: float | None = DURATION,
    warmup_steps: int = typer.Option(
        3, "--warmup-steps", help="Steps always counted as warm-up.", rich_help_panel=panels.WORKLOAD
    ),
    saturation: str = SATURATION,
    compile_model: bool = COMPILE,
    nproc_per_node: int = typer.Option(
        1,
        "--nproc-per-node",
        help="Processes on this host (torchrun; one per GPU / NeuronCore).",
        rich_help_panel=panels.WORKLOAD,
    ),
    nnodes: int = typer.Option(
        1,
        "--nnodes",
        help="Hosts in the job (needs --rdzv-endpoint and one --job-id).",
        rich_help_panel=panels.WORKLOAD,
    ),
    rdzv_endpoint: str | None = typer.Option(
        None, "--rdzv-endpoint", help="HOST:PORT of torchrun's rendezvous.", rich_help_panel=panels.WORKLOAD
    ),
    seed: int = SEED,
    *,
    common: Common,
    choice: StoreChoice,
    rsettings: ReportSettings,
) -> None:
    """BERT masked-LM pre-training from scratch; counts sequences.

    Warm-up (first steps, compilation) ends when the step time is steady; the workload
    marks saturation there and trains --duration seconds more. Several processes or
    hosts run under torchrun with one job id. Random weights, no download.
    """
    from wattline.jobs.wrappers.job import default_job_id
    from wattline.reference.bert_pretrain import DEFAULT_BATCH, SEQ_LENS, SIZES
    from wattline.reference.launch import Launch, resolve, torchrun

    if size not in SIZES:
        raise ConfigError(f"option --size: {size!r} is not one of {', '.join(sorted(SIZES))}")
    if seq_len not in SEQ_LENS:
        raise ConfigError(f"option --seq-len: {seq_len} is not one of {', '.join(map(str, SEQ_LENS))}")
    _check_saturation(saturation)
    positive(batch_size, "--batch-size")
    positive(duration, "--duration")
    positive(nproc_per_node, "--nproc-per-node")
    positive(nnodes, "--nnodes")
    if warmup_steps < 0:
        raise ConfigError(f"option --warmup-steps: {warmup_steps} is negative")
    run_id = common.job_id or default_job_id(common.job or f"bert-pretrain-{size}-seq{seq_len}")
    if nnodes > 1 and (rdzv_endpoint is None or (common.job_id is None and not _launcher_job_id())):
        raise ConfigError("option --nnodes: several hosts need --rdzv-endpoint and the same --job-id on every host")
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
    launcher = torchrun(nproc_per_node, nnodes, rdzv_endpoint, run_id)
    if nnodes > 1 and not common.collectors and (choice.store is None or choice.store.startswith("sqlite")):
        typer.echo(
            "wattline: warning: each host's SQLite store holds that host alone; "
            "use --collector or a shared InfluxDB --store for the whole job",
            err=True,
        )
    name = common.job or f"bert-pretrain-{size}-seq{seq_len}"
    env = {"OMP_NUM_THREADS": labels["threads"]} if launcher else {}
    launch = Launch(name, "training", "sequences", "bert_pretrain", args, labels, launcher, env)
    _run(launch, common, choice, rsettings, run_id)


def _launcher_job_id() -> bool:
    return any(os.environ.get(v) for v in ("WATTLINE_JOB_ID", "SLURM_JOB_ID"))


def register(root: typer.Typer) -> None:
    """Add the ``workload`` command group to ``root``."""
    root.add_typer(app, name="workload", rich_help_panel=panels.REFERENCE)
