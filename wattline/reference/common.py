"""What both reference workloads share: the optional extra, devices, synthetic data, timing.

Nothing here imports torch at module level: the pure parts (device resolution, the
load generator's step logic, percentiles, step-time stability) work and are tested
without the ``workloads`` extra; the parts that build tensors take the ``torch`` module
from :func:`import_torch`.

Devices. ``cpu`` everywhere; ``cuda`` when ``torch.cuda.is_available()``; ``neuron``
(Inferentia / Trainium) when ``torch-neuronx`` and ``torch-xla`` are importable and a
``/dev/neuron*`` device exists. ``auto`` takes the first available of neuron, cuda, cpu.
The Neuron packages are imported only when the Neuron device is chosen (they come from
AWS's own package index with the Neuron SDK, not from the ``workloads`` extra).
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import math
import os
import random
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

#: The one line a missing ``workloads`` extra gives (CLI and workload modules alike).
EXTRA_HINT = "wattline workload needs the optional extra: pip install 'wattline[workloads]' (torch==2.13.0 first)"
#: Said wherever a model is built: nothing is downloaded, so accuracy means nothing.
RANDOM_WEIGHTS = "random weights, no download: measures compute, not accuracy"
#: Said wherever two CPU configurations are contrasted.
DEMO_ONLY = "a demonstration of the method, not of accelerators"
#: Version of ``wattline workload --json``'s shape (:func:`wattline.reference.launch.run_workload`;
#: the report inside keeps its own schema). Here, not there: the CLI's help names it without loading the launcher.
WORKLOAD_SCHEMA = "wattline.workload/1"
#: Version of the result a reference workload itself returns (its figures; `wattline workload` wraps it).
RESULT_SCHEMA = "wattline.reference/1"

DEVICES = ("auto", "cpu", "cuda", "neuron")
DTYPES = ("fp32", "bf16")
PERCENTILES = (50.0, 90.0, 99.0)

#: BERT-uncased special token ids (LayoutLM uses the same vocabulary).
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 101, 102, 103
#: Ordinary word pieces are drawn from here up (ids below are special or unused).
FIRST_WORD_ID = 1000
#: LayoutLM's page coordinate range and its boxes for [CLS] and [SEP].
PAGE = 1000
CLS_BOX = (0, 0, 0, 0)
SEP_BOX = (PAGE, PAGE, PAGE, PAGE)


class MissingExtra(ImportError):
    """torch or transformers is not importable."""


def missing_extra() -> str | None:
    """Name of the first missing package of the extra, without importing anything."""
    for name in ("torch", "transformers"):
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


def offline() -> None:
    """Never reach a model hub: the workloads build their models from a config."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"


def import_torch() -> Any:
    """The torch module, or :class:`MissingExtra` with the install hint."""
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise MissingExtra(EXTRA_HINT) from exc


def import_transformers() -> Any:
    """The transformers module (offline), or :class:`MissingExtra` with the install hint."""
    offline()
    try:
        return importlib.import_module("transformers")
    except ImportError as exc:
        raise MissingExtra(EXTRA_HINT) from exc


# --- devices -------------------------------------------------------------------------


@dataclass(frozen=True)
class Availability:
    """Which devices this host offers."""

    cuda: bool = False
    neuron: bool = False
    cuda_name: str = ""
    torch_build: str = ""


def neuron_present() -> bool:
    """torch-neuronx and torch-xla importable and a Neuron device node present."""
    if missing_module("torch_neuronx") or missing_module("torch_xla"):
        return False
    return bool(glob.glob("/dev/neuron[0-9]*"))


def missing_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def probe_devices(torch: Any) -> Availability:
    """What this host has (CUDA through torch, Neuron through its packages and /dev)."""
    cuda = bool(torch.cuda.is_available())
    name = str(torch.cuda.get_device_name(0)) if cuda else ""
    return Availability(cuda=cuda, neuron=neuron_present(), cuda_name=name, torch_build=str(torch.__version__))


def resolve_device(requested: str, available: Availability) -> str:
    """``auto`` to the best device present; an explicit device that is absent is a ValueError."""
    if requested not in DEVICES:
        raise ValueError(f"--device: {requested!r} is not one of {', '.join(DEVICES)}")
    if requested == "auto":
        return "neuron" if available.neuron else "cuda" if available.cuda else "cpu"
    if requested == "cuda" and not available.cuda:
        build = f" (torch {available.torch_build})" if available.torch_build else ""
        raise ValueError(f"--device cuda: no CUDA device is usable here{build}")
    if requested == "neuron" and not available.neuron:
        raise ValueError("--device neuron: needs torch-neuronx and torch-xla (Neuron SDK) and a /dev/neuron* device")
    return requested


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    return dtype


def torch_dtype(torch: Any, dtype: str) -> Any:
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[check_dtype(dtype)]


def torch_device(torch: Any, device: str) -> Any:
    """The torch device for ``cpu``, ``cuda`` (this process's LOCAL_RANK) or ``neuron`` (XLA)."""
    if device == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if device == "neuron":
        return importlib.import_module("torch_xla.core.xla_model").xla_device()
    return torch.device("cpu")


def synchronize(torch: Any, device: str) -> None:
    """Wait until the device has finished what was queued (so a counted unit is a done unit)."""
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "neuron":
        importlib.import_module("torch_xla.core.xla_model").wait_device_ops()


