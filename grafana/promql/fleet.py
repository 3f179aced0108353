"""The Fleet dashboard's PromQL twins."""

from __future__ import annotations

from promql.pieces import ADDING_COMPONENTS, CHANNEL, FLEET, QUALITY_CHANNEL, RANGE, energy, newest, unhealthy
from promql.twins import Twins, event_annotation, instant, power_by, wh

PANELS = {
    "Power now": instant(f"sum({newest('energy_power_w', FLEET, CHANNEL)})"),
    "Energy over the range": instant(wh(energy(FLEET))),
    "Hosts reporting": instant(f'count(count by (host) (count_over_time(energy_power_w{{host=~"$host"}}{RANGE})))'),
    "Unhealthy channel-intervals": instant(unhealthy(('host=~"$host"',))),
    "Power by host": power_by(FLEET, QUALITY_CHANNEL, "host"),
    "Power by component": power_by(FLEET, QUALITY_CHANNEL, "component"),
    "Energy by host": instant(wh(energy(FLEET, ("host",))), "{{host}}"),
    "Energy by component": instant(wh(energy(FLEET, ("component",))), "{{component}}"),
    "Measured vs estimated energy": instant(wh(energy(FLEET, ("quality",))), "{{quality}}"),
    "Power by quality (measured vs estimated)": power_by(FLEET, QUALITY_CHANNEL, "quality"),
}

TWINS = Twins(
    PANELS,
    {"host": "label_values(energy_power_w, host)", "component": ADDING_COMPONENTS},
    {"Job open / close": event_annotation(('event=~"open|close"', 'host=~"$host"'), "event")},
)
