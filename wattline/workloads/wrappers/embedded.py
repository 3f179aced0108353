"""The embedded default: a local SQLite store and in-process sampling, nothing else to run."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wattline.agent.settings import AgentSettings
from wattline.collector.stores.base import Store
from wattline.collector.stores.factory import open_store
from wattline.workloads.wrappers.session import EmbeddedSession

#: Where the embedded store lives unless WATTLINE_STORE or --store says otherwise.
DEFAULT_DB = "~/.local/share/wattline/wattline.db"


def default_store_url(env: Mapping[str, str] | None = None) -> str:
    """``$WATTLINE_STORE``, else ``sqlite:///$XDG_DATA_HOME/wattline/wattline.db`` (created by
    the first writer, never by a reader)."""
    env = os.environ if env is None else env
    if env.get("WATTLINE_STORE"):
        return env["WATTLINE_STORE"]
    base = Path(env["XDG_DATA_HOME"]) if env.get("XDG_DATA_HOME") else Path(DEFAULT_DB).expanduser().parent.parent
    path = base / "wattline" / "wattline.db"
    return f"sqlite:///{path}"


class OwnedSession(EmbeddedSession):
    """An embedded session that also closes its store."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.store.close()


def embedded_session(
    store_url: str | None = None,
    settings: AgentSettings | None = None,
    doc: Mapping[str, Any] | None = None,
    store: Store | None = None,
) -> EmbeddedSession:
    """Start sampling this host in-process into ``store`` (else the store at ``store_url``,
    opened here); the session closes the store."""
    session = OwnedSession(store or open_store(store_url or default_store_url()), settings or AgentSettings(), doc)
    session.start()
    return session
