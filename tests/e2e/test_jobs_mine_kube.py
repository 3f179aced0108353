"""``wattline jobs --mine`` with a Kubernetes namespace (issue #45): the caller's jobs are
those whose ``user`` label is theirs and the pod jobs whose ``namespace`` label is theirs,
taken from the service account's namespace file, else the kubeconfig's current context.

The store is made as a cluster makes it: pod jobs of three namespaces from the agent's pod
watcher (a pod list served over HTTP, polled while the pods run and after they end) and
wrapped runs (``wattline run``) of the caller and of someone else. The kubeconfigs are the
Kubernetes docs' ``config-demo`` as kubectl prints it and an exec-plugin one in the same
shape (tests/fixtures/kubernetes/kubeconfig/SOURCE.md). Each case's selection is exact.
"""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from procs import CLI, clean_env
from typer.testing import CliRunner

from wattline import wire
from wattline.agent.holders.kube.settings import KubeSettings
from wattline.agent.holders.kube.watcher import PodWatcher
from wattline.cli.main import app
from wattline.stores.sqlite.store import SqliteStore

S = 10**9
T0 = 1_767_225_600 * S
KUBECONFIGS = Path(__file__).parents[1] / "fixtures/kubernetes/kubeconfig"
ME = getpass.getuser()
#: The pods the node lists: (name, namespace, owner or annotation) -> the job id the watcher gives.
PODS = {
    ("llama-ft-worker-0", "frontend", "PyTorchJob"): "k8s:frontend/llama-ft:25a8decc",
    ("nb-dev", "frontend", "nb-dev"): "k8s:frontend/nb-dev",
    ("nb-store", "storage", "nb-store"): "k8s:storage/nb-store",
    ("scratch", "default", "scratch"): "k8s:default/scratch",
    ("web-7d9-x", "frontend", "ReplicaSet"): None,  # a Deployment's pod: node energy, no job
}
WRAPPED = {"run-mine": ME, "run-theirs": "someone-else"}
BY_NS = {ns: {job for (_n, pns, _o), job in PODS.items() if pns == ns and job} for ns in ("frontend", "storage")}


def _pod(name: str, namespace: str, owner: str, n: int, phase: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"{n:08x}-0000-4000-8000-{n:012x}"}
    if owner == "PyTorchJob":
        meta["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama-ft",
                                    "uid": "25a8decc-c279-4939-8a78-2c1d60675542", "controller": True}]  # fmt: skip
    elif owner == "ReplicaSet":
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9",
                                    "uid": "5b0c7e0a-1111-4222-8333-944455556666", "controller": True}]  # fmt: skip
    else:
        meta["annotations"] = {"wattline.io/job": owner}
    started = "2026-01-01T00:00:00Z"
    state: dict[str, Any] = {"running": {"startedAt": started}}
    if phase == "Succeeded":
        state = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started,
                                "finishedAt": "2026-01-01T00:00:10Z"}}  # fmt: skip
    status = {"phase": phase, "startTime": started, "containerStatuses": [
        {"name": "main", "containerID": "containerd://" + f"{n:02x}" * 32, "restartCount": 0, "state": state}]}  # fmt: skip
    return {"metadata": meta, "spec": {"nodeName": "gpu-node-7"}, "status": status}


def _pod_list(phase: str) -> dict[str, Any]:
    items = [_pod(name, ns, owner, n, phase) for n, (name, ns, owner) in enumerate(PODS, start=1)]
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}


