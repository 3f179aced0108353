"""The table's rows of the parts measured on a node: ``agent`` (a tick's cost against
node_exporter and CodeCarbon), ``pods`` (the pod watcher's poll) and ``slurm`` (srun's round trip
with the hooks)."""

from __future__ import annotations

from typing import Any

from wlbench.rows import Row, at_most, num, ratio_of


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
        for (label, data), most in zip((("RAPL+NIC", a), ("all sources", al)), limit or (None, None), strict=True):
            rows.append(
                Row(
                    "agent",
                    f"% of one core, {label}, {hz}",
                    num(data["core_pct"], "%"),
                    target=f"< {most} %" if most is not None else "",
                    met=at_most(data["core_pct"], most) if most is not None else None,
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
