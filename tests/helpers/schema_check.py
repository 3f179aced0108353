"""The published JSON Schemas (``docs/schema/NAME.schema.json``, draft 2020-12), checked
themselves, as validators for the tests that hold real outputs against them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

SCHEMAS = Path(__file__).parents[2] / "docs" / "schema"


def validator(name: str) -> jsonschema.Draft202012Validator:
    """``docs/schema/<name>.schema.json``, itself a valid draft 2020-12 schema."""
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema_errors(name: str, data: Any) -> list[str]:
    """Where and why ``data`` breaks schema ``name`` ([] when it holds)."""
    return [f"{e.json_path}: {e.message}" for e in validator(name).iter_errors(data)]
