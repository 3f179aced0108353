"""Whose jobs ``wattline jobs --mine`` lists: those whose ``user`` label is the caller's user
name, and those whose ``namespace`` label (a pod job's) is the caller's Kubernetes namespace
where one is known. Labels anyone can set: a filter, not a proof.

The namespace's sources, the first that gives one wins:

1. the namespace file of the pod's service account (kubernetes.io, "Accessing the Kubernetes
   API from a Pod": ``/var/run/secrets/kubernetes.io/serviceaccount/namespace``): a user
   in a notebook pod;
2. the current context's namespace in the user's kubeconfig (:mod:`.kubeconfig`).

A source that fails is reported in one line and the next is tried; none is guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from wattline.agent.holders.kube.pods import NAMESPACE_LABEL, namespace_ok
from wattline.config import ConfigError
from wattline.jobs.job_env import USER_LABEL, local_user
from wattline.jobs.kubeconfig import KubeconfigError, current_namespace

#: Where a pod's service account namespace is mounted (the default of ``jobs --namespace-file``).
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class Mine:
    """The caller's user name, namespace (None: not known), where it came from, and the
    sources that failed (one line each)."""

    user: str
    namespace: str | None
    source: str
    problems: tuple[str, ...] = ()

    def any_of(self) -> dict[str, str]:
        """The labels of which a job of mine carries at least one."""
        if self.namespace is None:
            return {USER_LABEL: self.user}
        return {USER_LABEL: self.user, NAMESPACE_LABEL: self.namespace}

    def line(self) -> str:
        """What --mine selects and from where, in one line (stderr)."""
        if self.namespace is None:
            return f"--mine: {USER_LABEL}={self.user}; no Kubernetes namespace ({self.source})"
        return f"--mine: {USER_LABEL}={self.user} or {NAMESPACE_LABEL}={self.namespace} (from {self.source})"


def find_mine(env: Mapping[str, str], namespace_file: Path) -> Mine:
    """The caller's user and namespace: ``namespace_file``, else the kubeconfig of ``env``."""
    user, problems = local_user(), []
    try:
        text = namespace_file.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as exc:
        text = None
        problems.append(f"--mine: {namespace_file}: cannot be read ({exc.__class__.__name__}): not used")
    if text is not None:
        if namespace_ok(text):
            return Mine(user, text, f"the service account's {namespace_file}")
        problems.append(f"--mine: {namespace_file}: {text[:80]!r} is not a namespace name: not used")
    account = "no service account namespace file" if not problems else "the service account's file not used"
    try:
        found = current_namespace(env)
    except KubeconfigError as exc:
        problems.append(f"--mine: {exc}: not used")
        return Mine(user, None, f"{account}, the kubeconfig not used", tuple(problems))
    if found is None:
        return Mine(user, None, f"{account}, no kubeconfig", tuple(problems))
    context = f"context {found.context}" + (", which names none: kubectl's default" if found.defaulted else "")
    return Mine(user, found.namespace, f"kubeconfig {found.file}, {context}", tuple(problems))


def check_labels(mine: Mine, wanted: Mapping[str, str]) -> None:
    """ConfigError where ``--label`` gives --mine's user or namespace another value (or a
    namespace where --mine knows none): the two would select nothing, or someone else's."""
    for key, value in ((USER_LABEL, mine.user), (NAMESPACE_LABEL, mine.namespace)):
        if key in wanted and wanted[key] != value:
            took = f"--mine takes {value}" if value is not None else "--mine knows none"
            raise ConfigError(f"options --mine and --label {key}=...: give one of them ({took})")