def set_threads(torch: Any, threads: int | None) -> int:
    """Intra-op CPU threads (``--threads``); returns the number in force."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads: {threads} is below 1")
        torch.set_num_threads(threads)
    return int(torch.get_num_threads())


# --- synthetic data ------------------------------------------------------------------


def layout_boxes(rng: random.Random, seq_len: int) -> list[tuple[int, int, int, int]]:
    """Word boxes of a synthetic page in reading order: ``[CLS]``, lines of words, ``[SEP]``.

    Words sit on lines left to right, lines top to bottom, within a 1000 x 1000 page
    (LayoutLM's normalized coordinates); every box has ``x0 <= x1`` and ``y0 <= y1``.
    """
    if seq_len < 2:
        raise ValueError("seq_len must be >= 2 ([CLS] and [SEP])")
    words = seq_len - 2
    per_line = rng.randint(6, 14)
    lines = max(1, math.ceil(words / per_line))
    top, left = rng.randint(20, 80), rng.randint(20, 80)
    line_h = max(1, min(30, (PAGE - 2 * top) // lines))
    col_w = max(2, (PAGE - 2 * left) // per_line)
    boxes: list[tuple[int, int, int, int]] = [CLS_BOX]
    for i in range(words):
        line, col = divmod(i, per_line)
        y0 = min(top + line * line_h, PAGE - line_h)
        y1 = min(PAGE, y0 + max(1, line_h - rng.randint(0, line_h // 3)))
        x0 = min(left + col * col_w + rng.randint(0, col_w // 4), PAGE - 1)
        x1 = min(PAGE, x0 + rng.randint(max(1, col_w // 3), max(1, col_w - 1)))
        boxes.append((x0, y0, x1, y1))
    boxes.append(SEP_BOX)
    return boxes


def document_batch(torch: Any, n: int, seq_len: int, vocab_size: int, seed: int = 0) -> dict[str, Any]:
    """``n`` synthetic documents for LayoutLM: token ids, boxes, attention mask, segment ids.

    Shapes: ``input_ids`` ``[n, seq_len]`` (``[CLS] words... [SEP]``), ``bbox``
    ``[n, seq_len, 4]`` (see :func:`layout_boxes`), ``attention_mask`` and
    ``token_type_ids`` ``[n, seq_len]``. Documents fill the whole sequence, as documents
    truncated to the model's length do.
    """
    if vocab_size <= FIRST_WORD_ID:
        raise ValueError(f"vocab_size must exceed {FIRST_WORD_ID}")
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST_WORD_ID, vocab_size, (n, seq_len), generator=gen, dtype=torch.long)
    ids[:, 0] = CLS_ID
    ids[:, -1] = SEP_ID
    bbox = torch.tensor([layout_boxes(rng, seq_len) for _ in range(n)], dtype=torch.long)
    return {
        "input_ids": ids,
        "bbox": bbox,
        "attention_mask": torch.ones((n, seq_len), dtype=torch.long),
        "token_type_ids": torch.zeros((n, seq_len), dtype=torch.long),
    }


def mlm_batch(
    torch: Any, batch: int, seq_len: int, vocab_size: int, seed: int = 0, mask_prob: float = 0.15
) -> dict[str, Any]:
    """A masked-LM pre-training batch: BERT's masking of ``mask_prob`` of the word pieces.

    Of the chosen positions 80 % become ``[MASK]``, 10 % a random word piece, 10 % stay;
    ``labels`` hold the original id there and -100 (ignored by the loss) elsewhere.
    ``[CLS]`` and ``[SEP]`` are never chosen.
    """
    if vocab_size <= FIRST_WORD_ID:
        raise ValueError(f"vocab_size must exceed {FIRST_WORD_ID}")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST_WORD_ID, vocab_size, (batch, seq_len), generator=gen, dtype=torch.long)
    ids[:, 0] = CLS_ID
    ids[:, -1] = SEP_ID
    chosen = torch.rand((batch, seq_len), generator=gen) < mask_prob
    chosen[:, 0] = False
    chosen[:, -1] = False
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    roll = torch.rand((batch, seq_len), generator=gen)
    masked = ids.clone()
    masked[chosen & (roll < 0.8)] = MASK_ID
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    masked[swap] = torch.randint(FIRST_WORD_ID, vocab_size, (int(swap.sum()),), generator=gen, dtype=torch.long)
    return {
        "input_ids": masked,
        "attention_mask": torch.ones((batch, seq_len), dtype=torch.long),
        "token_type_ids": torch.zeros((batch, seq_len), dtype=torch.long),
        "labels": labels,
    }


# --- timing --------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between order statistics (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def latency_summary(seconds: Sequence[float], scale: float = 1000.0) -> dict[str, float | int]:
    """p50/p90/p99, mean and max of ``seconds`` in milliseconds (``scale``), plus the count."""
    if not seconds:
        return {"count": 0}
    out: dict[str, float | int] = {f"p{q:g}": percentile(seconds, q) * scale for q in PERCENTILES}
    out["mean"] = statistics.fmean(seconds) * scale
    out["max"] = max(seconds) * scale
    out["count"] = len(seconds)
    return out


def is_steady(step_seconds: Sequence[float], window: int = 5, tolerance: float = 0.10) -> bool:
    """True when the last ``window`` step times' median is within ``tolerance`` of the
    ``window`` before: the step time stopped changing (compilation, allocator and cache
    warm-up are over)."""
    if window < 1:
        raise ValueError("window must be >= 1")
    if len(step_seconds) < 2 * window:
        return False
    before = statistics.median(step_seconds[-2 * window : -window])
    last = statistics.median(step_seconds[-window:])
    return before > 0 and abs(last - before) <= tolerance * before


def exit_now(code: int) -> NoReturn:
    """Flush and leave at once: the interpreter's teardown with torch loaded takes seconds
    that are no part of the work, and the job window ends when this process does."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    """An integer launcher variable (RANK, WORLD_SIZE, ...), ``default`` when unset."""
    value = env.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${name}={value!r} is not an integer") from None
