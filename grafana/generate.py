"""Write the Prometheus (PromQL) flavour of wattline's dashboards from the InfluxQL ones.

    python grafana/generate.py            # writes grafana/dashboards-prometheus/*.json
    python grafana/generate.py --check    # exit 1 if those files differ from what it would write

grafana/dashboards/*.json (InfluxQL) stay the source of layout, titles, descriptions, units
and links; this script copies each and swaps the data source, every panel target, variable
query and annotation for its twin in grafana/promql/ (a module per dashboard), so the two
flavours cannot drift apart: a panel without a twin there, or a twin without its panel, stops it.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

from promql import fleet, host, jobs, services
from promql.twins import PROMETHEUS, Twins

HERE = Path(__file__).resolve().parent
SOURCE_DIR = HERE / "dashboards"
OUT_DIR = HERE / "dashboards-prometheus"
INFLUX = {"type": "influxdb", "uid": "wattline-influxdb"}
TAG = "wattline-prometheus"
#: Each dashboard's twins, in the order the files are written.
TWINS: dict[str, Twins] = {"fleet": fleet.TWINS, "host": host.TWINS, "jobs": jobs.TWINS, "services": services.TWINS}


class Mismatch(ValueError):
    """The InfluxQL dashboards and their twins in grafana/promql/ disagree."""


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard.get("panels", []):
        out += [panel, *panel.get("panels", [])]
    return out


def swap_datasources(node: Any) -> Any:
    if isinstance(node, dict):
        if node == INFLUX:
            return dict(PROMETHEUS)
        return {k: swap_datasources(v) for k, v in node.items()}
    if isinstance(node, list):
        return [swap_datasources(v) for v in node]
    return node


def influx_step(kept: list[dict[str, Any]], marker: str) -> dict[str, Any]:
    """The InfluxQL panel's transformation ``<influx:ID>`` (the only one of that id) or ``<influx:last>``."""
    wanted = marker.removeprefix("<influx:").removesuffix(">")
    if wanted == "last":
        return kept[-1]
    (step,) = [s for s in kept if s["id"] == wanted]
    return step


def panel_twin(name: str, panel: dict[str, Any]) -> None:
    targets = TWINS[name].panels.get(panel["title"])
    if targets is None:
        raise Mismatch(f"{name}: panel {panel['title']!r} has no PromQL twin")
    panel["targets"] = [t.json() for t in targets]
    extra = TWINS[name].tables.get(panel["title"], {})
    if "transformations" in extra:
        kept = panel.get("transformations", [])
        panel["transformations"] = [influx_step(kept, s) if isinstance(s, str) else s for s in extra["transformations"]]
    for field in extra.get("hidden", []):
        hide = {"matcher": {"id": "byName", "options": field}, "properties": [{"id": "custom.hidden", "value": True}]}
        panel["fieldConfig"]["overrides"].append(hide)
    if "links" in extra:
        text = json.dumps(panel["fieldConfig"])
        for old, new in extra["links"].items():
            if old not in text:
                raise Mismatch(f"{name}: panel {panel['title']!r} has no link with {old!r}")
            text = text.replace(old, new)
        panel["fieldConfig"] = json.loads(text)
    if "description_note" in extra:
        panel["description"] += extra["description_note"]


def variable_twin(name: str, variables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    twins = TWINS[name].variables
    if [v["name"] for v in variables] != list(twins):
        raise Mismatch(f"{name}: variables {[v['name'] for v in variables]} but twins for {list(twins)}")
    out = []
    for variable in variables:
        query = twins[variable["name"]]
        if query is not None:
            refid = "PrometheusVariableQueryEditor-VariableQuery"
            out.append({**variable, "query": {"qryType": 5, "query": query, "refId": refid}})
    return out


def annotation_twin(name: str, annotation: dict[str, Any]) -> dict[str, Any]:
    if annotation["datasource"] != PROMETHEUS:
        return annotation
    twin = TWINS[name].annotations.get(annotation["name"])
    if twin is None:
        raise Mismatch(f"{name}: annotation {annotation['name']!r} has no PromQL twin")
    # limit, matchAny, tags, type: Grafana's annotation target (its schema requires them).
    kept = {k: annotation["target"][k] for k in ("limit", "matchAny", "tags", "type")}
    target = {**kept, "refId": "Anno", "expr": twin["expr"], "interval": "1m"}
    shown = {k: v for k, v in twin.items() if k != "expr"}
    return {**annotation, "target": target, **shown, "useValueForTime": True}


def prometheus_flavour(name: str, source: dict[str, Any]) -> dict[str, Any]:
    """The PromQL twin of the InfluxQL dashboard ``source`` (named ``name``)."""
    # Links and uids: /d/wattline-jobs/wattline-jobs -> /d/wattline-prom-jobs/wattline-prom-jobs.
    text = re.sub(r"/d/wattline-(\w+)/wattline-(\w+)", r"/d/wattline-prom-\1/wattline-prom-\2", json.dumps(source))
    dashboard = swap_datasources(json.loads(text))
    dashboard["uid"] = f"wattline-prom-{name}"
    dashboard["title"] += " (Prometheus)"
    dashboard["description"] += " PromQL flavour, for Prometheus, Mimir, Thanos and VictoriaMetrics."
    dashboard["tags"] = [TAG]
    for link in dashboard.get("links", []):
        if link["type"] == "dashboards":
            link["tags"] = [TAG]
    titles = [p["title"] for p in all_panels(dashboard)]
    for panel in all_panels(dashboard):
        panel_twin(name, panel)
    unused = set(TWINS[name].panels) - set(titles)
    if unused:
        raise Mismatch(f"{name}: PromQL twins of no panel: {sorted(unused)}")
    dashboard["templating"]["list"] = variable_twin(name, dashboard["templating"]["list"])
    dashboard["annotations"]["list"] = [annotation_twin(name, a) for a in dashboard["annotations"]["list"]]
    return dashboard


def render(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2) + "\n"


def generated() -> dict[Path, str]:
    out = {}
    for name in TWINS:
        source = json.loads((SOURCE_DIR / f"{name}.json").read_text())
        out[OUT_DIR / f"{name}.json"] = render(prometheus_flavour(name, copy.deepcopy(source)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the files on disk are not what would be written"
    )
    args = parser.parse_args(argv)
    try:
        files = generated()
    except (OSError, ValueError) as exc:  # Mismatch too
        print(f"grafana/generate.py: {exc}", file=sys.stderr)
        return 1
    stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(HERE.parent)} is out of date: run python grafana/generate.py", file=sys.stderr)
        return 1 if stale else 0
    OUT_DIR.mkdir(exist_ok=True)
    for path in stale:
        path.write_text(files[path])
        print(f"wrote {path.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
