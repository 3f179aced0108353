"""Point fields compiled from the schema's field table (:data:`.stores.schema.SAMPLE_FIELDS`).

:func:`sample_fields` (a sample's field dict: SQLite, the line encoder's general path) and the
line encoder's fused per-sample path are both generated from that one table by
:func:`compile_function`, so they cannot disagree with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wattline import wire
from wattline.stores.schema import NOT_GAUGES, SAMPLE_FIELDS


def compile_function(name: str, lines: list[str], namespace: dict[str, Any]) -> Callable[..., Any]:
    """Compile the function ``name`` from source ``lines`` (generated from :data:`SAMPLE_FIELDS`).

    The source stays readable as the function's ``__source__`` attribute.
    """
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<wattline generated {name}>", "exec"), namespace)
    function: Callable[..., Any] = namespace[name]
    function.__source__ = source  # type: ignore[attr-defined]
    return function


def _compile_fixed_fields() -> Callable[[wire.pb.Sample, str], dict[str, float | int | str | bool]]:
    required = ", ".join(f"{f.name!r}: {f.value}" for f in SAMPLE_FIELDS if not f.when)
    lines = ["def fixed_fields(s, stream):", f"    fields = {{{required}}}"]
    for f in SAMPLE_FIELDS:
        if f.when:
            lines += [f"    if {f.when}:", f"        fields[{f.name!r}] = {f.value}"]
    lines.append("    return fields")
    return compile_function("fixed_fields", lines, {})


_fixed_fields = _compile_fixed_fields()


def sample_fields(sample: wire.pb.Sample, stream_id: str) -> dict[str, float | int | str | bool]:
    """Field values of a sample's point. ``gauges`` become fields of their own name."""
    fields = _fixed_fields(sample, stream_id)
    gauges = sample.gauges
    if gauges:
        for name in gauges:  # (a upb map's items() is a Python-level generator)
            if name not in NOT_GAUGES:
                fields[name] = gauges[name]
    return fields
