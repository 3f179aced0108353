"""A TOML file read whole, its failures one line each: apart from :mod:`.config` so a Slurm
hook reads its node's settings without loading the config machinery."""

from __future__ import annotations

import tomllib

TYPE_CHECKING = False  # typing's own flag costs a hook the typing module
if TYPE_CHECKING:
    from typing import Any


class TomlFileError(ValueError):
    """A missing, unreadable or malformed file, in one line."""


def load(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise TomlFileError(f"config file {path}: not found") from None
    except PermissionError:
        raise TomlFileError(f"config file {path}: permission denied") from None
    except tomllib.TOMLDecodeError as exc:
        raise TomlFileError(f"config file {path}: invalid TOML: {exc}") from None
