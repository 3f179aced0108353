"""A job's report as one self-contained HTML page: the figure inline (SVG), the report's
tables, coverage, notes and provenance. Nothing is fetched: no script, font, style sheet
or image outside the file; the page is the one a team attaches to a model card.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from html import escape
from typing import Any

from wattline import __version__
from wattline.reports.model import Report
from wattline.reports.output.quantities import si
from wattline.reports.output.render import TextTable, component_table, report_table
from wattline.reports.report_json import report_json
from wattline.reports.timeline import Series

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:2em auto;max-width:1040px;
color:#222;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0} td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums} th{background:#f3f3f3}
.estimate{color:#8a4b00;font-weight:600} .warn{color:#b00000;font-weight:600} .muted{color:#666}
figure{margin:1em 0} figure svg{max-width:100%;height:auto}
"""


def _num(x: Any, fmt: str = ",.2f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _table(head: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    out = ["<table><tr>", *(f"<th>{escape(h)}</th>" for h in head), "</tr>"]
    for row in rows:
        out.append("<tr>")
        for cell in row:
            text = str(cell)
            numeric = bool(text) and (text[0].isdigit() or text[:1] in "-+") and not text.startswith("--")
            out.append(f'<td class="n">{escape(text)}</td>' if numeric else f"<td>{escape(text)}</td>")
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


def _titled(table: TextTable) -> list[str]:
    title, head, rows = table
    return [f"<h2>{escape(title)}</h2>", _table(head, rows)]


def report_page(report: Report, figure_svg: str | None, series: list[Series]) -> str:
    """The page of one report: the same tables as ``wattline report`` (figures formatted and
    labelled alike), ``figure_svg`` the inline figure (None: no figure), ``series`` the
    sampled series."""
    data = report_json(report)
    job, m, w, sat = data["job"], data["saturated"], data["warmup"], data["saturation"]
    title = f"wattline report: {job['name']} ({job['id']})"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(job['name'])} <span class='muted'>({escape(job['id'])}, {escape(job['kind'])})</span></h1>",
        f"<p>{len(job['hosts'])} host(s): {escape(', '.join(job['hosts']))}. "
        f"{escape(job['start'])} to {escape(job['end'])}, status {escape(job['status'])}"
        + (f", exit status {job['exit_code']}" if job["exit_code"] is not None else "")
        + ".</p>",
    ]
    if sat["saturated"]:
        parts.append(
            f"<p>Saturated at {escape(sat['at'])} ({escape(sat['method'])}): the warm-up "
            f"({data['durations_s']['warmup']:.1f} s) is excluded from the figures below.</p>"
        )
    else:
        parts.append(f"<p class='warn'>NOT SATURATED ({escape(sat['reason'])}): whole-run figures.</p>")
    if not data["complete"]:
        parts.append("<p class='warn'>INCOMPLETE: samples are missing (see the notes).</p>")
    if figure_svg:
        parts.append(
            "<figure>"
            + figure_svg
            + "<figcaption class='muted'>Power over time, stacked by component; hatched = model estimate; "
            "grey = warm-up; dashed line = saturation point; black line = throughput.</figcaption></figure>"
        )
    fractions = m["coverage"]["fractions"]
    parts += [
        *_titled(report_table(report)),
        *_titled(component_table(report)),
        "<h2>Energy by host</h2>",
        _table(
            ("host", "saturated window", "warm-up"),
            _host_rows(m, w),
        ),
        "<h2>Coverage</h2>",
        "<p>"
        + escape(", ".join(f"{q} {v:.0%}" for q, v in fractions.items()) or "no energy data")
        + (
            f"; <span class='warn'>not measured: {escape(', '.join(m['coverage']['missing']))}</span>"
            if m["coverage"]["missing"]
            else ""
        )
        + (
            "; <span class='estimate'>energy from a power model is an estimate, not a measurement</span>"
            if fractions.get("model")
            else ""
        )
        + "</p>",
        "<h2>Notes</h2>",
        "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in data["notes"]) + "</ul>" if data["notes"] else "<p>none</p>",
        "<h2>Provenance</h2>",
        _table(("setting", "value"), _provenance_rows(data)),
        _table(("host", "source", "component", "device", "quality"), series),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _host_rows(m: dict[str, Any], w: dict[str, Any]) -> list[tuple[str, str, str]]:
    meas = {h["host"]: h["energy_j"] for h in m["by_host"]}
    warm = {h["host"]: h["energy_j"] for h in w["by_host"]}
    return [(h, si(meas.get(h, 0.0), "J"), si(warm.get(h, 0.0), "J")) for h in sorted(set(meas) | set(warm))]


def _provenance_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    policy, job, sat = data["policy"], data["job"], data["saturation"]
    labels = ", ".join(f"{k}={v}" for k, v in sorted(job["labels"].items()))
    devices = "; ".join(f"{h}: {', '.join(d) or 'whole host'}" for h, d in job["devices"].items())
    return [
        ("wattline version", __version__),
        ("generated", dt.datetime.now(dt.UTC).isoformat(timespec="seconds")),
        ("report schema", data["schema"]),
        ("saturation", f"{sat['method']}: {sat['reason']}"),
        ("idle policy", policy["idle"]),
        ("share rule", policy["share_rule"]),
        ("price", f"{_num(policy['price_usd_per_instance_hour'], ',.4g')} USD per instance-hour"),
        ("carbon intensity", f"{_num(policy['carbon_intensity_g_per_kwh'], ',.4g')} gCO2/kWh"),
        ("PUE", f"{policy['pue']:g}"),
        ("devices", devices),
        ("labels", labels or "none"),
    ]
