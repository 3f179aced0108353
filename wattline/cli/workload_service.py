"""``wattline workload layoutlm-serve`` and ``load``: the study's LayoutLM served over HTTP, and a
stepped open-loop load against a service (what ``wattline run --metrics`` measures)."""

from __future__ import annotations

import json
import sys

import typer

from wattline.cli import panels
from wattline.cli.workload import DEVICE, SEED, positive, require_extra
from wattline.config import ConfigError
from wattline.reference.common import DTYPES, exit_now


def layoutlm_serve(
    size: str = typer.Option(
        "base", "--size", help="base (LayoutLM-base, 512 tokens) or tiny (CI).", rich_help_panel=panels.WORKLOAD
    ),
    device: str = DEVICE,
    dtype: str = typer.Option("fp32", "--dtype", help=f"{' | '.join(DTYPES)}.", rich_help_panel=panels.WORKLOAD),
    threads: int | None = typer.Option(
        None, "--threads", help="torch CPU threads (default: torch's).", rich_help_panel=panels.WORKLOAD
    ),
    seed: int = SEED,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on.", rich_help_panel=panels.WORKLOAD),
    port: int = typer.Option(
        8000,
        "--port",
        help="Port to listen on; 0 takes a free one (the ready line names it).",
        rich_help_panel=panels.WORKLOAD,
    ),
    max_batch: int = typer.Option(
        32, "--max-batch", help="Most documents in one batch (and in one request).", rich_help_panel=panels.WORKLOAD
    ),
    max_wait_ms: float = typer.Option(
        5.0,
        "--max-wait-ms",
        help="Longest a request waits for more to fill its batch, in milliseconds.",
        rich_help_panel=panels.WORKLOAD,
    ),
    linger: float = typer.Option(
        0.0,
        "--linger",
        help="Seconds /metrics stays up after a stop's last answer (for a final scrape).",
        rich_help_panel=panels.WORKLOAD,
    ),
) -> None:
    """LayoutLM inference as an HTTP service that runs until SIGTERM; measured by its own metrics.

    POST /infer (an empty body is one document, {"documents": N} is N), batched across concurrent
    requests; GET /metrics (Prometheus: requests by outcome, documents, latency); GET /health.
    Ready, it prints "listening on http://HOST:PORT". SIGTERM refuses new requests and answers
    those in flight. No job is opened: the service's units are read from its metrics.
    Random weights, no download.
    """
    from wattline.reference.launch import resolve
    from wattline.reference.layoutlm_inference import SIZES

    if size not in SIZES:
        raise ConfigError(f"option --size: {size!r} is not one of {', '.join(sorted(SIZES))}")
    positive(max_batch, "--max-batch")
    if not 0 <= port <= 65535:
        raise ConfigError(f"option --port: {port} is not 0..65535")
    for value, option in ((max_wait_ms, "--max-wait-ms"), (linger, "--linger")):
        if not 0 <= value < float("inf"):
            raise ConfigError(f"option {option}: {value} must be >= 0")
    torch = require_extra()
    labels = resolve(torch, device, dtype, threads)
    from wattline.reference.layoutlm_serve import ServeSettings, serve

    settings = ServeSettings(
        size, labels["device"], dtype, int(labels["threads"]), seed, host, port, max_batch, max_wait_ms, linger
    )
    exit_now(serve(settings))


def load(
    url: str = typer.Option(
        ..., "--url", help='The service\'s inference URL: POST, JSON {"documents": N}.', rich_help_panel=panels.WORKLOAD
    ),
    steps: str = typer.Option(
        ...,
        "--steps",
        help="RATE:DURATION,...: RATE in requests/s (40) or of the capacity (25%).",
        rich_help_panel=panels.WORKLOAD,
    ),
    capacity: float | None = typer.Option(
        None,
        "--capacity",
        help="Requests/s that 100% is (default: measured first, closed loop).",
        rich_help_panel=panels.WORKLOAD,
    ),
    documents: int = typer.Option(1, "--documents", help="Documents per request.", rich_help_panel=panels.WORKLOAD),
    arrivals: str = typer.Option(
        "poisson", "--arrivals", help="poisson (random gaps) or fixed (even gaps).", rich_help_panel=panels.WORKLOAD
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the Poisson arrivals.", rich_help_panel=panels.WORKLOAD),
    workers: int = typer.Option(
        64, "--workers", help="Most requests in flight at once.", rich_help_panel=panels.WORKLOAD
    ),
    max_concurrency: int = typer.Option(
        64, "--max-concurrency", help="Most clients the capacity measurement tries.", rich_help_panel=panels.WORKLOAD
    ),
    capacity_seconds: float = typer.Option(
        2.0, "--capacity-seconds", help="Seconds per capacity measurement level.", rich_help_panel=panels.WORKLOAD
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the windows as JSON.", rich_help_panel=panels.OUTPUT),
) -> None:
    """Open-loop load at stepped rates against an inference service; what each window got.

    Between steps the load waits for every answer, so each window's requests are sent and
    answered inside it. Steps in % are of the capacity: --capacity, else measured with
    closed-loop clients doubling until throughput stops rising.
    """
    from rich.console import Console

    from wattline.reference.stepped_load import ARRIVALS, check_url, parse_steps, run_load

    specs = parse_steps(steps)
    check_url(url)
    if arrivals not in ARRIVALS:
        raise ConfigError(f"option --arrivals: {arrivals!r} is not one of {', '.join(ARRIVALS)}")
    for value, option in (
        (capacity, "--capacity"), (documents, "--documents"), (workers, "--workers"),
        (max_concurrency, "--max-concurrency"), (capacity_seconds, "--capacity-seconds"),
    ):  # fmt: skip
        positive(value, option)
    from wattline.reference.figures import print_load

    result = run_load(
        url, specs, capacity_rps=capacity, documents=documents, arrivals=arrivals, seed=seed, workers=workers,
        max_concurrency=max_concurrency, capacity_seconds=capacity_seconds,
    )  # fmt: skip
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        print_load(result, Console(file=sys.stdout))
    sent = sum(w["sent"] for w in result["windows"])
    if sent and not sum(w["answered"] for w in result["windows"]):
        typer.echo(f"wattline: error: {url} answered none of {sent} requests", err=True)
        raise typer.Exit(1)


def register(group: typer.Typer) -> None:
    """Add ``layoutlm-serve`` and ``load`` to the ``workload`` group."""
    group.command("layoutlm-serve", cls=panels.PanelCommand)(layoutlm_serve)
    group.command("load", cls=panels.PanelCommand)(load)
