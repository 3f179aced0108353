"""The study's training experiment: BERT-Large masked-LM pre-training from scratch.

``BertForMaskedLM`` is built from a ``BertConfig`` with random initialization (random
weights, no download: measures compute, not accuracy) and trained on synthetic token
batches of ``--seq-len`` 128 or 512 (BERT's two pre-training phases) with BERT's 15 %
masking, AdamW (no decay on biases and LayerNorm, linear learning-rate warm-up) and
gradient clipping at 1.0. Every completed step counts its sequences through the Job API.

Warm-up. The first steps (allocator and kernel caches; with ``--compile`` or on Neuron,
graph compilation) are slow. The workload waits ``--warmup-steps`` steps, then until
the step time is steady (the median of the last 5 steps within 10 % of the 5 before,
:func:`.common.is_steady`), and marks the job saturated from there (``--saturation
mark``, the default; ``--saturation detect`` leaves the point to the report's
throughput-plateau detection). It then trains for ``--duration`` seconds more.

Several processes, several hosts: start it with torchrun, one job id for all::

    # on every host (same --rdzv-id; the job id is taken from $TORCHELASTIC_RUN_ID)
    torchrun --nnodes 16 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint head-node:29500 --rdzv-id bert-large-run1 \\
        -m wattline.reference.bert_pretrain --size large --seq-len 128 \\
        --collector collector:50051

Ranks use ``torch.distributed`` (gloo on CPU, nccl on CUDA, xla on Neuron) and
DistributedDataParallel. Only ``LOCAL_RANK`` 0 of each host talks to the job (one
sampler per host): it counts ``batch size x LOCAL_WORLD_SIZE`` sequences per step; the
ranks agree on every step whether to mark and whether to stop (one small all-reduce),
so every rank runs the same number of steps. ``wattline workload bert-pretrain
--nproc-per-node N`` does the single-host case itself.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from wattline.reference.common import (
    DEVICES,
    DTYPES,
    EXTRA_HINT,
    RANDOM_WEIGHTS,
    RESULT_SCHEMA,
    MissingExtra,
    check_dtype,
    env_int,
    exit_now,
    import_torch,
    import_transformers,
    is_steady,
    latency_summary,
    mlm_batch,
    probe_devices,
    resolve_device,
    set_threads,
    synchronize,
    torch_device,
    torch_dtype,
)

WORKLOAD = "bert-pretrain"

#: ``large`` is BERT-Large; ``tiny`` runs in seconds on two CPU cores.
SIZES: dict[str, dict[str, int]] = {
    "large": {
        "vocab_size": 30522,
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
        "max_position_embeddings": 512,
    },
    "tiny": {
        "vocab_size": 4096,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 256,
        "max_position_embeddings": 512,
    },
}
SEQ_LENS = (128, 512)
#: Sequences per step per process, by size and sequence length.
DEFAULT_BATCH = {("large", 128): 32, ("large", 512): 8, ("tiny", 128): 8, ("tiny", 512): 2}
DEFAULTS = {
    "large": {"duration": 300.0, "max_warmup": 900.0, "lr_warmup_steps": 10000},
    "tiny": {"duration": 20.0, "max_warmup": 30.0, "lr_warmup_steps": 100},
}
STEADY_WINDOW = 5
STEADY_TOLERANCE = 0.10
POOL_BATCHES = 4
LOG_EVERY_S = 5.0


def log(rank: int, message: str) -> None:
    print(f"[{WORKLOAD} rank {rank}] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else WORKLOAD)
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--seq-len", type=int, choices=SEQ_LENS, default=128)
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step per process")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--dtype", choices=DTYPES, default="fp32", help="bf16: autocast mixed precision")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op CPU threads per process")
    p.add_argument("--duration", type=float, default=None, help="seconds of training after saturation")
    p.add_argument("--warmup-steps", type=int, default=3, help="steps always counted as warm-up")
    p.add_argument("--max-warmup", type=float, default=None, help="seconds after which warm-up ends regardless")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--saturation", choices=("mark", "detect"), default="mark")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (its compilation is warm-up)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job", default=None, help="job name when run alone (default: bert-pretrain-SIZE-seqLEN)")
    p.add_argument("--collector", action="append", default=None, help="when run alone: send job events here")
    p.add_argument("--result-json", type=Path, default=None, help="write the result here instead of stdout")
    args = p.parse_args(argv)
    d = DEFAULTS[args.size]
    args.batch_size = args.batch_size or DEFAULT_BATCH[(args.size, args.seq_len)]
    args.duration = d["duration"] if args.duration is None else args.duration
    args.max_warmup = d["max_warmup"] if args.max_warmup is None else args.max_warmup
    if args.batch_size < 1 or args.duration <= 0 or args.warmup_steps < 0 or args.max_warmup <= 0:
        p.error("--batch-size >= 1, --duration > 0, --warmup-steps >= 0 and --max-warmup > 0 please")
    return args


class Trainer:
    """Model, optimizer and a pool of synthetic batches on one device."""

    def __init__(self, args: argparse.Namespace, device: str, rank: int, world: int) -> None:
        torch = import_torch()
        transformers = import_transformers()
        self.torch = torch
        self.device_name = device
        self.device = torch_device(torch, device)
        cfg = transformers.BertConfig(**SIZES[args.size])
        torch.manual_seed(args.seed)  # the same initial weights on every rank
        model = transformers.BertForMaskedLM(cfg).to(self.device).train()
        self.parameters = sum(p.numel() for p in model.parameters())
        decay = [p for n, p in model.named_parameters() if not n.endswith("bias") and "LayerNorm" not in n]
        no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
            lr=args.lr,
            betas=(0.9, 0.999),
            eps=1e-6,
        )
        warm = DEFAULTS[args.size]["lr_warmup_steps"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warm))
        if args.compile:
            model = torch.compile(model)
        if world > 1:
            ids = [self.device.index] if device == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        self.model = model
        self.batches = [
            {
                k: v.to(self.device)
                for k, v in mlm_batch(
                    torch, args.batch_size, args.seq_len, cfg.vocab_size, args.seed + 7919 * rank + i
                ).items()
            }
            for i in range(POOL_BATCHES)
        ]
        autocast_device = {"cpu": "cpu", "cuda": "cuda", "neuron": "xla"}[device]
        self.bf16 = args.dtype == "bf16"
        self.autocast_device = autocast_device
        self.dtype = torch_dtype(torch, args.dtype)
        self.mark_step: Any = None
        if device == "neuron":
            self.mark_step = importlib.import_module("torch_xla.core.xla_model").mark_step

    def step(self, index: int) -> Any:
        """One optimizer step on batch ``index``; returns the loss tensor, the step done."""
        batch = self.batches[index % len(self.batches)]
        ctx = self.torch.autocast(self.autocast_device, dtype=self.dtype) if self.bf16 else contextlib.nullcontext()
        with ctx:
            loss = self.model(**batch).loss
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.mark_step is not None:
            self.mark_step()
        synchronize(self.torch, self.device_name)
        return loss


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        torch = import_torch()
        import_transformers()
    except MissingExtra:
        print(EXTRA_HINT, file=sys.stderr)
        return 2
    env = os.environ
    try:
        rank, world = env_int(env, "RANK", 0), env_int(env, "WORLD_SIZE", 1)
        local_rank, local_world = env_int(env, "LOCAL_RANK", 0), env_int(env, "LOCAL_WORLD_SIZE", 1)
        node = env_int(env, "GROUP_RANK", 0)
        device = resolve_device(args.device, probe_devices(torch))
        check_dtype(args.dtype)
        threads = set_threads(torch, args.threads)
    except ValueError as exc:
        print(f"{WORKLOAD}: error: {exc}", file=sys.stderr)
        return 2
    dist = torch.distributed
    if world > 1:
        backend = {"cpu": "gloo", "cuda": "nccl", "neuron": "xla"}[device]
        if device == "neuron":
            importlib.import_module("torch_xla.distributed.xla_backend")
            dist.init_process_group(backend, init_method="xla://")
        else:
            dist.init_process_group(backend)
    try:
        return train(args, torch, device, threads, rank, world, local_rank, local_world, node)
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def train(
    args: argparse.Namespace,
    torch: Any,
    device: str,
    threads: int,
    rank: int,
    world: int,
    local_rank: int,
    local_world: int,
    node: int,
) -> int:
    from wattline.jobs.wrappers.job import Job

    counts_units = local_rank == 0
    if rank == 0:
        log(rank, f"BERT-{args.size}: {RANDOM_WEIGHTS}")
        if device == "cpu" and args.size != "tiny":
            log(rank, f"BERT-{args.size} on the CPU: minutes per step; --size tiny shows the method in a minute")
    t_build = time.perf_counter()
    trainer = Trainer(args, device, rank, world)
    if rank == 0:
        log(
            rank,
            f"{trainer.parameters / 1e6:.1f} M parameters, seq {args.seq_len}, batch {args.batch_size} x {world} "
            f"process(es), device {device}, {args.dtype}, {threads} CPU threads "
            f"(built in {time.perf_counter() - t_build:.1f} s)",
        )
    labels = {
        "workload": WORKLOAD,
        "size": args.size,
        "seq_len": str(args.seq_len),
        "batch_size": str(args.batch_size),
        "world_size": str(world),
        "device": device,
        "dtype": args.dtype,
        "threads": str(threads),
    }
    name = args.job or f"{WORKLOAD}-{args.size}-seq{args.seq_len}"
    job_cm: Any = (
        Job(name, kind="training", units="sequences", labels=labels, collector=args.collector)
        if counts_units
        else contextlib.nullcontext()
    )
    step_times: list[float] = []
    processed = 0
    steady_at: int | None = None
    steady_reason = ""
    measured_t0 = 0.0
    last_log = 0.0
    loss_value = float("nan")
    with job_cm as job:
        t_start = time.perf_counter()
        step = 0
        while True:
            t0 = time.perf_counter()
            loss = trainer.step(step)
            now = time.perf_counter()
            step_times.append(now - t0)
            step += 1
            processed += args.batch_size
            if job is not None:
                job.add_units(args.batch_size * local_world)
            steady = steady_at is not None or (
                step > args.warmup_steps and is_steady(step_times[args.warmup_steps :], STEADY_WINDOW, STEADY_TOLERANCE)
            )
            capped = steady_at is None and not steady and now - t_start >= args.max_warmup
            stop = steady_at is not None and now - measured_t0 >= args.duration
            flags = [float(steady or capped), float(capped), float(stop)]
            if world > 1:
                agreed = torch.tensor(flags, device=trainer.device)
                torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MAX)
                flags = [float(x) for x in agreed.tolist()]
            if steady_at is None and flags[0]:
                steady_at, measured_t0 = step, time.perf_counter()
                steady_reason = (
                    f"warm-up capped at {args.max_warmup:g} s (step time never steady)"
                    if flags[1]
                    else f"step time steady after {step} steps"
                )
                if job is not None and args.saturation == "mark":
                    job.mark_saturated()
                if rank == 0:
                    log(rank, f"{steady_reason}; training {args.duration:g} s more")
            if flags[2]:
                break
            if rank == 0 and now - last_log >= LOG_EVERY_S:
                last_log = now
                loss_value = float(loss.detach().float().item())
                rate = args.batch_size * world / step_times[-1]
                log(
                    rank, f"step {step}: {step_times[-1] * 1000:.1f} ms, {rate:,.1f} sequences/s, loss {loss_value:.3f}"
                )
        loss_value = float(loss.detach().float().item())
        measured_s = time.perf_counter() - measured_t0
    assert steady_at is not None
    measured_steps = step - steady_at
    per_rank = gather_counts(torch, world, node, processed)
    on_this_host = sum(n for host_node, n in per_rank if host_node == node)
    result = {
        "schema": RESULT_SCHEMA,
        "workload": WORKLOAD,
        "job_id": job.job_id if job is not None else None,
        "note": RANDOM_WEIGHTS,
        "model": {"class": "BertForMaskedLM", "size": args.size, **SIZES[args.size], "parameters": trainer.parameters},
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "world_size": world,
        "local_world_size": local_world,
        "host": socket.gethostname(),
        "device": device,
        "dtype": args.dtype,
        "threads": threads,
        "saturation": args.saturation,
        "warmup": {"steps": steady_at, "seconds": sum(step_times[:steady_at]), "reason": steady_reason},
        "measured": {
            "steps": measured_steps,
            "seconds": measured_s,
            "sequences": measured_steps * args.batch_size * world,
            "throughput_per_s": measured_steps * args.batch_size * world / measured_s if measured_s > 0 else 0.0,
            "tokens_per_s": measured_steps * args.batch_size * world * args.seq_len / measured_s
            if measured_s > 0
            else 0.0,
            "step_ms": latency_summary(step_times[steady_at:]),
        },
        "final_loss": loss_value,
        "steps": step,
        "sequences_processed_by_rank": [n for _, n in per_rank],
        "units_processed": on_this_host,
    }
    if counts_units:
        text = json.dumps(result)
        if args.result_json is None:
            print(text, flush=True)
        else:
            args.result_json.write_text(text + "\n")
        log(
            rank,
            f"{step} steps; {result['measured']['throughput_per_s']:,.1f} sequences/s after warm-up; "
            f"{on_this_host} sequences on this host",
        )
    return 0


def gather_counts(torch: Any, world: int, node: int, processed: int) -> list[tuple[int, int]]:
    """(node, sequences processed) of every rank, from each rank's own counter."""
    if world == 1:
        return [(node, processed)]
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, (node, processed))
    return [(int(a), int(b)) for a, b in out]


if __name__ == "__main__":
    exit_now(main())