def _pod_events(root: Path) -> list[wire.pb.JobEvent]:
    """The watcher's events for :data:`PODS`: listed running, then ended."""
    reply: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    settings = KubeSettings(pods=True, pod_list_url=f"http://127.0.0.1:{http.server_port}/pods", token_file="",
                            pod_resources_socket="")  # fmt: skip
    sent: list[wire.pb.JobEvent] = []
    watcher = PodWatcher(settings.validate(), wire.Host(host_id="gpu-node-7"), root, lambda _h, ev: sent.extend(ev))
    try:
        for phase, t_s in (("Running", 1), ("Running", 6), ("Succeeded", 11)):
            reply.update(_pod_list(phase))
            watcher.poll(T0 + t_s * S)
        watcher.flush()
    finally:
        http.shutdown()
    return sent


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite store with the pod jobs and the wrapped runs; its URL."""
    d = tmp_path_factory.mktemp("mine-kube")
    db = SqliteStore(d / "w.db")
    batch = wire.Batch(stream_id="agent", seq=1, sent_ns=T0)
    batch.host.host_id = "gpu-node-7"
    batch.job_events.extend(_pod_events(d / "host"))
    assert db.write(batch).rejected == 0
    db.close()
    url = f"sqlite:///{d / 'w.db'}"
    env = {**clean_env(), "WATTLINE_STORE": url}
    for job_id, user in WRAPPED.items():
        labels = [] if user == ME else ["--label", f"user={user}"]
        out = subprocess.run([*CLI, "run", "--job-id", job_id, "--no-report", *labels, "--", sys.executable, "-c", "pass"],
                             capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
        assert out.returncode == 0, out.stderr
    return url


def mine(store: str, tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, set[str], list[str]]:
    """``jobs --mine --json --no-energy`` with no service account file unless ``--namespace-file``
    is in ``args`` and HOME at ``tmp_path`` unless ``env`` says: (exit, job ids, stderr lines)."""
    where = [] if "--namespace-file" in args else ["--namespace-file", str(tmp_path / "no-such-file")]
    full_env = {"WATTLINE_STORE": store, "HOME": str(tmp_path), "KUBECONFIG": "", **env}
    result = CliRunner().invoke(app, ["jobs", "--mine", "--json", "--no-energy", *where, *args], env=full_env)
    ids = {row["id"] for row in json.loads(result.stdout)} if result.exit_code == 0 else set()
    return result.exit_code, ids, result.stderr.strip().splitlines()


def test_the_store_holds_what_the_cluster_and_the_wrappers_wrote(store: str) -> None:
    """The truth the other tests select from: every pod job with its namespace, the runs with their users."""
    listed = CliRunner().invoke(app, ["jobs", "--json", "--no-energy"], env={"WATTLINE_STORE": store})
    rows = {r["id"]: r["labels"] for r in json.loads(listed.stdout)}
    pod_jobs = {job: ns for (_n, ns, _o), job in PODS.items() if job}
    assert set(rows) == set(pod_jobs) | set(WRAPPED)
    assert {job: rows[job].get("namespace") for job in pod_jobs} == pod_jobs
    assert {job: rows[job].get("user") for job in WRAPPED} == WRAPPED
    assert all("user" not in rows[job] for job in pod_jobs) and all("namespace" not in rows[j] for j in WRAPPED)


def test_a_service_account_namespace_file_selects_its_namespace(store: str, tmp_path: Path) -> None:
    """In a notebook pod: the mounted namespace file wins over any kubeconfig."""
    (tmp_path / "namespace").write_text("storage")  # as the kubelet mounts it: no newline
    env = {"KUBECONFIG": str(KUBECONFIGS / "config-demo")}  # would say frontend
    code, ids, err = mine(store, tmp_path, env, "--namespace-file", str(tmp_path / "namespace"))
    assert code == 0 and ids == {"run-mine"} | BY_NS["storage"]
    assert err == [f"--mine: user={ME} or namespace=storage (from the service account's {tmp_path / 'namespace'})"]


def test_the_kubeconfigs_current_context_names_the_namespace(store: str, tmp_path: Path) -> None:
    """The docs' config-demo at ~/.kube/config, current context dev-frontend (namespace frontend)."""
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube/config").write_text((KUBECONFIGS / "config-demo").read_text())
    code, ids, err = mine(store, tmp_path, {})
    assert code == 0 and ids == {"run-mine"} | BY_NS["frontend"]
    assert err == [f"--mine: user={ME} or namespace=frontend (from kubeconfig {tmp_path / '.kube/config'}, "
                   "context dev-frontend)"]  # fmt: skip


