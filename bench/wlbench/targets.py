"""The table: each part's figures against their yardsticks and the issue's targets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wlbench.rows import Row, at_least, at_most, fmt_ratio, num, ratio_of
from wlbench.stored_report import rows as stored_report_rows
from wlbench.targets_fleet import fleet_rows, slurm_tracking_rows


def agent_rows(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for rate, d in r["rates"].items():
        hz = f"{rate} Hz"
        a, al, ne, sc = d["rapl+nic"], d["all"], d["node_exporter"], d["scraped"]
        ratios = d["ratios"]
        rows.append(
            Row(
                "agent",
                f"CPU per tick, RAPL+NIC, {hz}",
                num(a["cpu_ms_per_tick"], "ms"),
                f"node_exporter {num(ne['cpu_ms_per_scrape'], 'ms')}/scrape",
                ratios["agent_tick_vs_node_exporter_scrape"],
                "<= 0.25x",
                at_most(ratios["agent_tick_vs_node_exporter_scrape"], 0.25),
            )
        )
        cc = d.get("codecarbon")
        if cc and "error" not in cc:
            rows.append(
                Row(
                    "agent",
                    f"CPU per tick vs CodeCarbon, {hz}",
                    num(a["cpu_ms_per_tick"], "ms"),
                    f"CodeCarbon {num(cc['steady_ms_per_measurement'], 'ms')} steady, "
                    f"{num(cc['whole_run_ms_per_measurement'], 'ms')} whole run",
                    ratios["agent_tick_vs_codecarbon_steady"],
                    "<= 0.1x (steady)",
                    at_most(ratios["agent_tick_vs_codecarbon_steady"], 0.1),
                )
            )
        rows.append(
            Row(
                "agent",
                f"CPU per tick, RAPL+NIC, {hz}, vs plain pread loop",
                num(a["cpu_ms_per_tick"], "ms"),
                f"floor {num(d['floor']['cpu_ms_per_tick'], 'ms')}",
                ratios.get("agent_tick_vs_floor"),
            )
        )
        if "floor+grpc" in d:
            rows.append(
                Row(
                    "agent",
                    f"CPU per tick, RAPL+NIC, {hz}, vs pread loop + empty gRPC call per batch interval",
                    num(a["cpu_ms_per_tick"], "ms"),
                    f"floor+grpc {num(d['floor+grpc']['cpu_ms_per_tick'], 'ms')} "
                    f"({num(ratios.get('floor_grpc_tick_vs_node_exporter_scrape'))}x node_exporter)",
                    ratios.get("agent_tick_vs_floor_grpc"),
                )
            )
        if "batch10" in d:
            b10 = d["batch10"]["cpu_ms_per_tick"]
            rows.append(
                Row(
                    "agent",
                    f"CPU per tick, RAPL+NIC, --batch-interval 10, {hz}",
                    num(b10, "ms"),
                    f"node_exporter {num(ne['cpu_ms_per_scrape'], 'ms')}/scrape",
                    ratio_of(b10, ne["cpu_ms_per_scrape"]),
                    "<= 0.25x",
                    at_most(ratio_of(b10, ne["cpu_ms_per_scrape"]), 0.25),
                )
            )
        rows.append(Row("agent", f"CPU per 1000 samples, RAPL+NIC, {hz}", num(a["cpu_s_per_1000_samples"], "s")))
        rows.append(Row("agent", f"CPU per 1000 samples, all sources, {hz}", num(al["cpu_s_per_1000_samples"], "s")))
        limit = {"10": (0.5, 1.0)}.get(rate)
        rows.append(
            Row(
                "agent",
                f"% of one core, RAPL+NIC, {hz}",
                num(a["core_pct"], "%"),
                target=f"< {limit[0]} %" if limit else "",
                met=at_most(a["core_pct"], limit[0]) if limit else None,
            )
        )
        rows.append(
            Row(
                "agent",
                f"% of one core, all sources, {hz}",
                num(al["core_pct"], "%"),
                target=f"< {limit[1]} %" if limit else "",
                met=at_most(al["core_pct"], limit[1]) if limit else None,
            )
        )
        rows.append(
            Row(
                "agent",
                f"/metrics scrape, gzip, {hz}",
                num(sc["scrape_cpu_ms"], "ms"),
                f"node_exporter {num(ne['cpu_ms_per_scrape'], 'ms')}",
                ratios["wattline_scrape_vs_node_exporter_scrape"],
            )
        )
        lean = d.get("lean", {})
        rows.append(
            Row(
                "agent",
                f"CPU per tick, RAPL+NIC, lean entry, {hz}",
                num(lean.get("cpu_ms_per_tick"), "ms"),
                f"node_exporter {num(ne['cpu_ms_per_scrape'], 'ms')}/scrape",
                ratio_of(lean.get("cpu_ms_per_tick"), ne["cpu_ms_per_scrape"]),
                "<= 0.25x",
                at_most(ratio_of(lean.get("cpu_ms_per_tick"), ne["cpu_ms_per_scrape"]), 0.25),
            )
        )
        peers = f"node_exporter {num(ne['hwm_mib'], 'MiB')}"
        if cc and "hwm_mib" in cc:
            peers += f", CodeCarbon {num(cc['hwm_mib'], 'MiB')}"
        for label, entry in (("wattline agent", a), ("python -m wattline.agent", lean), ("all sources", al)):
            rows.append(
                Row(
                    "agent",
                    f"peak RSS (VmHWM), {label}, {hz}",
                    num(entry.get("hwm_mib"), "MiB"),
                    peers,
                    target="<= 40 MiB",
                    met=at_most(entry.get("hwm_mib"), 40.0),
                )
            )
        if "floor+grpc" in d:  # what any Python agent that pushes over gRPC peaks at
            rows.append(
                Row(
                    "agent",
                    f"peak RSS floor, {hz}: the interpreter alone / a bare gRPC client pushing every batch interval",
                    f"{num(d['floor'].get('hwm_mib'), 'MiB')} / {num(d['floor+grpc'].get('hwm_mib'), 'MiB')}",
                )
            )
    b2b = r.get("back_to_back")
    if b2b:
        rows.append(
            Row(
                "agent",
                "/metrics scrape, gzip, back to back",
                num(b2b["wattline"]["cpu_ms_per_scrape"], "ms"),
                f"node_exporter {num(b2b['node_exporter']['cpu_ms_per_scrape'], 'ms')}",
                b2b["wattline_vs_node_exporter"],
            )
        )
    return rows


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


def pods_rows(r: dict[str, Any]) -> list[Row]:
    """The pod watcher's cost per poll with N unselected pods against none, and per such pod against its floor."""
    none = r["others"]["0"]
    rows = [Row("pods", f"watcher poll, {r['jobs']} pod-jobs, no other pod", num(none["poll_ms"], "ms"))]
    for key, d in r["others"].items():
        if key == "0":
            continue
        rows.append(
            Row(
                "pods",
                f"watcher poll, {r['jobs']} pod-jobs + {key} unselected pods ({d['list_bytes'] >> 10} KiB list)",
                num(d["poll_ms"], "ms"),
                f"no other pod {num(none['poll_ms'], 'ms')}",
                d["ratio_to_none"],
            )
        )
        rows.append(
            Row(
                "pods",
                f"one more unselected pod, of {key}",
                num(d["us_per_other_pod"], "us"),
                f"GET + json.loads of its part of the list + a set lookup {num(d['floor_us_per_other_pod'], 'us')}",
                ratio_of(d["us_per_other_pod"], d["floor_us_per_other_pod"]),
                target="the floor (<= 1.5x)",
                met=at_most(ratio_of(d["us_per_other_pod"], d["floor_us_per_other_pod"]), 1.5),
            )
        )
    return rows


def slurm_rows(r: dict[str, Any]) -> list[Row]:
    """A real srun's round trip with wattline's hooks, against no hooks and hooks that only exit 0."""
    if "skipped" in r:
        return [Row("slurm", "srun round trip with the hooks", f"skipped: {r['skipped']}")]
    ms = num(r["with_hooks_ms"], "ms")
    rows = [
        Row("slurm", f"srun round trip with the hooks (median of {r['repeats']})", ms,
            f"without: {num(r['without_hooks_ms'], 'ms')}; added {num(r['added_ms'], 'ms')}",
            ratio_of(r["with_hooks_ms"], r["without_hooks_ms"])),
        Row("slurm", "srun round trip with the hooks vs hooks that only exit 0", ms,
            f"no-op hooks: {num(r['noop_hooks_ms'], 'ms')}; wattline adds {num(r['added_by_wattline_ms'], 'ms')}",
            ratio_of(r["with_hooks_ms"], r["noop_hooks_ms"])),
    ]  # fmt: skip
    for name, hook_ms in r["hook_ms"].items():
        rows.append(Row("slurm", f"{name} alone (deploy/slurm script)", num(hook_ms, "ms"), target="< 100 ms",
                        met=hook_ms < 100))  # fmt: skip
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
