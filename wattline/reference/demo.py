"""A small real CPU workload that counts its units: tokenize and hash synthetic documents.

It behaves like a service warming up: the first seconds build a vocabulary cache (slow,
like a model compiling), then it processes documents at the machine's steady rate. Run it
under ``wattline run`` (it joins the job through the environment) or alone (it then opens
its own embedded job)::

    wattline run --job demo --kind inference --units documents -- python -m wattline.reference.demo
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time

from wattline.jobs.wrappers.job import Job

WORDS = [f"w{i:04d}" for i in range(4096)]


def make_document(rng: random.Random, length: int = 512) -> str:
    """A synthetic document of ``length`` tokens."""
    return " ".join(rng.choice(WORDS) for _ in range(length))


def process(document: str, vocab: dict[str, int]) -> str:
    """Tokenize against the vocabulary and hash the ids (the unit of work)."""
    ids = [vocab.get(token, 0) for token in document.split()]
    digest = hashlib.sha256(bytes(i % 256 for i in ids))
    for _ in range(8):
        digest = hashlib.sha256(digest.digest() * 64)
    return digest.hexdigest()


def warm_up(seconds: float) -> dict[str, int]:
    """Build the vocabulary slowly, as a model would compile: little throughput meanwhile."""
    vocab: dict[str, int] = {}
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        vocab[WORDS[i % len(WORDS)]] = i
        i += 1
        time.sleep(0.001)
    vocab.update({w: n for n, w in enumerate(WORDS)})
    return vocab


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of steady processing")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds of warm-up before full speed")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    documents = [make_document(rng) for _ in range(64)]
    with Job("demo", kind="inference", units="documents") as job:
        vocab = warm_up(args.warmup)
        end = time.monotonic() + args.duration
        done = 0
        while time.monotonic() < end:
            process(documents[done % len(documents)], vocab)
            done += 1
            job.add_units(1)
    print(f"processed {done} documents (job {job.job_id})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
