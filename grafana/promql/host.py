"""The Host dashboard's PromQL twins."""

from __future__ import annotations

from promql.pieces import HOST, NOT_SUBZONES, RANGE, STEP, by, energy, last_failure, mean, newest, sel, unhealthy
from promql.twins import Twins, event_annotation, instant, series, table, value_names, wh

HOST_ADDING = (*HOST, NOT_SUBZONES)
HOST_CHANNEL = ("source", "component", "device")
TABLE_CHANNEL = ("component", "device", "source", "quality")
PANELS = {
    "Host power now": instant(f"sum({newest('energy_power_w', HOST_ADDING, HOST_CHANNEL)})"),
    "Host energy over the range": instant(wh(energy(HOST_ADDING))),
    "Estimated (model) energy": instant(wh(energy((*HOST_ADDING, 'quality="model"')))),
    "Unhealthy intervals": instant(unhealthy(HOST)),
    "Power by component and device": series(
        mean("energy_power_w", HOST, STEP, ("component", "device", "source"), ("component", "device", "source")),
        "{{component}} {{device}} ({{source}})",
    ),
    "Utilization": series(
        mean("energy_utilization", HOST, STEP, ("component", "device"), ("component", "device")),
        "{{component}} {{device}}",
    ),
    "Device memory used": series(
        mean("energy_memory_used_bytes", HOST, STEP, ("component", "device"), ("component", "device")),
        "{{component}} {{device}}",
    ),
    "Energy by component and device": table(
        energy(HOST, TABLE_CHANNEL),
        mean("energy_power_w", HOST, RANGE, TABLE_CHANNEL, TABLE_CHANNEL),
        f"max by ({by(TABLE_CHANNEL)}) (max_over_time({sel('energy_power_w', *HOST)}{RANGE}))",
    ),
    "Source health": series(
        f"max by ({by(HOST_CHANNEL)}) (1 - min_over_time({sel('energy_healthy', *HOST)}{STEP}))",
        "{{source}} {{component}} {{device}}",
    ),
    "Failures: count and last status": table(
        f"1000 * ({last_failure(HOST, HOST_CHANNEL)})",
        f"{unhealthy(HOST, HOST_CHANNEL)} > 0",
    ),
}

TABLES = {
    "Energy by component and device": {
        "transformations": [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True},
                    "renameByName": value_names(["Energy", "Mean power", "Peak power"]),
                    "indexByName": {
                        **{name: i for i, name in enumerate(TABLE_CHANNEL)},
                        **{f"Value #{ref}": 4 + i for i, ref in enumerate("ABC")},
                    },
                },
            },
        ]
    },
    "Failures: count and last status": {
        "description_note": " The Prometheus data model keeps no status text (a string field): the table shows "
        "when each channel last failed (the end of the step that holds it) and how often, not why.",
        "transformations": [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True},
                    "renameByName": value_names(["Last failure", "Failed intervals"]),
                    "indexByName": {"source": 0, "component": 1, "device": 2, "Value #B": 3, "Value #A": 4},
                },
            },
        ],
    },
}

TWINS = Twins(
    PANELS,
    {
        "host": "label_values(energy_power_w, host)",
        "component": 'label_values(energy_power_w{host="$host"}, component)',
    },
    {"Job open / close": event_annotation(('event=~"open|close"', 'host="$host"'), "event")},
    TABLES,
)
