"""The wire contract's generated types, re-exported under short names.

Everything that speaks the protocol imports from here, never from the generated
modules directly, so a regeneration touches one import site.
"""

from __future__ import annotations

from typing import Any

from wattline.v1 import telemetry_pb2 as pb
from wattline.v1 import telemetry_pb2_grpc as pb_grpc

Ack = pb.Ack
Batch = pb.Batch
Host = pb.Host
JobEvent = pb.JobEvent
Sample = pb.Sample

QUALITY_COUNTER = pb.QUALITY_COUNTER
QUALITY_INTEGRATED = pb.QUALITY_INTEGRATED
QUALITY_MODEL = pb.QUALITY_MODEL

#: The names used in storage, reports and Prometheus labels for each quality.
QUALITY_NAMES: dict[int, str] = {
    pb.QUALITY_UNSPECIFIED: "unspecified",
    pb.QUALITY_COUNTER: "counter",
    pb.QUALITY_INTEGRATED: "integrated",
    pb.QUALITY_MODEL: "model",
}
QUALITY_BY_NAME: dict[str, int] = {v: k for k, v in QUALITY_NAMES.items()}

#: gRPC service name, for the health service and logs.
SERVICE_NAME = "wattline.v1.Telemetry"

__all__ = [
    "QUALITY_BY_NAME",
    "QUALITY_COUNTER",
    "QUALITY_INTEGRATED",
    "QUALITY_MODEL",
    "QUALITY_NAMES",
    "SERVICE_NAME",
    "Ack",
    "Batch",
    "Host",
    "JobEvent",
    "Sample",
    "pb",
    "pb_grpc",
]


def telemetry_stub(channel: object) -> Any:
    """A client stub of the Telemetry service on ``channel`` (the generated code is untyped)."""
    return pb_grpc.TelemetryStub(channel)  # type: ignore[no-untyped-call]


def add_telemetry_servicer(servicer: object, server: object) -> None:
    """Register ``servicer`` (with a ``Push`` method) on a grpc server."""
    pb_grpc.add_TelemetryServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
