"""The encoder's fused per-sample path writes exactly what the general path writes, or refuses alike.

The general path is ``LineEncoder.line`` over ``sample_fields``; both come from the one field
table (``SAMPLE_FIELDS``). The fused path is taken once a series and its field keys are cached,
so every batch is encoded twice by the same encoder and once by a fresh one.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from wattline import wire
from wattline.stores.lineprotocol import LineEncoder, LineProtocolError, _sample_line, describe
from wattline.stores.pointfields import sample_fields
from wattline.stores.schema import ENERGY, SAMPLE_FIELDS, host_tags, sample_tags

FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e308, 1.7976931348623157e308])
NAMES = st.sampled_from(["rx_bytes", "power_limit_w", "status", "host", "healthy", "a b", "x,y=z", "é", "\\bad", ""])
TEXT = st.text(st.sampled_from(["a", " ", ",", "=", '"', "\\", "\n", "é"]), max_size=5)


@st.composite
def samples(draw: st.DrawFn) -> wire.pb.Sample:
    start = draw(st.integers(0, 2**62))
    sample = wire.Sample(
        source=draw(st.sampled_from(["rapl", "nvml", "nic"])),
        component="gpu",
        device=draw(st.sampled_from(["GPU-0", "eth 0", "dev,1"])),
        start_ns=start,
        end_ns=start + draw(st.integers(1, 10**12)),
        energy_j=draw(FLOATS),
        power_w=draw(FLOATS),
        cumulative_j=draw(FLOATS),
        quality=draw(st.sampled_from([0, 1, 2, 3])),
        healthy=draw(st.booleans()),
        status=draw(TEXT),
    )
    if draw(st.booleans()):
        sample.utilization = draw(FLOATS)
    if draw(st.booleans()):
        sample.energy_error_j = draw(FLOATS)
    for name, value in draw(st.dictionaries(NAMES, FLOATS, max_size=3)).items():
        sample.gauges[name] = value
    return sample


def general(batch: wire.pb.Batch) -> tuple[list[str], list[str]]:
    """Every sample through LineEncoder.line over sample_fields (no fused path)."""
    encoder, lines, rejected = LineEncoder(), [], []
    host = host_tags(batch)
    for s in batch.samples:
        try:
            lines.append(encoder.line(ENERGY, {**host, **sample_tags(s)}, sample_fields(s, batch.stream_id), s.end_ns))
        except LineProtocolError as exc:
            rejected.append(f"{ENERGY} {describe(host, sample_tags(s))} at {s.end_ns}: {exc}")
    return lines, rejected


@settings(max_examples=300, deadline=None)
@given(st.lists(samples(), min_size=1, max_size=6), st.sampled_from(["stream-a", 'q"uote\\d']))
def test_fused_path_equals_the_general_path(items: list[wire.pb.Sample], stream: str) -> None:
    batch = wire.Batch(stream_id=stream, seq=1)
    batch.host.host_id = "node-1"
    batch.host.labels["cluster"] = "c 1"
    batch.samples.extend(items)
    expected = general(batch)
    encoder = LineEncoder()
    for _ in range(2):  # the second time with every cache warm: the fused path
        encoded = encoder.batch(batch)
        assert (encoded.lines, encoded.rejected) == expected


def test_fused_path_is_taken_and_defers_only_when_unsure() -> None:
    sample = wire.Sample(source="rapl", component="dram", device="d", start_ns=1, end_ns=2, energy_j=0.5)
    sample.gauges["rx_bytes"] = 3.0
    assert _sample_line(sample, "p ", "s", {}) is None  # a gauge key not checked yet
    line = _sample_line(sample, "p ", "s", {"rx_bytes": "rx_bytes="})
    fixed = "energy_j=0.5,power_w=0.0,cumulative_j=0.0,interval_s=1e-09,start_ns=1i,healthy=false"
    assert line == f'p {fixed},stream="s",rx_bytes=3.0 2'
    sample.power_w = math.inf
    assert _sample_line(sample, "p ", "s", {"rx_bytes": "rx_bytes="}) is None


def test_the_field_table_is_the_schema() -> None:
    names = [f.name for f in SAMPLE_FIELDS]
    sample = wire.Sample(end_ns=5, status="x", utilization=0.5, energy_error_j=0.1)
    assert list(sample_fields(sample, "s")) == names
    assert list(sample_fields(wire.Sample(end_ns=5), "s")) == [f.name for f in SAMPLE_FIELDS if not f.when]
