"""deploy/kubernetes: strict-schema-valid objects, least privilege (the agent's RBAC too), the
documented device conventions, probes, resources, a ConfigMap that builds valid settings, and
a mount under every path the agent's pod watcher reads."""

from __future__ import annotations

import copy
import posixpath
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from wattline.agent.edge import socket_places
from wattline.agent.holders.kube.cgroups import CGROUP_DIR, PROC_DIR
from wattline.agent.holders.kube.pod_events import EVENTS_FILE
from wattline.agent.holders.kube.settings import KubeSettings
from wattline.agent.settings import AgentSettings
from wattline.collector.settings import CollectorSettings
from wattline.config import build

K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "operations" / "kubernetes.md"
NAMESPACE = "wattline"
CLUSTER_SCOPED = {"Namespace", "PriorityClass", "ClusterRole", "ClusterRoleBinding"}
#: What the downward API gives the agent's $(NODE_IP) and $(NODE_NAME) in these tests.
NODE = {"NODE_IP": "10.0.0.7", "NODE_NAME": "gpu-node-7"}
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


def expanded_env(container: dict[str, Any], downward: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: fieldRefs from ``downward`` (by
    variable name), ``$(VAR)`` replaced by variables defined above it."""
    out: dict[str, str] = {}
    for e in container.get("env", []):
        if "valueFrom" in e:
            if "fieldRef" in e["valueFrom"]:
                out[e["name"]] = downward[e["name"]]
            continue
        out[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: out.get(m.group(1), m.group(0)), e["value"])
    return out


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
        env = env_of(container)
        assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env["NODE_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
        assert expanded_env(container, NODE)["WATTLINE_AGENT_HOST_ID"] == NODE["NODE_NAME"]
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
        assert host_paths == {
            "host-sys": "/sys",
            "host-cgroup": "/sys/fs/cgroup",
            "host-proc": "/proc",
            "pod-resources": "/var/lib/kubelet/pod-resources",
            "kubelet-pods": "/var/lib/kubelet/pods",
            "runtime": "/run/wattline",
        }
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        for name, path in host_paths.items():  # every host path under /host, read-only but the edge socket's
            writable = name == "runtime"
            assert (mounts[name]["mountPath"], mounts[name].get("readOnly", False)) == ("/host" + path, not writable)
        # No propagation: Secret tmpfs mounts of pods started later stay out of the agent's view.
        assert mounts["kubelet-pods"]["mountPropagation"] == "None"
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
    # the replay log (a VictoriaMetrics store) on a writable volume of the pod, not the
    # read-only root nor the memory-backed /tmp, with room for its bound
    replay = PurePosixPath(env_of(container)["WATTLINE_COLLECTOR_REPLAY_DIR"])
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (mount,) = [m for m in container["volumeMounts"] if replay.is_relative_to(m["mountPath"])]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert not mount.get("readOnly") and "medium" not in volume["emptyDir"]
    limit_mib = int(volume["emptyDir"]["sizeLimit"].removesuffix("Mi"))
    assert limit_mib > CollectorSettings().replay_max_mb

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


def test_every_object_is_strict_schema_valid() -> None:
    """Each object against the Kubernetes API's own schema, unknown fields refused."""
    version = kubernetes_validate.latest_version()
    for obj in objects():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {str(exc).splitlines()[0]}")


def test_agent_rbac_is_the_least_that_reads_its_pod_list() -> None:
    account = named("ServiceAccount", "wattline-agent")
    assert account["automountServiceAccountToken"] is False
    (role,) = of_kind("ClusterRole")
    # The kubelet's /pods with fine-grained authorization: get nodes/pods, and nothing else
    # (nodes/proxy would reach /exec; Roles cannot grant node subresources).
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/pods"], "verbs": ["get"]}]
    assert not of_kind("Role") and not of_kind("RoleBinding")
    (binding,) = of_kind("ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "wattline-agent", "namespace": NAMESPACE}]
    for ds in daemonsets():
        pod = ds["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "wattline-agent"
        volumes = {v["name"]: v for v in pod["volumes"]}
        (token,) = [s["serviceAccountToken"] for s in volumes["pod-list-token"]["projected"]["sources"]
                    if "serviceAccountToken" in s]  # fmt: skip
        assert token["expirationSeconds"] <= 3600 and "audience" not in token  # the API server's: the kubelet checks it
    for deployment in of_kind("Deployment"):  # the collector reads no API
        assert deployment["spec"]["template"]["spec"].get("serviceAccountName", "default") == "default"


def mount_of(container: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The volume mount that holds ``path`` (the deepest one whose mountPath contains it)."""
    holding = [m for m in container["volumeMounts"] if (path + "/").startswith(m["mountPath"].rstrip("/") + "/")]
    return max(holding, key=lambda m: len(m["mountPath"]), default=None)


def test_every_path_the_pod_watcher_reads_is_mounted() -> None:
    doc = config()
    for ds in daemonsets():
        pod = ds["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = expanded_env(container, NODE)
        settings = build(KubeSettings, "kubernetes", doc, env=env).validate()
        assert settings.pods is True
        assert settings.pod_list_url == f"https://{NODE['NODE_IP']}:10250/pods"  # the node's own kubelet
        args = container["args"]
        root = args[args.index("--sysfs-root") + 1]
        volumes = {v["name"]: v for v in pod["volumes"]}
        read = {
            settings.token_file: "pod-list-token",
            settings.pod_resources_socket: "pod-resources",
            posixpath.join(root, CGROUP_DIR): "host-cgroup",
            posixpath.join(root, PROC_DIR, "1", "cgroup"): "host-proc",
            posixpath.join(root, EVENTS_FILE.format(uid="u")): "kubelet-pods",
        }
        for path, volume in read.items():
            mount = mount_of(container, path)
            assert mount is not None and mount["name"] == volume, path
            assert mount["readOnly"] is True, path
            if "hostPath" in volumes[volume]:  # the host's own path, seen under the sysfs root
                inside = posixpath.relpath(path, mount["mountPath"])
                host = posixpath.normpath(posixpath.join(volumes[volume]["hostPath"]["path"], inside))
                assert "/" + posixpath.relpath(path, root) == host, path
        # The socket's directory, not the socket: the kubelet recreates it on restart.
        assert mount_of(container, settings.pod_resources_socket)["mountPath"] == posixpath.dirname(  # type: ignore[index]
            settings.pod_resources_socket
        )
        agent = build(AgentSettings, "agent", doc, env=env)
        outbox = mount_of(container, agent.outbox_dir)
        assert outbox is not None and not outbox.get("readOnly") and "emptyDir" in volumes[outbox["name"]]


def guide_pod() -> dict[str, Any]:
    """The pod docs/operations/kubernetes.md shows for a pod's own jobs."""
    (pod,) = [doc for block in re.findall(r"```yaml\n(.*?)```", GUIDE.read_text(), re.S)
              if (doc := yaml.safe_load(block))["kind"] == "Pod"]  # fmt: skip
    return dict(pod)


def test_the_agent_serves_its_edge_socket_on_the_node_and_pods_reach_it() -> None:
    """The agent (uid 0, --sysfs-root /host, no socket setting) serves the node's
    /run/wattline/edge.sock through a writable hostPath; the guide's pod, strict-schema-valid,
    mounts the same host folder where a wrapper in it looks, as root or any other uid, and
    carries the node's host id."""
    node_socket = "/run/wattline/edge.sock"
    doc = config()
    for ds in daemonsets():
        pod = ds["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = expanded_env(container, NODE)
        args = container["args"]
        root = args[args.index("--sysfs-root") + 1]
        agent = build(AgentSettings, "agent", doc, env=env).validate()
        uid = container["securityContext"]["runAsUser"]
        served = [p.path for p in socket_places(agent.edge_socket, Path(root), env, uid) if uid == 0 or not p.root_only]
        assert str(served[0]) == root + node_socket
        mount = mount_of(container, str(served[0]))
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert mount is not None and not mount.get("readOnly", False)
        host = volumes[mount["name"]]["hostPath"]
        assert posixpath.join(host["path"], posixpath.relpath(str(served[0]), mount["mountPath"])) == node_socket
        assert host["type"] == "DirectoryOrCreate"
    pod = guide_pod()
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    (container,) = pod["spec"]["containers"]
    assert env_of(container)["WATTLINE_AGENT_HOST_ID"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for uid in (0, 1000):  # a wrapper in the pod, no socket setting, no $XDG_RUNTIME_DIR
        assert node_socket in [str(p.path) for p in socket_places("", Path("/"), {}, uid)]
    mount = mount_of(container, node_socket)
    assert mount is not None
    host = volumes[mount["name"]]["hostPath"]
    assert posixpath.join(host["path"], posixpath.relpath(node_socket, mount["mountPath"])) == node_socket