def test_merged_kubeconfigs_first_to_set_a_value_wins(store: str, tmp_path: Path) -> None:
    """$KUBECONFIG as kubectl merges it: empty names and missing files skipped; the first file
    naming a current-context gives it, the first defining that context gives its namespace;
    $HOME/.kube/config is not read."""
    (tmp_path / "first").write_text("apiVersion: v1\nkind: Config\ncurrent-context: dev-storage\npreferences: {}\n")
    later = yaml.safe_load((KUBECONFIGS / "config-demo").read_text())
    later["contexts"][1]["context"]["namespace"] = "frontend"  # a later dev-storage: discarded
    later["current-context"] = "exp-test"  # a later current-context: discarded
    (tmp_path / "later").write_text(yaml.safe_dump(later))
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube/config").write_text("not: [a kubeconfig\n")  # would fail if read
    files = ["", str(tmp_path / "missing"), str(tmp_path / "first"), str(KUBECONFIGS / "config-demo"),
             str(tmp_path / "later"), ""]  # fmt: skip
    code, ids, err = mine(store, tmp_path, {"KUBECONFIG": ":".join(files)})
    assert code == 0 and ids == {"run-mine"} | BY_NS["storage"]
    assert err == [f"--mine: user={ME} or namespace=storage (from kubeconfig {KUBECONFIGS / 'config-demo'}, "
                   "context dev-storage)"]  # fmt: skip


def test_a_context_without_a_namespace_means_default(store: str, tmp_path: Path) -> None:
    """An exec-plugin kubeconfig whose context names no namespace: kubectl's ``default``."""
    code, ids, err = mine(store, tmp_path, {"KUBECONFIG": str(KUBECONFIGS / "config-exec")})
    assert code == 0 and ids == {"run-mine", "k8s:default/scratch"}
    assert err == [f"--mine: user={ME} or namespace=default (from kubeconfig {KUBECONFIGS / 'config-exec'}, "
                   "context alice@gpu-fleet, which names none: kubectl's default)"]  # fmt: skip


@pytest.mark.parametrize("kubeconfig", ["", "/no/such/kubeconfig::/nor/this"])
def test_no_namespace_known_selects_the_user_label_only(store: str, tmp_path: Path, kubeconfig: str) -> None:
    """No ~/.kube/config, or $KUBECONFIG naming only missing files (kubectl skips them)."""
    code, ids, err = mine(store, tmp_path, {"KUBECONFIG": kubeconfig})
    assert code == 0 and ids == {"run-mine"}
    assert err == [f"--mine: user={ME}; no Kubernetes namespace (no service account namespace file, no kubeconfig)"]


def test_both_sources_failing_are_each_one_line(store: str, tmp_path: Path) -> None:
    (tmp_path / "namespace").mkdir()  # a directory where the file should be: unreadable
    (tmp_path / "bad").write_text("current-context: x\ncontexts: *anchor\n")
    args = ("--namespace-file", str(tmp_path / "namespace"))
    code, ids, err = mine(store, tmp_path, {"KUBECONFIG": str(tmp_path / "bad")}, *args)
    assert code == 0 and ids == {"run-mine"}
    assert err == [
        f"--mine: {tmp_path / 'namespace'}: cannot be read (IsADirectoryError): not used",
        f"--mine: kubeconfig {tmp_path / 'bad'}: line 2: not YAML kubectl reads (found undefined alias 'anchor'): not used",
        f"--mine: user={ME}; no Kubernetes namespace (the service account's file not used, the kubeconfig not used)",
    ]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("apiVersion: v1\ncontexts: [\n- name: a\n", "line 3"),  # an unclosed flow sequence
        ("apiVersion: v1\ncurrent-context: a\nkind: Config\n\tcontexts: []\n", "line 4"),  # a tab
        ("current-context: dev\ncontexts:\n- name: dev\n  context: {namespace: storage\n", "line 5"),  # unclosed
        ("apiVersion: v1\nkind: Secret\n", "not a kubeconfig"),
        ("current-context: gone\ncontexts: []\n", "'gone' is not defined"),
        ("current-context: dev\ncontexts:\n- name: dev\n  context:\n    namespace: Team_B\n", "not a namespace"),
    ],
)
def test_a_kubeconfig_that_cannot_be_read_is_one_line_and_the_user_label_stays(
    store: str, tmp_path: Path, text: str, why: str
) -> None:
    """Refused in one line that names the file; --mine still lists the user's own jobs."""
    (tmp_path / "bad").write_text(text)
    code, ids, err = mine(store, tmp_path, {"KUBECONFIG": str(tmp_path / "bad")})
    assert code == 0 and ids == {"run-mine"}
    assert len(err) == 2 and err[0].startswith(f"--mine: kubeconfig {tmp_path / 'bad'}") and why in err[0], err
    assert err[1] == (f"--mine: user={ME}; no Kubernetes namespace (no service account namespace file, "
                      "the kubeconfig not used)")  # fmt: skip


def test_a_bad_service_account_file_is_reported_and_the_kubeconfig_used(store: str, tmp_path: Path) -> None:
    (tmp_path / "namespace").write_text("Not A Namespace\n")
    args = ("--namespace-file", str(tmp_path / "namespace"))
    code, ids, err = mine(store, tmp_path, {"KUBECONFIG": str(KUBECONFIGS / "config-demo")}, *args)
    assert code == 0 and ids == {"run-mine"} | BY_NS["frontend"]
    assert err[0] == f"--mine: {tmp_path / 'namespace'}: 'Not A Namespace' is not a namespace name: not used"
    assert len(err) == 2 and "namespace=frontend" in err[1]


def test_a_label_on_the_namespace_narrows_or_is_refused(store: str, tmp_path: Path) -> None:
    """--label namespace= ANDs like any label; one that contradicts --mine's (or names one where
    --mine knows none) would select someone else's jobs or nothing: one line, exit 2."""
    env = {"KUBECONFIG": str(KUBECONFIGS / "config-demo")}
    code, ids, _err = mine(store, tmp_path, env, "--label", "namespace=frontend")
    assert code == 0 and ids == BY_NS["frontend"]
    for case_env, took in ((env, "--mine takes frontend"), ({"KUBECONFIG": ""}, "--mine knows none")):
        args = ["jobs", "--mine", "--label", "namespace=storage", "--namespace-file", str(tmp_path / "none")]
        full_env = {**clean_env(), "WATTLINE_STORE": store, "HOME": str(tmp_path), **case_env}
        out = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env=full_env)
        assert out.returncode == 2 and out.stdout == "", out.stderr
        assert out.stderr.strip().splitlines() == [
            f"wattline: error: options --mine and --label namespace=...: give one of them ({took})"
        ]


def test_csv_selects_the_same_jobs(store: str, tmp_path: Path) -> None:
    env = {"WATTLINE_STORE": store, "HOME": str(tmp_path), "KUBECONFIG": str(KUBECONFIGS / "config-demo")}
    args = ["jobs", "--mine", "--csv", "--namespace-file", str(tmp_path / "none")]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    ids = {line.split(",")[0] for line in result.stdout.splitlines()[1:]}
    assert ids == {"run-mine"} | BY_NS["frontend"]
