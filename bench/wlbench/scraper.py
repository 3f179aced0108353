"""Scrapes Prometheus endpoints at a fixed rate (or back to back), as Prometheus does.

Usage: ``python -m wlbench.scraper --rate HZ --duration S --out FILE URL...`` (``--rate 0``:
back to back, ``--count N`` scrapes per URL). One thread per URL, one kept-alive
HTTP/1.1 connection each, ``Accept-Encoding: gzip`` (the body is read, not parsed). FILE gets
JSON: per URL, the monotonic completion time of every scrape, so the caller counts the
scrapes inside its own CPU window; and this process's own CPU seconds.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import threading
import time
import urllib.parse
from pathlib import Path


def scrape_loop(url: str, rate: float, until: float, count: int, out: list[float], errors: list[str]) -> None:
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    conn = http.client.HTTPConnection(host, parts.port, timeout=10)
    headers = {"Accept-Encoding": "gzip", "Accept": "text/plain;version=0.0.4"}
    period = 1.0 / rate if rate > 0 else 0.0
    next_at = time.monotonic()
    while time.monotonic() < until and (count <= 0 or len(out) < count):
        try:
            conn.request("GET", parts.path or "/metrics", headers=headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                errors.append(f"{url}: HTTP {resp.status}")
        except (OSError, http.client.HTTPException) as exc:
            errors.append(f"{url}: {exc}")
            conn.close()
            conn = http.client.HTTPConnection(host, parts.port, timeout=10)
        out.append(time.monotonic())
        if period:
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("urls", nargs="+")
    args = ap.parse_args()
    until = time.monotonic() + args.duration
    done: dict[str, list[float]] = {u: [] for u in args.urls}
    errors: list[str] = []
    threads = [
        threading.Thread(target=scrape_loop, args=(u, args.rate, until, args.count, done[u], errors), daemon=True)
        for u in args.urls
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    times = os.times()
    args.out.write_text(json.dumps({"done": done, "errors": errors[:20], "cpu_s": times.user + times.system}))


if __name__ == "__main__":
    main()
