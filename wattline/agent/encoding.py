"""Samples encoded once, by the sampler, straight into protobuf wire bytes.

Building a ``wire.Sample``, putting it into a ``Batch`` (a copy) and serializing it in the
disk spool would handle every sample three times, all of it Python work per channel per
tick. The sampler instead writes each sample once, as ``Batch.samples`` entries (field 4)
with precomputed bytes for the parts that never change (source, component, device,
quality, gauge names), and the spools keep those bytes as they are (the disk spool writes
them to its record, the memory spool parses a whole batch once when it seals it).

The bytes are the protobuf encoding of the same message the generic path builds; parsing
them gives an equal ``wire.Sample`` (tests/unit/test_sampler_encoding.py checks every field).
Non-default scalars are written as proto3 does; the three energy figures are written even
when 0.0 (a parser treats an explicit default like an absent one).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import overload

from wattline import wire

#: Tag bytes of the Sample fields the sampler writes per interval (field number << 3 | wire type).
_START = b"\x20"  # 4, varint
_END = b"\x28"  # 5, varint
_HEALTHY = b"\x58\x01"  # 11 = true
_GAUGE = b"\x72"  # 14, length-delimited map entry
_SAMPLE = b"\x22"  # Batch.samples, 4, length-delimited
#: energy_j (6), power_w (7), cumulative_j (8): fixed64 doubles.
ENERGY = struct.Struct("<BdBdBd")
_UTILIZATION = struct.Struct("<Bd")  # 9, optional double
_TAG_ENERGY, _TAG_POWER, _TAG_CUMULATIVE = 0x31, 0x39, 0x41
_TAG_UTILIZATION, _TAG_ERROR = 0x49, 0x69


def varint(value: int) -> bytes:
    """The base-128 varint of a non-negative ``value`` (negative int64: its 10-byte two's complement)."""
    if value < 0:
        value += 1 << 64
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_prefix(n: int) -> bytes:
    """The varint of a length (the common one- and two-byte cases without a loop)."""
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    return varint(n)


def _string(tag: int, text: str) -> bytes:
    raw = text.encode()
    return bytes((tag,)) + length_prefix(len(raw)) + raw


class SampleHead:
    """The constant bytes of one channel's samples, and the layout of its gauges."""

    __slots__ = ("_gauge_keys", "_gauges_layout", "head")

    def __init__(self, source: str, component: str, device: str, quality: wire.pb.Quality) -> None:
        #: Fields 1, 2, 3 and 10, encoded once.
        self.head = wire.Sample(source=source, component=component, device=device, quality=quality).SerializeToString()
        self._gauge_keys: dict[str, bytes] = {}
        #: The last gauge names seen, in order, and how to pack their values at once.
        self._gauges_layout: tuple[tuple[str, ...], struct.Struct, list[bytes | float]] | None = None

    def gauge_key(self, name: str) -> bytes:
        """Map entry key (field 1) plus the value's tag (field 2, double) for gauge ``name``."""
        key = self._gauge_keys.get(name)
        if key is None:
            key = self._gauge_keys[name] = _string(0x0A, name) + b"\x11"
        return key

    def gauges(self, gauges: Mapping[str, float]) -> bytes:
        """Field 14 entries of ``gauges``; one ``struct.pack`` when the names are those of last time."""
        layout = self._gauges_layout
        if layout is None or len(layout[0]) != len(gauges) or tuple(gauges) != layout[0]:
            layout = self._gauges_layout = self._layout(tuple(gauges))
        _names, packer, args = layout
        args[1::2] = gauges.values()
        return packer.pack(*args)

    def _layout(self, names: tuple[str, ...]) -> tuple[tuple[str, ...], struct.Struct, list[bytes | float]]:
        """Each entry is a constant prefix (tag, length, key, value tag) then the 8-byte double."""
        prefixes = []
        for name in names:
            key = self.gauge_key(name)
            prefixes.append(_GAUGE + length_prefix(len(key) + 8) + key)
        packer = struct.Struct("<" + "".join(f"{len(p)}sd" for p in prefixes))
        args: list[bytes | float] = []
        for prefix in prefixes:
            args += [prefix, 0.0]
        return names, packer, args


def encode_sample(
    head: SampleHead,
    start: bytes,
    end: bytes,
    energy: bytes,
    healthy: bool,
    status: str = "",
    utilization: float | None = None,
    energy_error_j: float | None = None,
    gauges: Mapping[str, float] | None = None,
) -> bytes:
    """One ``Batch.samples`` entry. ``start``/``end`` are :func:`stamp_fields` bytes, ``energy`` is ENERGY packed."""
    body = head.head + start + end + energy
    if healthy:
        body += _HEALTHY
    if status:
        body += _string(0x62, status)  # 12, length-delimited
    if utilization is not None:
        body += _UTILIZATION.pack(_TAG_UTILIZATION, utilization)
    if energy_error_j is not None:
        body += _UTILIZATION.pack(_TAG_ERROR, energy_error_j)
    if gauges:
        body += head.gauges(gauges)
    return _SAMPLE + length_prefix(len(body)) + body


def stamp_fields(stamp_ns: int) -> tuple[bytes, bytes]:
    """``end_ns`` (field 5) of the samples whose interval ends at ``stamp_ns``, and ``start_ns`` (field 4) of
    the samples that start there: one varint for both."""
    value = varint(stamp_ns)
    return _END + value, _START + value


def energy_fields(energy_j: float, power_w: float, cumulative_j: float) -> bytes:
    return ENERGY.pack(_TAG_ENERGY, energy_j, _TAG_POWER, power_w, _TAG_CUMULATIVE, cumulative_j)


class EncodedSamples(Sequence[wire.pb.Sample]):
    """One tick's samples as serialized ``Batch.samples`` entries; a sequence of Samples on demand.

    A sink that knows the type (the spools) takes :attr:`data` as it is; any other sink
    iterates it and gets ``wire.Sample`` messages, parsed once on first use.
    """

    __slots__ = ("_decoded", "data", "total")

    def __init__(self, data: bytes, count: int) -> None:
        self.data = data
        self.total = count
        self._decoded: list[wire.pb.Sample] | None = None

    def decoded(self) -> list[wire.pb.Sample]:
        if self._decoded is None:
            self._decoded = list(wire.Batch.FromString(self.data).samples)
        return self._decoded

    def __len__(self) -> int:
        return self.total

    @overload
    def __getitem__(self, index: int) -> wire.pb.Sample: ...

    @overload
    def __getitem__(self, index: slice) -> list[wire.pb.Sample]: ...

    def __getitem__(self, index: int | slice) -> wire.pb.Sample | list[wire.pb.Sample]:
        return self.decoded()[index]

    def __iter__(self) -> Iterator[wire.pb.Sample]:
        return iter(self.decoded())

    def __bool__(self) -> bool:
        return self.total > 0

    def __repr__(self) -> str:
        return f"EncodedSamples({self.total} samples, {len(self.data)} bytes)"


def encode(samples: Sequence[wire.pb.Sample]) -> tuple[bytes, int]:
    """Serialized ``Batch.samples`` entries of any samples (the bytes as they are if already encoded)."""
    if isinstance(samples, EncodedSamples):
        return samples.data, samples.total
    return wire.Batch(samples=samples).SerializeToString(), len(samples)
