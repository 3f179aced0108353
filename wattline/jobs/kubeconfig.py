"""The namespace of a user's current Kubernetes context, found as kubectl finds it.

Files (kubernetes.io, "Organizing Cluster Access Using kubeconfig Files"): ``$KUBECONFIG``,
a colon-separated list (empty names ignored, missing files skipped, as client-go's loader
does), else ``$HOME/.kube/config`` alone. Merging: the first file to set a value or a map
key wins, so the first file naming a ``current-context`` gives it, and the first file
defining a context of that name gives the context. A context that names no namespace means
``default`` (kubectl's default namespace). A file that cannot be read, or holds YAML or a
shape that is not a kubeconfig, makes the whole lookup fail in one line, as kubectl refuses a
file it cannot deserialise: a namespace is never guessed. YAML is read by PyYAML's safe loader
(imported here only: ``wattline jobs --mine`` needs it, the agent and collector do not).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wattline.agent.holders.kube.pods import namespace_ok

#: The namespace kubectl uses where the context names none.
DEFAULT_NAMESPACE = "default"
#: Largest kubeconfig read (embedded certificates make a few KiB per cluster).
MAX_BYTES = 16 << 20


class KubeconfigError(ValueError):
    """Why no namespace was taken from the kubeconfig, in one line."""


@dataclass(frozen=True)
class KubeNamespace:
    """The current context's namespace, the context, and the file that defines the context."""

    namespace: str
    context: str
    file: Path
    defaulted: bool  # the context names none: kubectl's ``default``


def kubeconfig_files(env: Mapping[str, str]) -> list[Path]:
    """The files kubectl merges: ``$KUBECONFIG``'s, else ``$HOME/.kube/config``."""
    listed = [Path(name) for name in env.get("KUBECONFIG", "").split(":") if name]
    if listed:
        return listed
    return [Path(env.get("HOME") or Path.home()) / ".kube" / "config"]


def current_namespace(env: Mapping[str, str]) -> KubeNamespace | None:
    """The current context's namespace; None where no kubeconfig file exists.

    Raises KubeconfigError where a file cannot be read or understood, or where the files
    name no current context or define none of that name."""
    files = [f for f in kubeconfig_files(env) if f.exists()]
    if not files:
        return None
    current: str | None = None
    contexts: dict[str, tuple[Path, Mapping[str, Any]]] = {}
    for path in files:
        doc = _read(path)
        current = current or _string(doc, "current-context", path)
        for entry in _entries(doc, path):
            contexts.setdefault(entry["name"], (path, entry.get("context") or {}))
    shown = ":".join(str(f) for f in files)
    if not current:
        raise KubeconfigError(f"kubeconfig {shown}: no current-context")
    if current not in contexts:
        raise KubeconfigError(f"kubeconfig {shown}: current-context {current!r} is not defined")
    path, context = contexts[current]
    namespace = _string(context, "namespace", path)
    if namespace and not namespace_ok(namespace):
        raise KubeconfigError(f"kubeconfig {path}: context {current!r}: {namespace[:80]!r} is not a namespace name")
    return KubeNamespace(namespace or DEFAULT_NAMESPACE, current, path, not namespace)


def _read(path: Path) -> Mapping[str, Any]:
    try:
        if path.stat().st_size > MAX_BYTES:
            raise KubeconfigError(f"kubeconfig {path}: larger than {MAX_BYTES >> 20} MiB")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KubeconfigError(f"kubeconfig {path}: cannot be read ({exc.__class__.__name__})") from None
    import yaml  # the CLI's --mine only

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise KubeconfigError(f"kubeconfig {path}: {where}not YAML kubectl reads ({problem})") from None
    if doc is None:  # an empty file adds nothing, as for kubectl
        return {}
    if not isinstance(doc, dict) or doc.get("kind", "Config") != "Config":
        raise KubeconfigError(f"kubeconfig {path}: not a kubeconfig (kind Config)")
    return doc


def _string(doc: Mapping[str, Any], key: str, path: Path) -> str | None:
    value = doc.get(key)
    if value is not None and not isinstance(value, str):
        raise KubeconfigError(f"kubeconfig {path}: {key} is not a string")
    return value


def _entries(doc: Mapping[str, Any], path: Path) -> list[dict[str, Any]]:
    """The ``contexts`` list, each entry checked: a string ``name``, a mapping ``context``."""
    entries = doc.get("contexts") or []
    ok = isinstance(entries, list) and all(
        isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("context") or {}, dict)
        for e in entries
    )
    if not ok:
        raise KubeconfigError(f"kubeconfig {path}: contexts is not a list of named contexts")
    return entries
