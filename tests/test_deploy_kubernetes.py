"""deploy/kubernetes: least privilege, the documented device conventions, probes, resources,
and a ConfigMap that builds valid settings."""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from wattline.agent.settings import AgentSettings
from wattline.collector.settings import CollectorSettings
from wattline.config import build

K8S = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
NAMESPACE = "wattline"
CLUSTER_SCOPED = {"Namespace", "PriorityClass"}
ACCELERATOR_RESOURCES = ("nvidia.com/", "aws.amazon.com/neuron", "amd.com/gpu")


def load(name: str) -> list[dict[str, Any]]:
    with (K8S / name).open() as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc]


def objects() -> list[dict[str, Any]]:
    kustomization = load("kustomization.yaml")[0]
    return [obj for name in kustomization["resources"] for obj in load(name)]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects() if obj["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in of_kind(kind) if o["metadata"]["name"] == name]
    return obj


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, key, value) of every mapping entry, recursively."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, key, value
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from walk(item, f"{path}[{i}]")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def daemonsets() -> list[dict[str, Any]]:
    sets = of_kind("DaemonSet")
    assert {d["metadata"]["name"] for d in sets} == {"wattline-agent", "wattline-agent-nvidia"}
    return sets


def config() -> dict[str, Any]:
    return tomllib.loads(named("ConfigMap", "wattline-config")["data"]["wattline.toml"])


def test_kustomization_lists_every_manifest() -> None:
    kustomization = load("kustomization.yaml")[0]
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk
    assert kustomization["namespace"] == NAMESPACE
    images: set[str] = set()
    for _, key, value in walk(objects()):
        if key in {"containers", "initContainers"}:
            images |= {container["image"].rsplit(":", 1)[0] for container in value}
    assert images == {i["name"] for i in kustomization["images"]}


