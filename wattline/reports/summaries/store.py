"""The store a job or command uses unless told otherwise: ``$WATTLINE_STORE``, else the
embedded SQLite file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

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
