"""The docs' generator scripts (``docs/gen_*.py``), loaded from their paths: docs/ is no package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

DOCS = Path(__file__).resolve().parents[2] / "docs"


def load(name: str) -> ModuleType:
    """``docs/NAME.py`` as a module (a fresh one each call, so a test may patch it)."""
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