def test_namespaces_and_pod_security_label() -> None:
    for obj in objects():
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], obj["kind"]
        else:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]
    labels = named("Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"  # hostPath /sys; see namespace.yaml


def test_nothing_privileged_anywhere() -> None:
    for path, key, value in walk(objects()):
        if key == "privileged":
            assert value is False, path
        if key == "allowPrivilegeEscalation":
            assert value is False, path
        assert key not in {"hostPID", "hostIPC"} or value is False, path
        if key == "add":
            pytest.fail(f"{path}: capabilities added: {value}")


@pytest.mark.parametrize("kind", ["DaemonSet", "Deployment"])
def test_every_container_is_locked_down(kind: str) -> None:
    for workload in of_kind(kind):
        pod = workload["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in pod.get("initContainers", []) + pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]}
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"])
            assert "memory" in resources["limits"]
            if kind == "DaemonSet":
                assert {"cpu", "memory"} <= set(resources["limits"])
            for section in ("requests", "limits"):
                for name in resources.get(section, {}):
                    assert not name.startswith(ACCELERATOR_RESOURCES), f"{container['name']} takes a {name}"


def test_agent_pod() -> None:
    for ds in daemonsets():
        pod = ds["spec"]["template"]["spec"]
        assert pod.get("hostNetwork", False) is False  # NIC counters come from the host's /sys, see the manifest
        assert {"operator": "Exists"} in pod["tolerations"]
        (container,) = pod["containers"]
        # The lean entry point, python -m wattline.agent (the image's venv), not the CLI.
        assert container["command"] == ["/opt/wattline/venv/bin/python", "-m", "wattline.agent"]
        args = container["args"]
        assert args[args.index("--config") + 1] == "/etc/wattline/wattline.toml"
        assert args[args.index("--sysfs-root") + 1] == "/host"
        assert env_of(container)["WATTLINE_AGENT_HOST_ID"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert container["resources"] == {
            "requests": {"cpu": "20m", "memory": "64Mi"},
            "limits": {"cpu": "100m", "memory": "128Mi"},
        }
        sc = container["securityContext"]
        # uid 0 without capabilities: reads the 0400 root-owned energy_uj by the owner bit alone.
        assert (sc["runAsUser"], sc["runAsNonRoot"]) == (0, False)
        assert pod.get("hostUsers", True) is True
        volumes = {v["name"]: v for v in pod["volumes"]}
        host_paths = {name: v["hostPath"]["path"] for name, v in volumes.items() if "hostPath" in v}
        assert host_paths == {"host-sys": "/sys"}
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["host-sys"]["mountPath"] == "/host/sys"
        assert mounts["host-sys"]["readOnly"] is True
        assert mounts["config"]["readOnly"] is True
        assert container["ports"][0]["containerPort"] == config()["agent"]["prometheus_port"]


def test_agent_priority_never_preempts() -> None:
    (priority,) = of_kind("PriorityClass")
    assert priority["preemptionPolicy"] == "Never"
    assert priority["value"] < 1_000_000_000  # below the system-* classes
    for ds in daemonsets():
        assert ds["spec"]["template"]["spec"]["priorityClassName"] == priority["metadata"]["name"]


def test_gpu_flavor_uses_the_nvidia_runtime_without_taking_a_gpu() -> None:
    gpu = named("DaemonSet", "wattline-agent-nvidia")
    cpu = named("DaemonSet", "wattline-agent")
    gpu_pod, cpu_pod = gpu["spec"]["template"]["spec"], cpu["spec"]["template"]["spec"]
    assert gpu_pod["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in cpu_pod
    gpu_env, cpu_env = env_of(gpu_pod["containers"][0]), env_of(cpu_pod["containers"][0])
    assert (gpu_env["NVIDIA_VISIBLE_DEVICES"], gpu_env["NVIDIA_DRIVER_CAPABILITIES"]) == ("all", "utility")
    assert not any(name.startswith("NVIDIA_") for name in cpu_env)

    def gpu_term(pod: dict[str, Any]) -> dict[str, Any]:
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        (term,) = terms
        (expr,) = [e for e in term["matchExpressions"] if e["key"] == "nvidia.com/gpu.present"]
        return dict(expr)

    assert gpu_term(gpu_pod) == {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
    assert gpu_term(cpu_pod) == {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}


def test_daemonsets_differ_only_where_documented() -> None:
    def normalized(ds: dict[str, Any]) -> dict[str, Any]:
        ds = copy.deepcopy(ds)
        del ds["metadata"]["name"]
        del ds["spec"]["selector"]["matchLabels"]["wattline.io/flavor"]
        template = ds["spec"]["template"]
        del template["metadata"]["labels"]["wattline.io/flavor"]
        template["spec"].pop("runtimeClassName", None)
        del template["spec"]["affinity"]
        container = template["spec"]["containers"][0]
        container["env"] = [e for e in container["env"] if not e["name"].startswith("NVIDIA_")]
        return ds

    cpu, gpu = (normalized(named("DaemonSet", n)) for n in ("wattline-agent", "wattline-agent-nvidia"))
    assert cpu == gpu


def test_selectors_match_their_pods_and_do_not_overlap() -> None:
    selectors = []
    for workload in of_kind("DaemonSet") + of_kind("Deployment"):
        match = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert match.items() <= labels.items()
        selectors.append(frozenset(match.items()))
    assert len(set(selectors)) == len(selectors)


def test_collector() -> None:
    deployment = named("Deployment", "wattline-collector")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    assert container["args"][:1] == ["collector"]
    assert container["resources"]["requests"] == {"cpu": "200m", "memory": "256Mi"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 50051, "metrics": config()["collector"]["prometheus_port"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == 50051, probe
    token = env_of(container)["WATTLINE_INFLUX_TOKEN"]["secretKeyRef"]
    assert token["optional"] is True

    service = named("Service", "wattline-collector")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (grpc_port,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert (grpc_port["port"], grpc_port["targetPort"]) == (50051, "grpc")


def test_network_policy_admits_only_agents_to_grpc() -> None:
    policy = named("NetworkPolicy", "wattline-collector")
    agent_labels = daemonsets()[0]["spec"]["template"]["metadata"]["labels"]
    (grpc_rule,) = [r for r in policy["spec"]["ingress"] if {"port": 50051, "protocol": "TCP"} in r["ports"]]
    (source,) = grpc_rule["from"]
    assert set(source) == {"podSelector"}
    assert source["podSelector"]["matchLabels"].items() <= agent_labels.items()


def test_configmap_builds_valid_settings() -> None:
    doc = config()
    agent = build(AgentSettings, "agent", doc, env={}).validate()
    collector = build(CollectorSettings, "collector", doc, env={}).validate()
    service = named("Service", "wattline-collector")
    (grpc_port,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert agent.collectors == [f"{service['metadata']['name']}.{NAMESPACE}.svc:{grpc_port['port']}"]
    assert collector.listen.rpartition(":")[2] == str(grpc_port["port"])
    assert not collector.store.startswith("sqlite:"), "two replicas need a shared store"
    assert doc["sources"]["neuron"]["monitor_path"] == ""  # the image has no neuron-monitor
