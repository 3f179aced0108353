"""Import gRPC for a wattline process with its client I/O on the calling thread.

gRPC (1.85) runs a client call's reads and writes on its EventEngine thread pool by
default: after each call the pool's threads keep waking up between pushes, and for an agent
that pushes a small batch every few seconds those wake-ups cost more CPU than the call
itself. With the ``event_engine_client`` experiment off, the thread that waits for the
answer polls the socket itself (gRPC's long-standing poller) and nothing wakes between
calls. ``bench/run``'s agent part (the ``floor+grpc`` yardstick) shows the difference.

gRPC reads ``GRPC_EXPERIMENTS`` once, when it is imported, so :func:`import_grpc` must run
before anything imports it: ``python -m wattline.agent`` calls it first. The ``wattline``
console script calls :func:`defer_grpc` first instead: most commands never use gRPC, and
importing it is a large part of a command's start, so gRPC is imported, with the same
setting, only when something first imports it. Both set the variable only for that import
(a command that ``wattline run`` starts does not inherit it), leave a value the user set
alone, and do nothing once gRPC is imported. Libraries (the Job API in a user's process)
never call them: their process's gRPC stays as its owner set it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import MutableMapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

#: The experiment switched off: the client's I/O on the EventEngine thread pool.
EXPERIMENTS = "-event_engine_client"
VARIABLE = "GRPC_EXPERIMENTS"


def import_grpc(environ: MutableMapping[str, str] | None = None) -> bool:
    """Import grpc with the client's I/O on the calling thread; True when this call chose it."""
    env = os.environ if environ is None else environ
    if "grpc" in sys.modules or VARIABLE in env:
        return False
    env[VARIABLE] = EXPERIMENTS
    try:
        import grpc  # noqa: F401  (reads GRPC_EXPERIMENTS now)
    finally:
        del env[VARIABLE]
    return True


class _SettingLoader(importlib.abc.Loader):
    """gRPC's own loader, run with the setting in the environment."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader  # the module looks as if imported plainly
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        if VARIABLE in os.environ:
            self.loader.exec_module(module)
            return
        os.environ[VARIABLE] = EXPERIMENTS
        try:
            self.loader.exec_module(module)
        finally:
            del os.environ[VARIABLE]


class _GrpcFinder(importlib.abc.MetaPathFinder):
    """Finds gRPC once, through the other finders, and hands it to :class:`_SettingLoader`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != "grpc":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _SettingLoader(spec.loader)
        return spec


def defer_grpc() -> bool:
    """Have gRPC, when first imported, imported as :func:`import_grpc` does; True when this
    call chose it (neither gRPC imported nor the variable set yet)."""
    if "grpc" in sys.modules or VARIABLE in os.environ:
        return False
    sys.meta_path.insert(0, _GrpcFinder())
    return True
