"""The table's rows of the fleet parts: ``fleet`` (VictoriaMetrics beside InfluxDB) and
``slurm-tracking``."""

from __future__ import annotations

from typing import Any

from wlbench.rows import Row, at_least, at_most, num, ratio_of

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
