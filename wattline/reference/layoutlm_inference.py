"""The study's inference experiment: real-time document understanding with LayoutLM.

``LayoutLMForTokenClassification`` is built from a ``LayoutLMConfig`` with random
weights (random weights, no download: measures compute, not accuracy) and fed
synthetic documents: word-piece ids and word boxes on a 1000 x 1000 page.

A closed-loop load generator drives it to saturation the way the study did:

1. **Ramp.** At concurrency 1 the batch size doubles (1, 2, 4, ...) step by step;
   each step runs for ``--step-seconds`` (and at least 3 batches) and its throughput
   (documents/s) is measured. When a step gains less than ``--min-gain`` (5 %) over the
   best so far, the batch size stops rising and the best one is kept. Then concurrency
   (parallel clients sharing the model) rises 1, 2, ... the same way. See :class:`~.loadgen.Ramp`.
2. **Plateau.** The best configuration is held for ``--duration`` seconds: the
   measured period. Its batch latencies give p50/p90/p99 per batch (what every
   document of that batch waits) and per document (batch latency / batch size).

Every completed batch counts its documents through the Job API
(``job.add_units(batch_size)``), ramp included: the report puts the ramp in the
warm-up. The workload knows when its plateau configuration starts, so by default it
says so (``job.mark_saturated()``, ``--saturation mark``); ``--saturation detect``
leaves the point to the report's throughput-plateau detection instead.

Run it under ``wattline workload layoutlm-inference`` (which samples energy and prints
the report), under ``wattline run`` (it joins that job) or alone (it opens its own
embedded job)::

    python -m wattline.reference.layoutlm_inference --size tiny --duration 20
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import threading
import time
from dataclasses import asdict
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
    document_batch,
    exit_now,
    import_torch,
    import_transformers,
    latency_summary,
    probe_devices,
    resolve_device,
    set_threads,
    torch_device,
    torch_dtype,
)
from wattline.reference.loadgen import Ramp, run_level

WORKLOAD = "layoutlm-inference"

#: Model sizes: ``base`` is LayoutLM-base; ``tiny`` runs in seconds on two CPU cores.
SIZES: dict[str, dict[str, int]] = {
    "base": {
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
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
#: Document length in tokens per size (LayoutLM-base is used at its full 512).
SEQ_LEN = {"base": 512, "tiny": 64}
#: Token classes: FUNSD's BIO tags for header / question / answer, plus O.
NUM_LABELS = 7
DEFAULTS = {
    "base": {"duration": 120.0, "step_seconds": 10.0, "max_batch": 64},
    "tiny": {"duration": 20.0, "step_seconds": 1.5, "max_batch": 128},
}


# --- the model ---------------------------------------------------------------------


class Engine:
    """The model on its device and a pool of synthetic documents; ``infer`` runs one batch."""

    def __init__(
        self, size: str, device: str, dtype: str, max_batch: int, seed: int = 0, compile_model: bool = False
    ) -> None:
        torch = import_torch()
        transformers = import_transformers()
        self.torch = torch
        self.device_name = device
        self.seq_len = SEQ_LEN[size]
        cfg = transformers.LayoutLMConfig(**SIZES[size], num_labels=NUM_LABELS)
        torch.manual_seed(seed)
        model = transformers.LayoutLMForTokenClassification(cfg).eval()
        self.parameters = sum(p.numel() for p in model.parameters())
        pool_size = max(max_batch, 16)
        docs = document_batch(torch, pool_size, self.seq_len, cfg.vocab_size, seed)
        self.pool_size = pool_size
        self._traced: dict[int, Any] = {}
        self._prepared: set[int] = set()
        self.dtype = dtype
        if device == "neuron":
            self.model = model
            self.docs = docs  # a traced Neuron model takes CPU tensors
        else:
            self.device = torch_device(torch, device)
            self.model = model.to(self.device, dtype=torch_dtype(torch, dtype))
            if compile_model:
                self.model = torch.compile(self.model)
            self.docs = {k: v.to(self.device) for k, v in docs.items()}

    def inputs(self, batch_size: int, index: int) -> tuple[Any, Any, Any, Any]:
        """Batch ``index`` of ``batch_size`` documents: a slice of the pool, moving with the index."""
        lo = (index * batch_size) % (self.pool_size - batch_size + 1)
        hi = lo + batch_size
        d = self.docs
        return d["input_ids"][lo:hi], d["bbox"][lo:hi], d["attention_mask"][lo:hi], d["token_type_ids"][lo:hi]

    def prepare(self, batch_size: int) -> None:
        """Before the first timed batch of a size: compile for it where the device needs it
        (Neuron: one traced model per shape), then one untimed, uncounted batch (kernel
        selection, caches, ``torch.compile``), so a ramp step measures the steady rate."""
        if batch_size in self._prepared:
            return
        if self.device_name == "neuron":
            neuronx = importlib.import_module("torch_neuronx")
            cast = (
                ["--auto-cast", "all", "--auto-cast-type", "bf16"] if self.dtype == "bf16" else ["--auto-cast", "none"]
            )
            module = logits_module(self.torch, self.model)
            self._traced[batch_size] = neuronx.trace(module, self.inputs(batch_size, 0), compiler_args=cast)
        with self.context():
            self.infer(batch_size, 0)
        self._prepared.add(batch_size)

    def infer(self, batch_size: int, index: int) -> None:
        """One request: forward, then the predicted label per token back on the host."""
        ids, bbox, mask, types = self.inputs(batch_size, index)
        if self.device_name == "neuron":
            logits = self._traced[batch_size](ids, bbox, mask, types)
        else:
            logits = self.model(input_ids=ids, bbox=bbox, attention_mask=mask, token_type_ids=types).logits
        logits.argmax(-1).cpu()

    def context(self) -> Any:
        return self.torch.inference_mode()


def logits_module(torch: Any, model: Any) -> Any:
    """A positional-arguments wrapper returning logits (what tracing for Neuron needs)."""

    class Logits(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: Any, bbox: Any, mask: Any, types: Any) -> Any:
            return self.model(input_ids=ids, bbox=bbox, attention_mask=mask, token_type_ids=types, return_dict=False)[0]

    return Logits().eval()


def log(message: str) -> None:
    print(f"[{WORKLOAD}] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else WORKLOAD)
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--dtype", choices=DTYPES, default="fp32")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op CPU threads (default: torch's)")
    p.add_argument("--duration", type=float, default=None, help="seconds to hold the plateau (the measured period)")
    p.add_argument("--step-seconds", type=float, default=None, help="seconds per ramp step")
    p.add_argument("--max-batch", type=int, default=None, help="largest batch size the ramp tries")
    p.add_argument(
        "--batch-size", type=int, default=None, help="hold this batch size at concurrency 1, no ramp (a sweep's point)"
    )
    p.add_argument("--max-concurrency", type=int, default=None, help="most parallel clients the ramp tries")
    p.add_argument("--min-gain", type=float, default=0.05, help="a step must gain this much to count (0.05 = 5 %%)")
    p.add_argument("--saturation", choices=("mark", "detect"), default="mark")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (not with --device neuron)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job", default=None, help="job name when run alone (default: layoutlm-inference-SIZE)")
    p.add_argument("--collector", action="append", default=None, help="when run alone: send job events here")
    p.add_argument("--result-json", type=Path, default=None, help="write the result here instead of stdout")
    args = p.parse_args(argv)
    d = DEFAULTS[args.size]
    args.duration = d["duration"] if args.duration is None else args.duration
    args.step_seconds = d["step_seconds"] if args.step_seconds is None else args.step_seconds
    args.max_batch = int(d["max_batch"]) if args.max_batch is None else args.max_batch
    if args.batch_size is not None:
        if args.batch_size < 1:
            p.error("--batch-size must be >= 1")
        args.max_batch = args.batch_size  # the pool of documents is sized by it
    for name in ("duration", "step_seconds"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.max_batch < 1:
        p.error("--max-batch must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        torch = import_torch()
        import_transformers()
    except MissingExtra:
        print(EXTRA_HINT, file=sys.stderr)
        return 2
    from wattline.jobs.wrappers.job import Job

    try:
        device = resolve_device(args.device, probe_devices(torch))
        check_dtype(args.dtype)
        threads = set_threads(torch, args.threads)
    except ValueError as exc:
        print(f"{WORKLOAD}: error: {exc}", file=sys.stderr)
        return 2
    if args.compile and device == "neuron":
        print(
            f"{WORKLOAD}: error: --compile does not apply to --device neuron (traced per batch size)", file=sys.stderr
        )
        return 2
    max_concurrency = args.max_concurrency or (2 if device == "cpu" else 4)
    log(f"LayoutLM-{args.size}: {RANDOM_WEIGHTS}")
    if device == "cpu" and args.size != "tiny":
        log(f"LayoutLM-{args.size} on the CPU: seconds per document; --size tiny shows the method in a minute")
    t_build = time.perf_counter()
    engine = Engine(args.size, device, args.dtype, args.max_batch, args.seed, args.compile)
    log(
        f"{engine.parameters / 1e6:.1f} M parameters, {engine.seq_len} tokens per document, "
        f"device {device}, {args.dtype}, {threads} CPU threads (built in {time.perf_counter() - t_build:.1f} s)"
    )
    labels = {"workload": WORKLOAD, "size": args.size, "device": device, "dtype": args.dtype, "threads": str(threads)}
    # a fixed batch size is a ramp of one step: it warms up like any step, then is held
    ramp = Ramp(args.max_batch, max_concurrency, args.min_gain, fixed=args.batch_size)
    processed = [0]
    lock = threading.Lock()
    job_name = args.job or f"{WORKLOAD}-{args.size}"
    with Job(job_name, kind="inference", units="inferences", labels=labels, collector=args.collector) as job:

        def counted(n: int) -> None:
            with lock:
                processed[0] += n
            job.add_units(n)

        t0 = time.perf_counter()
        while (config := ramp.next()) is not None:
            engine.prepare(config.batch_size)
            step = run_level(engine.infer, config, args.step_seconds, counted, worker_context=engine.context)
            ramp.record(step.throughput)
            log(
                f"ramp: concurrency {config.concurrency}, batch {config.batch_size}: {step.throughput:,.1f} documents/s"
            )
        plateau = ramp.plateau
        assert plateau is not None
        ramp_s = time.perf_counter() - t0
        if args.saturation == "mark":
            job.mark_saturated()
        log(
            f"plateau: concurrency {plateau.concurrency}, batch {plateau.batch_size}; "
            f"holding for {args.duration:g} s ({'marked saturated' if args.saturation == 'mark' else 'detect'})"
        )
        # each batch's latency (what its documents wait) to a sweep's Pareto front
        held = run_level(
            engine.infer, plateau, args.duration, counted, worker_context=engine.context, on_latency=job.add_latency
        )
    per_doc = [s / plateau.batch_size for s in held.latencies_s]
    result = {
        "schema": RESULT_SCHEMA,
        "workload": WORKLOAD,
        "job_id": job.job_id,
        "note": RANDOM_WEIGHTS,
        "model": {
            "class": "LayoutLMForTokenClassification",
            "size": args.size,
            **SIZES[args.size],
            "num_labels": NUM_LABELS,
            "parameters": engine.parameters,
        },
        "seq_len": engine.seq_len,
        "device": device,
        "dtype": args.dtype,
        "threads": threads,
        "saturation": args.saturation,
        "ramp": {
            "seconds": ramp_s,
            "min_gain": args.min_gain,
            "steps": [{**asdict(c), "throughput_per_s": t} for c, t in ramp.history],
        },
        "plateau": asdict(plateau),
        "measured": {
            "seconds": held.seconds,
            "documents": held.documents,
            "throughput_per_s": held.throughput,
            "throughput_per_h": held.throughput * 3600,
            "batch_latency_ms": latency_summary(held.latencies_s),
            "per_document_ms": latency_summary(per_doc),
        },
        "units_processed": processed[0],
    }
    write_result(result, args.result_json)
    log(
        f"held {held.seconds:.1f} s: {held.throughput:,.1f} documents/s; "
        f"{processed[0]} documents processed in all (job {job.job_id})"
    )
    return 0


def write_result(result: dict[str, Any], path: Path | None) -> None:
    """The result as JSON: to ``path``, else as the last line on stdout."""
    text = json.dumps(result)
    if path is None:
        print(text, flush=True)
    else:
        path.write_text(text + "\n")


if __name__ == "__main__":
    exit_now(main())
