"""The ``wattline jobs`` table: whole ids at any terminal width."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table

from wattline.jobs.jobs_view import status_text, utc_iso
from wattline.reports.output import quantities as q
from wattline.reports.output.labels import NO_SAMPLES, tagged

JOB_COLUMNS = ("id", "name", "status", "start (UTC)", "duration", "hosts", "units")
ENERGY_COLUMNS = ("energy (whole run)", "J/unit (saturated)")


def _job_cells(row: dict[str, Any], energy: bool, errors: bool) -> list[str]:
    """One ``wattline jobs`` row as text, in the order of JOB_COLUMNS (+ ENERGY_COLUMNS, error)."""
    status = status_text(
        row["status"], row["exit_code"], row["last_heard_ns"], row.get("end_reason", ""), row.get("end_state", "")
    )
    if row.get("status_note"):  # running as the store shows it some seconds ago
        status += f" ({row['status_note']})"
    if row.get("missing_events"):  # its window starts at what is stored: the report's notes say where
        lost = row["missing_events"]
        status += ", open not stored" + (f" on {', '.join(sorted(lost))}" if len(row["hosts"]) > 1 else "")
    if row.get("saturated") is False:
        status += ", not saturated"
    cells = [
        row["id"],
        row["name"],
        status,
        utc_iso(row["start_ns"])[:19].replace("T", " "),
        q.duration(row["duration_s"]),
        str(len(row["hosts"])),
        q.count(row["units"], row["unit"]),
    ]
    if energy and row.get("energy_data") is False:
        cells += [NO_SAMPLES, NO_SAMPLES]
    elif energy:
        fraction = row.get("estimate_fraction") or 0.0
        cells += [
            tagged(q.si(row.get("total_energy_j"), "J"), fraction),
            tagged(q.si(row.get("j_per_unit"), "J"), fraction),
        ]
        if row.get("complete") is False and row["status"] != "running":  # a running job's lack is its status
            cells[-2] += ", incomplete"  # samples the store does not show yet: the report's notes say which
    if errors:
        cells.append(row.get("error", ""))
    return cells


#: Columns of ``wattline jobs`` whose text may wrap; every other cell is shown whole.
WRAPPED = frozenset({"name", "status", "start (UTC)", "error"})
#: Width a table of N columns adds to its cells (padding, borders).
TABLE_OVERHEAD = (3, 2)  # per column, once


def _job_widths(columns: tuple[str, ...], cells: list[list[str]], width: int) -> list[int] | None:
    """Column widths that fit ``width`` with every cell whole, except those of WRAPPED columns,
    which wrap at spaces (never inside a word) and get what room is left; None when that
    does not fit (headers wrap too)."""

    def longest_word(texts: list[str]) -> int:
        return max((len(w) for t in texts for w in t.split()), default=1)

    natural, least = [], []
    for i, col in enumerate(columns):
        texts = [r[i] for r in cells]
        whole = max([len(t) for t in texts] + [longest_word([col])])
        natural.append(whole)
        least.append(max(longest_word(texts), longest_word([col])) if col in WRAPPED else whole)
    room = width - TABLE_OVERHEAD[0] * len(columns) - TABLE_OVERHEAD[1] - sum(least)
    if room < 0:
        return None
    widths = list(least)
    for col in sorted(WRAPPED & set(columns), key=("start (UTC)", "name", "status", "error").index):
        i = columns.index(col)
        if col in WRAPPED:
            extra = min(natural[i] - least[i], room)
            widths[i] += extra
            room -= extra
    return widths


def print_jobs(rows: list[dict[str, Any]], console: Console, energy: bool) -> None:
    """The ``wattline jobs`` table, with whole ids at any width: where the table does not fit
    the terminal, each job is a block instead (its id on a line of its own, the other
    columns wrapped below it). Only the figures computed are shown."""
    errors = any("error" in row for row in rows)
    columns = JOB_COLUMNS + (ENERGY_COLUMNS if energy else ()) + (("error",) if errors else ())
    cells = [_job_cells(row, energy, errors) for row in rows]
    widths = _job_widths(columns, cells, console.width)
    if widths is not None:
        table = Table(title="wattline jobs", box=box.SIMPLE_HEAD, padding=(0, 1))
        for col, width in zip(columns, widths, strict=True):
            right = col in ("duration", "hosts", "units", *ENERGY_COLUMNS)
            table.add_column(col, justify="right" if right else "left", width=width, no_wrap=col == "id")
        for row_cells in cells:
            table.add_row(*(escape(c) for c in row_cells))
        console.print(table)
        return
    console.print("wattline jobs", style="bold")
    for row_cells in cells:
        console.print(escape(row_cells[0]), soft_wrap=True, style="bold")
        details = "; ".join(f"{name}: {c}" for name, c in zip(columns[1:], row_cells[1:], strict=True) if c)
        console.print(Padding(escape(details), (0, 0, 0, 2)))
