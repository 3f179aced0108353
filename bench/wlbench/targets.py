"""The table: each part's figures against their yardsticks and the issue's targets; here the
rows of the collector and store parts (``ingest``, ``scale``, ``report``, ``accuracy``), the
node's in :mod:`wlbench.targets_node`, the fleet's in :mod:`wlbench.targets_fleet`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wlbench.rows import Row, at_least, at_most, fmt_ratio, num, ratio_of
from wlbench.stored_report import rows as stored_report_rows
from wlbench.targets_fleet import fleet_rows, slurm_tracking_rows
from wlbench.targets_node import agent_rows, pods_rows, slurm_rows


def ingest_rows(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    inf: dict[str, Any] = r.get("influx") or {}
    for n in (1, 2):
        if f"ratio_{n}" not in inf:
            continue
        rows.append(
            Row(
                "ingest",
                f"agents -> gRPC -> collector ({n} process{'es' if n > 1 else ''}) -> influxd",
                num(inf[f"grpc_{n}_points_per_s"], "points/s"),
                f"direct /write {num(inf['ceiling_points_per_s'], 'points/s')}; "
                f"CPU floor on {inf['cores']} cores {fmt_ratio(inf[f'floor_{n}'])}",
                inf[f"ratio_{n}"],
                ">= 0.9x",
                at_least(inf[f"ratio_{n}"], 0.9),
            )
        )
        cpu = inf.get("cpu_us_per_point", {}).get(f"grpc_{n}")
        if cpu:  # the parties' CPU per point: what the CPU floor above is made of
            rows.append(
                Row(
                    "ingest",
                    f"CPU per point, {n} process{'es' if n > 1 else ''}: influxd / collector / pusher",
                    " / ".join(num(cpu.get(k), "us") for k in ("influxd", "collector", "pusher")),
                    f"direct /write: influxd {num(inf['cpu_us_per_point'].get('ceiling', {}).get('influxd'), 'us')}",
                )
            )
    steps = inf.get("steps_us_per_point")
    if steps:
        rows.append(
            Row(
                "ingest",
                "the collector's steps per point, bare loops",
                f"LineEncoder {num(steps.get('encode'), 'us')}, validation {num(steps.get('validate'), 'us')}, "
                f"protobuf decode {num(steps.get('decode'), 'us')}, request body {num(steps.get('body'), 'us')}",
            )
        )
    null = r.get("null_sink")
    if null:
        rows.append(
            Row(
                "ingest",
                "decode + encode via gRPC, per core",
                num(null["points_per_cpu_s"], "points/s"),
                f"repr() floor {num(null.get('repr_floor_per_s'), '/s')}",
                null.get("vs_repr_floor"),
                ">= 400k/s",
                at_least(null["points_per_cpu_s"], 400_000),
            )
        )
    enc = r.get("encoder")
    if enc:
        rows.append(
            Row(
                "ingest",
                "LineEncoder.batch, in process",
                num(enc["samples_per_s"], "samples/s"),
                f"before this change {num(enc.get('baseline_samples_per_s'), '/s')}"
                if enc.get("baseline_samples_per_s")
                else "",
                enc.get("vs_baseline"),
            )
        )
    sq = r.get("sqlite")
    variants = [("", "SQLite store rows/s", "bare executemany")]
    if sq and sq.get("grouped_ratio") is not None:
        what = f"SQLite store rows/s, group commits of {sq['group_size']} batches"
        variants.append(("grouped_", what, "bare executemany, same commits"))
    for prefix, what, yardstick in variants if sq else []:
        rows.append(
            Row(
                "ingest",
                what,
                num(sq[f"{prefix}store_rows_per_s"], "rows/s"),
                f"{yardstick} {num(sq[f'{prefix}bare_rows_per_s'], 'rows/s')}",
                sq[f"{prefix}ratio"],
                ">= 0.7x",
                at_least(sq[f"{prefix}ratio"], 0.7),
            )
        )
    rl = r.get("replay_log")
    if rl:
        rows.append(
            Row(
                "ingest",
                f"VictoriaMetrics group commits ({rl['group_batches']} batches) through the replay log",
                num(rl["with_points_per_s"], "points/s"),
                f"without it {num(rl['without_points_per_s'], 'points/s')}; CPU per point "
                f"{num(rl['with_cpu_us_per_point'], 'us')} vs {num(rl['without_cpu_us_per_point'], 'us')}",
                rl["ratio"],
                ">= 0.9x",
                at_least(rl["ratio"], 0.9),
            )
        )
    return rows


def scale_rows(r: dict[str, Any]) -> list[Row]:
    tx = r.get("sqlite_tx_per_s")
    rows: list[Row] = []
    for size, d in r["sizes"].items():
        yard = f"sent {num(d['sent_per_s'], '/s')}"
        if r.get("push_every_s"):
            yard += f", one push per {r['push_every_s']:g} s"
        if d["store"] == "sqlite" and tx:
            yard += f"; SQLite alone: {num(tx, 'batches/s')}"
        rows.append(
            Row(
                "scale",
                f"{size} agents at 1 Hz: samples/s stored",
                num(d["stored_per_s"], "/s"),
                yard,
                ratio_of(d["stored_per_s"], d["sent_per_s"]),
                "keeps up (1x)",
                at_least(ratio_of(d["stored_per_s"], d["sent_per_s"]), 0.98),
            )
        )
        rows.append(Row("scale", f"{size}: samples lost", str(d["lost"]), target="0", met=d["lost"] == 0))
        rows.append(
            Row(
                "scale",
                f"{size}: samples not yet delivered 60 s after the run",
                str(d["unacked_at_end"]),
                "still in the agents' spools, retried",
                target="0",
                met=d["unacked_at_end"] == 0,
            )
        )
        rows.append(
            Row(
                "scale",
                f"{size}: sample -> stored, p50 / p99",
                f"{num(d['delay_p50_s'], 's')} / {num(d['delay_p99_s'], 's')}",
                target="p99 < 2 s",
                met=at_most(d["delay_p99_s"], 2.0),
            )
        )
        rows.append(
            Row(
                "scale",
                f"{size}: collector peak RSS, CPU, CPU per push",
                f"{num(d['collector_hwm_mib'], 'MiB')}, {num(d['collector_core_pct'], '% core')}, "
                f"{num(d.get('collector_cpu_ms_per_push'), 'ms')}",
                f"simulated agents {num(d['simulator_core_pct'], '% core')} (same 2 cores)",
            )
        )
    return rows


def report_rows(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for store, d in r["stores"].items():
        for variant, by_length in d["latency_s"].items():
            for length, t in by_length.items():
                rows.append(
                    Row(
                        "report",
                        f"build_report, {store}, {length} job, {r['hosts']} hosts, {variant}",
                        num(t, "s"),
                        target="< 1 s",
                        met=at_most(t, 1.0),
                    )
                )
            flat = d["flatness"].get(variant)
            rows.append(
                Row(
                    "report",
                    f"{store}, {variant}: longest / shortest job",
                    num(flat, "x"),
                    target="flat (<= 1.5x)",
                    met=at_most(flat, 1.5),
                )
            )
        for length in r["lengths_s"]:
            floor = d["detail"].get(length, {}).get("units_floor_s")
            if floor:
                rows.append(
                    Row(
                        "report",
                        f"{store}, {length} job: UNITS read at {floor['cuts']:.0f} cuts, ms",
                        num(floor["store_units_read_s"] * 1e3, "ms"),
                        f"influxd alone: rows {num(floor['influxd_rows_s'] * 1e3, 'ms')}, 1 function "
                        f"{num(floor['influxd_one_function_s'] * 1e3, 'ms')}, 5 functions "
                        f"{num(floor['influxd_exact_functions_s'] * 1e3, 'ms')}, a statement per cut "
                        f"{num(floor['influxd_statement_per_cut_s'] * 1e3, 'ms')}",
                    )
                )
    return rows


def accuracy_rows(r: dict[str, Any]) -> list[Row]:
    rows = [
        Row(
            "accuracy",
            f"window energy error ({store}), worst of {r['cases']} cases",
            f"{num(err * 100, '%')}",
            target="<= 0.1 %",
            met=at_most(err, 0.001),
        )
        for store, err in r["worst_error"].items()
    ]
    ne = r.get("node_exporter")
    if ne:
        rows.append(
            Row(
                "accuracy",
                "RAPL joules vs node_exporter, by zone path",
                f"worst {num(ne['worst_rel_diff'] * 100, '%')} over {ne['zones']} zones",
                target="agree",
                met=ne["worst_rel_diff"] < 1e-6,
            )
        )
        if ne.get("wrap"):
            w = ne["wrap"]
            rows.append(
                Row(
                    "accuracy",
                    "across a counter wrap",
                    f"wattline {num(w['wattline_j'], 'J')}",
                    f"node_exporter raw delta {num(w['node_exporter_delta_j'], 'J')}; truth {num(w['truth_j'], 'J')}",
                    ratio_of(w["wattline_j"], w["truth_j"]),
                )
            )
    return rows


_ROWS: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "accuracy": accuracy_rows,
    "report": report_rows,
    "ingest": ingest_rows,
    "scale": scale_rows,
    "agent": agent_rows,
    "pods": pods_rows,
    "slurm": slurm_rows,
    "fleet": fleet_rows,
    "slurm-tracking": slurm_tracking_rows,
    "stored-report": stored_report_rows,
}


def rows_for(parts: dict[str, dict[str, Any]], quick: bool) -> list[Row]:
    rows: list[Row] = []
    for name, result in parts.items():
        rows += _ROWS[name](result)
    return rows
