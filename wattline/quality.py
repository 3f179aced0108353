"""How an energy figure was obtained: the one vocabulary of data quality."""

from __future__ import annotations

import enum

from wattline.v1 import telemetry_pb2 as pb


class Quality(enum.StrEnum):
    """Provenance of an energy value; reports never present MODEL as measured."""

    COUNTER = "counter"  #: hardware energy counter (RAPL, NVML total energy)
    INTEGRATED = "integrated"  #: measured power integrated over time
    MODEL = "model"  #: model estimate (TDP x utilization, J/byte, % of max power)

    @property
    def wire(self) -> pb.Quality:
        """The ``wattline.v1.Quality`` enum value."""
        return _TO_WIRE[self]

    @classmethod
    def from_wire(cls, value: int) -> Quality:
        """Inverse of :attr:`wire`; raises ValueError for unknown values."""
        try:
            return _FROM_WIRE[value]
        except KeyError:
            raise ValueError(f"unknown quality value {value}") from None

    @property
    def measured(self) -> bool:
        """True for measurements (counter, integrated), False for estimates."""
        return self is not Quality.MODEL


_TO_WIRE: dict[Quality, pb.Quality] = {
    Quality.COUNTER: pb.QUALITY_COUNTER,
    Quality.INTEGRATED: pb.QUALITY_INTEGRATED,
    Quality.MODEL: pb.QUALITY_MODEL,
}
_FROM_WIRE: dict[int, Quality] = {int(v): k for k, v in _TO_WIRE.items()}
