"""The wire contract's generated types, re-exported under short names.

Everything that speaks the protocol imports from here, never from the generated
modules directly, so a regeneration touches one import site.
"""

from __future__ import annotations

import os
from typing import Any

from wattline.quality import Quality
from wattline.v1 import telemetry_pb2 as pb

Ack = pb.Ack
Batch = pb.Batch
Host = pb.Host
JobEvent = pb.JobEvent
Sample = pb.Sample

QUALITY_COUNTER = pb.QUALITY_COUNTER
QUALITY_INTEGRATED = pb.QUALITY_INTEGRATED
QUALITY_MODEL = pb.QUALITY_MODEL

#: The names used in storage, reports and Prometheus labels for each quality (:class:`Quality`'s,
#: and "unspecified" for a sample that did not say).
QUALITY_NAMES: dict[int, str] = {pb.QUALITY_UNSPECIFIED: "unspecified", **{int(q.wire): q.value for q in Quality}}
QUALITY_BY_NAME: dict[str, int] = {v: k for k, v in QUALITY_NAMES.items()}

#: gRPC service name, for the health service and logs.
SERVICE_NAME = "wattline.v1.Telemetry"

#: Seconds between two KIND_HEARTBEAT events of a running job (its lease renewal).
HEARTBEAT_S = 30.0
#: Heartbeat periods a job may go unheard before readers take it as abandoned. Three, so
#: that one late or lost heartbeat (a busy host, a batch delayed by a slow collector, a
#: few seconds of clock skew between the job's host and the reader) never ends a live job,
#: while a killed job stops sharing its host's energy after about 90 s.
LEASE_HEARTBEATS = 3
#: Environment override of HEARTBEAT_S, in seconds (for tests; set the same for the job
#: and for whoever reads the store, or a reader's lease will not match the job's period).
ENV_HEARTBEAT = "WATTLINE_HEARTBEAT_S"


def claim_key(component: str, device: str) -> str:
    """A device as job claims, USE events and reports name it: ``"gpu:<UUID or index>"``,
    ``"neuron:<n>"`` for the device ``neuron<n>``, else ``"<component>:<device>"``."""
    if component == "accelerator" and device.startswith("neuron") and device[6:].isdigit():
        return f"neuron:{int(device[6:])}"
    return f"{component}:{device}"


def heartbeat_s() -> float:
    """The heartbeat period: ``$WATTLINE_HEARTBEAT_S`` when it is a positive number, else HEARTBEAT_S."""
    try:
        value = float(os.environ.get(ENV_HEARTBEAT, HEARTBEAT_S))
    except ValueError:
        return HEARTBEAT_S
    return value if 0 < value < float("inf") else HEARTBEAT_S


def lease_ns() -> int:
    """How long after its last event an unclosed job counts as abandoned (LEASE_HEARTBEATS periods)."""
    return int(LEASE_HEARTBEATS * heartbeat_s() * 1e9)


__all__ = [
    "ENV_HEARTBEAT",
    "HEARTBEAT_S",
    "LEASE_HEARTBEATS",
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
    "claim_key",
    "heartbeat_s",
    "lease_ns",
    "pb",
]


def telemetry_stub(channel: object) -> Any:
    """A client stub of the Telemetry service on ``channel`` (the generated code is untyped)."""
    from wattline.v1 import telemetry_pb2_grpc as pb_grpc  # gRPC loads here: a Slurm hook never needs it

    return pb_grpc.TelemetryStub(channel)  # type: ignore[no-untyped-call]


def add_telemetry_servicer(servicer: object, server: object) -> None:
    """Register ``servicer`` (with a ``Push`` method) on a grpc server."""
    from wattline.v1 import telemetry_pb2_grpc as pb_grpc

    pb_grpc.add_TelemetryServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
