"""The ``[kubernetes]`` table's options, apart from the watcher: the agent reads them on every
start and loads the watcher (an HTTP client, the pod-resources gRPC stubs) only where ``pods``
is on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from wattline.config import ConfigError, build, option


@dataclass
class KubeSettings:
    """The ``[kubernetes]`` table (env ``WATTLINE_KUBERNETES_*``)."""

    pods: bool = option(False, "Make jobs of this node's pods (docs/operations/kubernetes.md).")
    pod_list_url: str = option(
        "", "URL of this node's pod list: the kubelet's https://NODE_IP:10250/pods (or the API server's list)."
    )
    token_file: str = option(
        "/var/run/secrets/kubernetes.io/serviceaccount/token", "Bearer token for pod_list_url; empty: none."
    )
    ca_file: str = option("", "CA (PEM) of pod_list_url's certificate; empty: the system's roots.")
    tls_verify: bool = option(True, "Verify pod_list_url's certificate (kubelets often serve a self-signed one).")
    poll_interval: float = option(5.0, "Seconds between two looks at the pods (and their CPU time).")
    pod_resources_socket: str = option(
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "The kubelet's pod-resources socket: the devices each pod was given; empty: not asked.",
    )
    pod_labels: list[str] = option([], "Pod labels copied to each pod's job (as pod_<key>).")

    def validate(self) -> KubeSettings:
        if self.pods and not self.pod_list_url.startswith(("https://", "http://")):
            raise ConfigError(f"option kubernetes.pod_list_url: {self.pod_list_url[:100]!r} is not an http(s) URL")
        if not 1 <= self.poll_interval <= 60:
            raise ConfigError(f"option kubernetes.poll_interval: {self.poll_interval} s out of range (1..60)")
        return self


def pods_settings(doc: Mapping[str, Any]) -> KubeSettings | None:
    """The ``[kubernetes]`` table's settings where ``pods`` is on, else None; ConfigError on bad ones."""
    settings = build(KubeSettings, "kubernetes", doc).validate()
    return settings if settings.pods else None
