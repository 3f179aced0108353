"""Writes the tables of docs/performance.md from ``bench/results/latest.json``, the run of
``bench/run`` kept in git, so no figure of the page is a hand copy.

Each part's rows (the table ``bench/run`` prints) go between ``<!-- bench:PART -->`` and
``<!-- /bench:PART -->`` in that part's section, the run (command, date, machine) between
``<!-- bench:run -->`` and ``<!-- /bench:run -->``; the prose around them is hand-written.
``python docs/gen_perf.py`` rewrites the regions; ``--check`` exits 1 when they are stale;
as an MkDocs hook (``mkdocs.yml``: ``hooks``) it stops ``mkdocs build`` on a stale page.
A quick run, a run with errors, one that lacks a part the page has a region for or has a
part the page has no region for is refused with one line (exit 2): the page shows one full run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as a script or loaded from its path (a test): its neighbour pagegen
    sys.path.insert(0, str(HERE))
from pagegen import Generated, Unusable  # noqa: E402

ROOT = HERE.parent
PAGE = HERE / "performance.md"
RESULTS = ROOT / "bench" / "results" / "latest.json"
COMMAND = "python docs/gen_perf.py"
#: The region that says which run the tables are; every other region is a part of it.
RUN = "run"
#: The table's columns: (heading, index in Row.cells()); figure and value always shown.
COLUMNS = [("figure", 1), ("wattline", 2), ("yardstick, same run", 3), ("ratio", 4), ("target", 5), ("met", 6)]

#: What bench/run writes that the page shows.
FIELDS = {"command", "quick", "started", "machine", "parts", "errors", "targets", "duration_s"}

_BEGIN = re.compile(r"<!-- bench:([\w-]+) -->")


def _row_cells(row: dict[str, Any]) -> list[str]:
    """A row's cells exactly as ``bench/run`` prints them (its own Row, ratios included)."""
    bench = str(ROOT / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    from wlbench.rows import Row

    return Row(**row).cells()


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(rows: list[dict[str, Any]]) -> str:
    """One part's rows as a markdown table, without the columns no row fills."""
    cells = [_row_cells(r) for r in rows]
    cols = [(h, i) for h, i in COLUMNS if i <= 2 or any(c[i] for c in cells)]
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(c[i]) for _, i in cols) + " |" for c in cells]
    return "\n".join(lines)


def _when(doc: dict[str, Any]) -> str:
    started = datetime.datetime.fromisoformat(doc["started"]).astimezone(datetime.UTC)
    return started.strftime("%Y-%m-%d %H:%M UTC")


def run_line(doc: dict[str, Any]) -> str:
    """Which run the tables are: the command, when, how long, on what."""
    m = doc["machine"]
    return (
        f"**The run:** `{doc['command']}`, started {_when(doc)}, took {doc['duration_s'] / 60:.0f} min, on "
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}, Python {m['python']}, "
        f"load {m['loadavg_at_start']:.2f} at start (`bench/results/latest.json`; the tables below are "
        "written from it by `docs/gen_perf.py`)."
    )


def _took(seconds: float | None) -> str:
    if not seconds:
        return ""
    return f" ({seconds:.0f} s)" if seconds < 120 else f" ({seconds / 60:.1f} min)"


def part_block(doc: dict[str, Any], part: str) -> str:
    note = f"*`bench/run` of {_when(doc)}, part `{part}`{_took(doc['parts'][part].get('duration_s'))}.*"
    return note + "\n\n" + table([r for r in doc["targets"] if r["part"] == part])


def load(path: Path) -> dict[str, Any]:
    """The run, refused (:class:`Unusable`) unless it is one full run without errors."""
    absolute = path.resolve()
    name = str(absolute.relative_to(ROOT) if absolute.is_relative_to(ROOT) else path)
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except OSError as exc:
        raise Unusable(f"cannot read {name} ({exc.strerror}): run bench/run") from None
    except ValueError as exc:
        raise Unusable(f"{name} is not JSON ({exc})") from None
    missing = FIELDS - (doc.keys() if isinstance(doc, dict) else set())
    if missing:
        raise Unusable(f"{name} is not bench/run's JSON: it has no {', '.join(sorted(missing))}")
    if doc["quick"]:
        raise Unusable(f"{name} is a --quick run ({doc['command']}); the page shows a full run: bench/run")
    if doc["errors"]:
        raise Unusable(f"{name} has errors in part(s) {', '.join(doc['errors'])}: fix them and rerun bench/run")
    return doc


def fill(text: str, doc: dict[str, Any]) -> str:
    """``text`` with every ``bench:`` region written from the run."""
    names = _BEGIN.findall(text)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise Unusable(f"the page has more than one <!-- bench:NAME --> region for {', '.join(twice)}")
    missing = [n for n in names if n != RUN and n not in doc["parts"]]
    if missing:
        raise Unusable(f"the run lacks part(s) {', '.join(missing)} that the page shows: run the full bench/run")
    unshown = [p for p in doc["parts"] if p not in names]
    if unshown:
        raise Unusable(f"no <!-- bench:PART --> region for part(s) {', '.join(unshown)} of the run")
    for name in names:
        try:
            body = run_line(doc) if name == RUN else part_block(doc, name)
        except (KeyError, TypeError, ValueError) as exc:
            raise Unusable(f"the run's {name!r} is not as bench/run writes it ({type(exc).__name__}: {exc})") from None
        region = re.search(rf"<!-- bench:{re.escape(name)} -->\n(.*?)<!-- /bench:{re.escape(name)} -->", text, re.S)
        if not region:
            raise Unusable(f"<!-- bench:{name} --> has no <!-- /bench:{name} --> after it")
        text = text[: region.start(1)] + body + "\n" + text[region.end(1) :]
    return text


def generated(page: Path | None = None, results: Path | None = None) -> Generated:
    """The page and the run it is written from (by default the repository's)."""
    run = results or RESULTS

    def render(current: str) -> str:
        return fill(current, load(run))

    return Generated(page or PAGE, COMMAND, render)


def on_pre_build(config: Any) -> None:
    """MkDocs hook: a stale page, or a run the page cannot show, stops the build."""
    generated().on_pre_build(config)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python docs/gen_perf.py", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the page is stale, change nothing")
    ap.add_argument("--page", type=Path, help="the page (default docs/performance.md)")
    ap.add_argument("--results", type=Path, help="the run (default bench/results/latest.json)")
    args = ap.parse_args(argv[1:])
    gen = generated(args.page, args.results)
    return gen.check() if args.check else gen.write()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
