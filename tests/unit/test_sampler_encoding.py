"""The sampler's hand-encoded samples parse to exactly the Sample the generic path builds."""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from sysfs_trees import Iface, Zone, net_tree, powercap_tree

from wattline import wire
from wattline.agent import registry
from wattline.agent.encoding import EncodedSamples, SampleHead, encode_sample, energy_fields, stamp_fields
from wattline.agent.sampler import Sampler
from wattline.agent.spool.disk import DiskSpool
from wattline.agent.spool.format import read_segment
from wattline.agent.spool.memory import MemorySpool
from wattline.segments import segment_numbers

stamps = st.integers(min_value=0, max_value=2**63 - 1)
floats = st.floats(allow_nan=False, width=64)
names = st.text(min_size=0, max_size=40)


@settings(max_examples=300, deadline=None)
@given(
    source=names,
    component=names,
    device=names,
    quality=st.sampled_from([0, 1, 2, 3]),
    start=stamps,
    end=stamps,
    energy=floats,
    power=floats,
    cumulative=floats,
    healthy=st.booleans(),
    status=names,
    utilization=st.none() | floats,
    error=st.none() | floats,
    gauges=st.dictionaries(names, floats, max_size=5),
)
def test_encoded_sample_equals_the_message(
    source: str,
    component: str,
    device: str,
    quality: int,
    start: int,
    end: int,
    energy: float,
    power: float,
    cumulative: float,
    healthy: bool,
    status: str,
    utilization: float | None,
    error: float | None,
    gauges: dict[str, float],
) -> None:
    expected = wire.Sample(
        source=source,
        component=component,
        device=device,
        quality=quality,
        start_ns=start,
        end_ns=end,
        energy_j=energy,
        power_w=power,
        cumulative_j=cumulative,
        healthy=healthy,
        status=status,
        gauges=gauges,
    )
    if utilization is not None:
        expected.utilization = utilization
    if error is not None:
        expected.energy_error_j = error
    head = SampleHead(source, component, device, quality)
    data = encode_sample(
        head,
        stamp_fields(start)[1],
        stamp_fields(end)[0],
        energy_fields(energy, power, cumulative),
        healthy,
        status,
        utilization,
        error,
        gauges,
    )
    (got,) = wire.Batch.FromString(data).samples
    assert got == expected
    assert got.HasField("utilization") == (utilization is not None)
    assert got.HasField("energy_error_j") == (error is not None)


def test_encoded_samples_is_a_sequence_of_samples() -> None:
    samples = [wire.Sample(source="rapl", device=f"package-{i}", end_ns=i, healthy=True) for i in range(3)]
    encoded = EncodedSamples(wire.Batch(samples=samples).SerializeToString(), 3)
    assert len(encoded) == 3 and bool(encoded)
    assert list(encoded) == samples and encoded[1] == samples[1] and encoded[1:] == samples[1:]
    assert not EncodedSamples(b"", 0)


def fixture_tree(root: Path) -> Path:
    powercap_tree(root, [Zone("intel-rapl:0", "package-0", 1_000_000), Zone("intel-rapl:0:0", "core", 500)])
    net_tree(root, [Iface("eth0", pci="0000:00:05.0", stats={"rx_bytes": 10, "tx_bytes": 20})])
    return root


def test_sampler_sinks_see_the_same_samples(tmp_path: Path) -> None:
    """A plain list sink, the memory spool and the disk spool all get equal samples from one sampler."""
    tree = fixture_tree(tmp_path / "tree")
    statuses = registry.discover(["rapl", "nic"], tree, env={})
    sources = [s.source for s in statuses if s.source is not None]
    seen: list[wire.pb.Sample] = []
    memory = MemorySpool(wire.Host(host_id="h"))
    disk = DiskSpool(wire.Host(host_id="h"), tmp_path / "spool")

    def sink(samples: object) -> None:
        assert isinstance(samples, EncodedSamples)
        seen.extend(samples)
        memory.add_samples(samples)
        disk.add_samples(samples)

    sampler = Sampler(sources, sink)
    for _ in range(4):
        sampler.tick()
    assert len(seen) == 3 * 3 and sampler.samples_emitted == 9
    assert {s.device for s in seen} == {"package-0", "package-0/core", "eth0"}
    nic = [s for s in seen if s.component == "nic"]
    assert all(s.gauges["rx_bytes"] == 10.0 and s.quality == wire.QUALITY_MODEL for s in nic)
    assert all(s.healthy and s.end_ns > s.start_ns > 0 and math.isfinite(s.power_w) for s in seen)
    memory.seal()
    batch = memory.peek()
    assert batch is not None and list(batch.samples) == seen and batch.host.host_id == "h" and batch.seq == 1
    disk.close()
    records = [
        r for n in segment_numbers(tmp_path / "spool") for r in read_segment(tmp_path / "spool" / f"seg-{n:016d}.wls")
    ]
    assert [s for r in records for s in r.batch.samples] == seen
    for source in sources:
        source.close()
