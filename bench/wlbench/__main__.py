"""``bench/run [--quick] [--only PART,...] [--out FILE] [--keep]``: run the benchmarks, print a table, write JSON.

Parts (all by default, in this order): accuracy, report, ingest, scale, agent, pods, slurm, fleet,
slurm-tracking; stored-report only when named. Each figure is a ratio against a yardstick measured
in the same run, or a count; repeated runs give medians.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wlbench import accuracy, agent, fleet_stores, ingest, pods, report, scale, slurm, slurm_tracking, stored_report
from wlbench.common import BENCH, machine, rounded
from wlbench.rows import Row
from wlbench.targets import rows_for

PARTS: dict[str, Callable[[Path, bool], dict[str, Any]]] = {
    "accuracy": accuracy.run,
    "report": report.run,
    "ingest": ingest.run,
    "scale": scale.run,
    "agent": agent.run,
    "pods": pods.run,
    "slurm": slurm.run,
    "fleet": fleet_stores.run,
    "slurm-tracking": slurm_tracking.run,
    "stored-report": stored_report.run,
}
#: Parts run only when named (``--only``): docs/performance.md's tables show one full run, and
#: this one's figures are in its prose until a full run gives it a region of its own.
OPT_IN = frozenset({"stored-report"})


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke pass: short windows, small sizes (~2 min)")
    ap.add_argument("--only", default="", help=f"comma-separated parts: {','.join(PARTS)}")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "latest.json")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, databases)")
    args = ap.parse_args()
    names = [p for p in args.only.split(",") if p] or [p for p in PARTS if p not in OPT_IN]
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    work = Path(tempfile.mkdtemp(prefix="wattline-bench-"))
    started = time.monotonic()
    doc: dict[str, Any] = {
        "command": " ".join(["bench/run", *sys.argv[1:]]),
        "quick": args.quick,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "parts": {},
        "errors": {},
    }
    try:
        for name in names:
            t0 = time.monotonic()
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            try:
                result = PARTS[name](work / name, args.quick)
            except Exception as exc:  # one broken part must not hide the others' figures
                doc["errors"][name] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
                continue
            result["duration_s"] = time.monotonic() - t0
            doc["parts"][name] = result
            print(f"[bench] {name} done in {result['duration_s']:.0f} s", file=sys.stderr, flush=True)
    finally:
        if args.keep:
            print(f"[bench] work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    rows = rows_for(doc["parts"], args.quick)
    doc["targets"] = [r.as_dict() for r in rows]
    doc["duration_s"] = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rounded(doc), indent=2) + "\n")
    print(render(rows, doc))
    print(f"\nJSON: {args.out}")
    return 1 if doc["errors"] else 0


def render(rows: list[Row], doc: dict[str, Any]) -> str:
    m = doc["machine"]
    head = (
        f"wattline benchmarks ({'quick' if doc['quick'] else 'full'}): {m['cpu']}, {m['cores']} cores, "
        f"{m['memory_gib']} GiB, load {m['loadavg_at_start']:.2f} at start, {doc['duration_s']:.0f} s"
    )
    cols = ["part", "figure", "wattline", "yardstick", "ratio", "target", "met"]
    table = [cols] + [r.cells() for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = [head, ""]
    lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)) + " |")
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in table[1:]:
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    for name, error in doc["errors"].items():
        lines.append(f"ERROR in part {name}: {error}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
