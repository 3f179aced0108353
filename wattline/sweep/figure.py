"""The sweep's Pareto figure (energy per unit against throughput, matplotlib through
:mod:`wattline.reports.output.plot`) and its self-contained page (the figure inline as SVG)."""

from __future__ import annotations

import csv
import io
from html import escape
from typing import Any

from wattline import __version__
from wattline.reports.output.plot import pyplot
from wattline.reports.output.quantities import si
from wattline.sweep.output import csv_text, verdict_text


def _label(params: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def plot_sweep(data: dict[str, Any]) -> Any:
    """Each point: mean energy per unit against mean throughput, its error bars the bound and
    the range of its runs (vertical) and the range of its throughput (horizontal); the Pareto
    front joined and labelled, the lowest-energy setting ringed."""
    plt = pyplot()
    unit = data["unit"]
    one = unit.rstrip("s") or "unit"
    fig, ax = plt.subplots(figsize=(8.0, 5.2), dpi=110)
    pts = [p for p in data["points"] if p["j_per_unit"] and p["throughput_per_s"]]
    for p in pts:
        e, t = p["j_per_unit"], p["throughput_per_s"]
        bound = e["mean"] * (e["bound_rel"] or 0.0)
        low, high = e["mean"] - min(e["runs"]) + bound, max(e["runs"]) - e["mean"] + bound
        color = "tab:blue" if p["pareto"] else "tab:gray"
        ax.errorbar(
            t["mean"], e["mean"],
            yerr=[[low], [high]], xerr=[[t["mean"] - min(t["runs"])], [max(t["runs"]) - t["mean"]]],
            fmt="o", color=color, ecolor=color, capsize=3, markersize=6 if p["pareto"] else 4,
        )  # fmt: skip
        latency = "" if not p["latency_s"] else f", {1000 * p['latency_s']['mean']:.3g} ms"
        ax.annotate(
            _label(p["params"]) + latency, (t["mean"], e["mean"]), textcoords="offset points", xytext=(6, 5),
            fontsize=8, color="black" if p["pareto"] else "dimgray",
        )  # fmt: skip
    front = sorted((p for p in pts if p["pareto"]), key=lambda p: p["throughput_per_s"]["mean"])
    if len(front) > 1:
        ax.plot(
            [p["throughput_per_s"]["mean"] for p in front], [p["j_per_unit"]["mean"] for p in front],
            "-", color="tab:blue", alpha=0.6, label="Pareto front",
        )  # fmt: skip
    if pts:
        best = pts[0]
        ax.plot(
            best["throughput_per_s"]["mean"], best["j_per_unit"]["mean"], "o", markersize=16,
            markerfacecolor="none", markeredgecolor="tab:green", markeredgewidth=2,
            label=f"lowest energy per {one}: {_label(best['params'])}",
        )  # fmt: skip
    ax.set_xlabel(f"throughput ({unit}/s)")
    ax.set_ylabel(f"energy per {one} (J)")
    if pts:  # room for the labels right of the points and the legend above them
        ax.set_xlim(0, 1.22 * max(max(p["throughput_per_s"]["runs"]) for p in pts))
        top = max(max(p["j_per_unit"]["runs"]) * (1 + (p["j_per_unit"]["bound_rel"] or 0)) for p in pts)
        ax.set_ylim(0, 1.25 * top)
    ax.grid(alpha=0.3)
    ax.set_title(
        f"sweep {data['sweep']}: energy per {one} against throughput ({data['repeat']} runs each)", fontsize=10
    )
    if pts:
        ax.legend(fontsize=8, loc="upper left")
    with_latency = bool(pts) and all(p["latency_s"] for p in pts)
    fig.text(
        0.01, 0.01,
        "error bars: the measurement bound and the range of the runs; blue: the Pareto front\n(no setting is both "
        f"lower in energy and higher in throughput{' and lower in latency: ms, median' if with_latency else ''})",
        fontsize=7, color="dimgray",
    )  # fmt: skip
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def sweep_page(data: dict[str, Any], svg: str) -> str:
    """One self-contained page: the figure, the choices, the table (as the CSV has it)."""
    rows = list(csv.reader(io.StringIO(csv_text(data))))
    head, body = rows[0], rows[1:]
    table = ["<table><tr>", *(f"<th>{escape(h)}</th>" for h in head), "</tr>"]
    for row in body:
        table += ["<tr>", *(f"<td>{escape(c)}</td>" for c in row), "</tr>"]
    table.append("</table>")
    choices = "".join(
        f"<li>lowest {escape(c['figure'])}: <b>{escape(_label(c['params']))}</b> "
        f"({escape(verdict_text(c['advantage']) or 'the only setting with figures')})</li>"
        for c in data["choices"]
    )
    sla = data["sla_units_per_hour"]
    sla_line = "" if sla is None else f"<p>SLA: {escape(si(sla, '').strip())} {escape(data['unit'])}/h</p>"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>wattline sweep {escape(data['sweep'])}</title>"
        "<style>body{font-family:sans-serif;margin:2em} table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px} svg{max-width:100%;height:auto}</style></head><body>"
        f"<h1>sweep {escape(data['sweep'])}</h1>{sla_line}<ul>{choices}</ul><figure>{svg}</figure>{''.join(table)}"
        f"<p>wattline {escape(__version__)}; schema {escape(data['schema'])}</p></body></html>\n"
    )
