"""The embedded default: a local SQLite store and in-process sampling, nothing else to run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wattline.agent.settings import AgentSettings
from wattline.jobs.wrappers.session import EmbeddedSession
from wattline.reports.summaries.store import default_store_url
from wattline.stores.base import Store
from wattline.stores.factory import open_store


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
