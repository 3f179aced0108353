"""The table: each part's figures against their yardsticks and the issue's targets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Row:
    part: str
    figure: str
    value: str
    yardstick: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None

    def cells(self) -> list[str]:
        met = "" if self.met is None else ("yes" if self.met else "NO")
        return [self.part, self.figure, self.value, self.yardstick, fmt_ratio(self.ratio), self.target, met]

    def as_dict(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "figure": self.figure,
            "value": self.value,
            "yardstick": self.yardstick,
            "ratio": self.ratio,
            "target": self.target,
            "met": self.met,
        }


def fmt_ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}x"


def num(value: float | None, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}g}{(' ' + unit) if unit else ''}"


def at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def at_least(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


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


STORE_NAMES = {"victoriametrics": "VictoriaMetrics", "influxdb1": "InfluxDB 1.x"}


def fleet_stores(r: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """(name, figures, whether InfluxDB's figures are its yardstick) of each store the run has."""
    return [(STORE_NAMES[k], r[k], k != "influxdb1") for k in STORE_NAMES if k in r]


def fleet_rows(r: dict[str, Any]) -> list[Row]:
    """VictoriaMetrics beside InfluxDB (its yardstick), same run: 1,000 agents, then the reports."""
    return fleet_ingest_rows(r["ingest"]) + fleet_report_rows(r["report"])


def fleet_ingest_rows(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    base = r.get("influxdb1", {})
    for name, d, yard in fleet_stores(r):
        size = f"{r['agents']} agents at 1 Hz -> {name}"
        vis = d["searchable"]
        rows += [
            Row("fleet", f"{size}: samples/s stored", num(d["stored_per_s"], "/s"),
                f"sent {num(d['sent_per_s'], '/s')}", ratio_of(d["stored_per_s"], d["sent_per_s"]), "keeps up (1x)",
                at_least(ratio_of(d["stored_per_s"], d["sent_per_s"]), 0.98)),
            Row("fleet", f"{size}: lost (sent - still in agents - held by the database)",
                f"{d['lost_in_database']} (held {d['in_database']:,} of {d['sent'] - d['unacked_at_end']:,})",
                f"pushes refused and retried: {d['failed_pushes']} {dict(d['failed_by_code']) or ''}",
                target="0", met=d["lost_in_database"] == 0 and d["unacked_at_end"] == 0),
            Row("fleet", f"{size}: sample -> write acknowledged, p50 / p99, whole run (every series new at start)",
                f"{num(d['delay_p50_s'], 's')} / {num(d['delay_p99_s'], 's')}",
                f"InfluxDB p99 {num(base.get('delay_p99_s'), 's')}" if yard and base else "",
                ratio_of(d["delay_p99_s"], base.get("delay_p99_s")) if yard else None,
                "p99 < 2 s", at_most(d["delay_p99_s"], 2.0)),
            Row("fleet", f"{size}: same, samples from {r.get('steady_after_s', 15):g} s on",
                f"{num(d['steady_delay_p50_s'], 's')} / {num(d['steady_delay_p99_s'], 's')}",
                f"InfluxDB p99 {num(base.get('steady_delay_p99_s'), 's')}" if yard and base else "",
                ratio_of(d["steady_delay_p99_s"], base.get("steady_delay_p99_s")) if yard else None,
                "p99 < 2 s", at_most(d["steady_delay_p99_s"], 2.0)),
            Row("fleet", f"{size}: sample -> first returned by a query, p50 / p99, second half of the run",
                f"{num(vis['p50_s'], 's')} / {num(vis['p99_s'], 's')}",
                f"{vis['hosts']} hosts polled every {vis['every_s']:g} s; seen {vis['seen']:,} of ~{vis['expected']:,}",
                target="p99 < 2 s", met=at_most(vis["p99_s"], 2.0)),
            Row("fleet", f"{name}: a new series' sample, write acknowledged -> first returned by a query",
                num(d["new_series_searchable_s"], "s"), "median of 3, polled every 0.05 s"),
            Row("fleet", f"{size}: CPU per sample stored, database server (steady) / collector (whole run)",
                f"{num(d['server_us_per_sample'], 'us')} / {num(d['collector_us_per_sample'], 'us')}",
                f"InfluxDB {num(base.get('server_us_per_sample'), 'us')} / "
                f"{num(base.get('collector_us_per_sample'), 'us')}" if yard and base else "",
                ratio_of(d["server_us_per_sample"], base.get("server_us_per_sample")) if yard else None),
            Row("fleet", f"{size}: peak RSS, database server / collector",
                f"{num(d['server_hwm_mib'], 'MiB')} / {num(d['collector_hwm_mib'], 'MiB')}",
                f"InfluxDB {num(base.get('server_hwm_mib'), 'MiB')}" if yard and base else ""),
        ]  # fmt: skip
    return rows


def fleet_report_rows(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    lengths = r["lengths_s"]
    longest = max(lengths, key=lengths.__getitem__)
    shortest = min(lengths, key=lengths.__getitem__)
    base = r.get("influxdb1", {})
    for name, d, yard in fleet_stores(r):
        what = f"{r['hosts']}-host report, units every 60 s, {name}"
        right = d["right"]
        for key, label in (("build_report_s", "build_report (warm median)"), ("cli_s", "wattline report --json")):
            t, t_short = d[key][longest], d[key][shortest]
            yardstick = [f"InfluxDB {num(base[key][longest], 's')}"] if yard and base else []
            if key == "cli_s":
                yardstick.append(f"start-up alone (--help) {num(d['cli_startup_s'], 's')}")
            vs = ratio_of(t, base[key][longest]) if yard and base else None
            rows.append(Row("fleet", f"{what}: {label}, {longest} job" + ("" if right else " (WRONG figures)"),
                            num(t, "s"), ", ".join(yardstick), vs, "< 1 s", right and at_most(t, 1.0)))  # fmt: skip
            rows.append(Row("fleet", f"{what}: {label}, {longest} / {shortest} job", num(t / t_short, "x"),
                            f"{shortest} job {num(t_short, 's')}", target="<= 1.5x",
                            met=right and at_most(t / t_short, 1.5)))  # fmt: skip
        worst = max(e["worst"] for e in (*d["error"].values(), *d["cli_error"].values()))
        rows.append(Row("fleet", f"{what}: energy and units against the truth, worst", f"{worst:.2g} relative",
                        f"cold call {num(d['cold_s'][longest], 's')}", target="<= 1e-9", met=right))  # fmt: skip
    return rows


def slurm_tracking_rows(r: dict[str, Any]) -> list[Row]:
    """The agent tracking 64 Slurm jobs against the agent alone, same run."""
    cpu, ratios = r["cpu_s_per_s"], r["ratio_to_alone"]
    alone = f"the agent alone {num(cpu['alone'] * 100, '%')}"
    grows = r.get("outbox_growth_per_min", {})
    rows = [
        Row("slurm-tracking", f"agent CPU at 1 Hz, {r['jobs']} open jobs, events files quiet",
            num(cpu["64 jobs"] * 100, "% of a core"), alone, ratios["64 jobs"]),
        Row("slurm-tracking", f"same, each job writing a units line every {r['line_every_s']} s",
            num(cpu["64 jobs, lines"] * 100, "% of a core"), alone, ratios["64 jobs, lines"]),
    ]  # fmt: skip
    long_enough = r["window_s"] >= 60  # a shorter window still sees the opens' first delivery
    for kind in ("64 jobs", "64 jobs, lines"):
        rows.append(Row("slurm-tracking", f"event directories left waiting in the outbox, {kind}",
                        f"{num(grows.get(kind), '/min')} more" + ("" if long_enough else " (window too short to tell)"),
                        f"alone {num(grows.get('alone'), '/min')}", target="keeps up (about 0)",
                        met=at_most(grows.get(kind), 5.0) if long_enough else None))  # fmt: skip
    w, u = r["watcher_pass"], r["use_delivery"]
    rows.append(Row("slurm-tracking", f"one watcher pass (2 a second), {r['jobs']} jobs", num(w["64 jobs_ms"], "ms"),
                    f"no job {num(w['none_ms'], 'ms')}; per job {num(w['per_job_us'], 'us')}"))  # fmt: skip
    per_s = (u["to_outbox_ms"] + u["delivered_ms"]) / 5.0
    rows.append(Row("slurm-tracking", f"a use period's USE events of {r['jobs']} jobs (one outbox directory "
                    "every 5 s) + its delivery",
                    f"{num(u['to_outbox_ms'], 'ms')} + {num(u['delivered_ms'], 'ms')} CPU",
                    f"{num(per_s / 10, '% of a core')}; delivery "
                    f"{num(u.get('delivered_wall_ms'), 'ms')} wall a directory, one at a time "
                    f"({num(r.get('use_delivery_busy', {}).get('delivered_wall_ms'), 'ms')} "
                    "with the agents' collector busy)"))  # fmt: skip
    return rows


def ratio_of(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


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
}


def rows_for(parts: dict[str, dict[str, Any]], quick: bool) -> list[Row]:
    rows: list[Row] = []
    for name, result in parts.items():
        rows += _ROWS[name](result)
    return rows
