"""The devices the kubelet gave each pod: its pod-resources API v1, gRPC over a Unix socket.

``List`` names pods by (namespace, name), never by UID, and lists active pods only. A device
given whole is charged to the pod in full (a claim: ``gpu:GPU-<uuid>``, ``neuron:N``,
``neuroncore:N``); a time-sliced or MPS replica (``GPU-<uuid>::<n>``) is a share of a GPU
other pods hold too, so it is no claim: the pod's use splits that GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from wattline.v1 import podresources_pb2 as pr
from wattline.v1 import podresources_pb2_grpc as pr_grpc

#: Big nodes' replies exceed gRPC's default 4 MiB receive limit.
MAX_MESSAGE = 128 << 20
#: Resource name -> claim prefix; other resources (hugepages, NICs, DRA) are not charged.
PREFIXES = {
    "nvidia.com/gpu": "gpu",
    "nvidia.com/gpu.shared": "gpu",
    "aws.amazon.com/neuron": "neuron",
    "aws.amazon.com/neuroncore": "neuroncore",
}


@dataclass
class PodDevices:
    """A pod's devices: ``claimed`` in full, and ``shared`` GPUs (replicas) split by use."""

    claimed: set[str] = field(default_factory=set)
    shared: set[str] = field(default_factory=set)


def claim_keys(resource: str, device_id: str) -> tuple[str, bool] | None:
    """(claim key, shared?) of one device id of ``resource``; None when wattline charges no such device."""
    prefix = PREFIXES.get(resource) or ("gpu" if resource.startswith("nvidia.com/mig-") else None)
    if prefix is None or not device_id or len(device_id) > 128:
        return None
    physical, sep, _replica = device_id.partition("::")
    if prefix == "gpu":
        return f"gpu:{physical}", bool(sep) or resource.endswith(".shared")
    return (f"{prefix}:{int(physical)}", False) if physical.isdigit() else None


def parse(reply: pr.ListPodResourcesResponse) -> dict[tuple[str, str], PodDevices]:
    """(namespace, pod name) -> its devices, from a ``List`` reply."""
    out: dict[tuple[str, str], PodDevices] = {}
    for pod in reply.pod_resources:
        devices = out.setdefault((pod.namespace, pod.name), PodDevices())
        for container in pod.containers:
            for group in container.devices:
                for device_id in group.device_ids:
                    found = claim_keys(group.resource_name, device_id)
                    if found is not None:
                        (devices.shared if found[1] else devices.claimed).add(found[0])
    return out


def list_devices(socket_path: str, timeout_s: float = 2.0) -> dict[tuple[str, str], PodDevices]:
    """Ask the kubelet at ``socket_path``; OSError (one line) when it does not answer."""
    options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
    try:
        with grpc.insecure_channel(f"unix://{socket_path}", options=options) as channel:
            stub = pr_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
            reply = stub.List(pr.ListPodResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        raise OSError(f"pod-resources {socket_path}: {code.name if code else 'error'} {detail or ''}".strip()) from None
    return parse(reply)
