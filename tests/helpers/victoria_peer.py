"""The real ``victoria-metrics`` (single node) as the tests and the benchmarks run it: its
command line. Free of pytest: bench/wlbench imports it too (tests/ is on its path)."""

from __future__ import annotations

from pathlib import Path


def victoria_argv(binary: str, data: Path, port: int) -> list[str]:
    """``binary`` keeping its data in ``data``, answering HTTP on ``port`` (loopback only), with
    the flags wattline's store needs (README "Storage schema")."""
    return [
        binary,
        f"-storageDataPath={data}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=100y",  # the test data's fixed times (2026-05-28) stay in retention
        "-dedup.minScrapeInterval=1ms",  # a resent point replaces the first copy, as in InfluxDB
        "-search.latencyOffset=0s",
        "-search.disableCache",  # a repeated read is answered from the data, never a cached answer
        "-loggerLevel=WARN",
    ]


def victoria_default_argv(binary: str, data: Path, port: int) -> list[str]:
    """``binary`` as an operator starts it: its data in ``data``, HTTP on ``port`` (loopback),
    every other flag at its default (``-search.latencyOffset=30s``, the search caches on, one
    month's retention)."""
    return [binary, f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}"]
