"""Configuration: a TOML file, ``WATTLINE_*`` environment variables, then flags (flags win).

Each daemon's settings are a dataclass whose fields carry their help text. One TOML
table per dataclass (``[agent]``, ``[collector]``, ``[sources.rapl]``...), and one
environment variable per field: ``WATTLINE_<TABLE>_<FIELD>`` upper-cased with dots as
underscores (``WATTLINE_AGENT_INTERVAL=0.1``, ``WATTLINE_SOURCES_NIC_IDLE_W=2``).

Every bad value raises :class:`ConfigError` naming the option, so the CLI can print one
line and exit non-zero.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import stat
import types
import typing
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from wattline import toml_file

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, malformed or out of range (one-line message)."""


def option(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with help text (``default`` may be a factory via ``default_factory``)."""
    if isinstance(default, list | dict):
        return dataclasses.field(
            default_factory=functools.partial(copy.copy, default), metadata={"help": help}, **kwargs
        )
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)


def read_toml(path: Path | None) -> dict[str, Any]:
    """Parse a TOML config file; a missing or malformed file is a :class:`ConfigError`."""
    if path is None:
        return {}
    try:
        return toml_file.load(str(path))
    except toml_file.TomlFileError as exc:
        raise ConfigError(str(exc)) from None


def table(doc: Mapping[str, Any], dotted: str) -> dict[str, Any]:
    """The sub-table at ``dotted`` ("sources.rapl"), or {} when absent."""
    node: Any = doc
    for part in dotted.split("."):
        node = node.get(part, {}) if isinstance(node, Mapping) else {}
    if not isinstance(node, Mapping):
        raise ConfigError(f"config [{dotted}]: expected a table")
    return dict(node)


def build(
    cls: type[T],
    name: str,
    doc: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> T:
    """Build dataclass ``cls`` for table ``name`` from file, environment and flags.

    ``flags`` holds only options the user gave (None values are ignored).
    """
    values: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    file_values = table(doc or {}, name)
    for key in file_values:
        if key not in fields:
            raise ConfigError(f"config [{name}]: unknown option {key!r}{closest(key, fields)}")
    env = os.environ if env is None else env
    for key in fields:
        label = f"{name}.{key}"
        variable = env_name(name, key)
        if flags and flags.get(key) is not None:
            values[key] = coerce(flags[key], hints[key], f"--{key.replace('_', '-')}")
        elif variable in env:
            values[key] = coerce(env[variable], hints[key], variable)
        elif key in file_values:
            values[key] = coerce(file_values[key], hints[key], label)
    return cls(**values)


def env_name(table_name: str, key: str) -> str:
    """The environment variable of option ``key`` of table ``table_name``: WATTLINE_AGENT_INTERVAL."""
    return f"WATTLINE_{table_name.upper().replace('.', '_')}_{key.upper()}"


def env_names(cls: type[Any], table_name: str) -> set[str]:
    """Every environment variable :func:`build` reads for dataclass ``cls`` as table ``table_name``."""
    return {env_name(table_name, f.name) for f in dataclasses.fields(cls)}


def closest(name: str, known: Iterable[str], fmt: str = "{}") -> str:
    """`` (did you mean X?)`` with the known name closest to ``name`` (difflib), or ""."""
    import difflib  # only for a message: not loaded by a process whose settings are right

    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {fmt.format(match[0])}?)" if match else ""


def check_tables(doc: Mapping[str, Any], known: Collection[str], path: Path) -> None:
    """ConfigError (one line) naming the first table of ``doc`` that is not in ``known``
    (dotted names: ``agent``, ``sources``, ``sources.rapl``), with the closest known one."""

    def check(name: str, value: Any) -> None:
        if name not in known:
            raise ConfigError(f"config file {path}: unknown table [{name[:100]}]{closest(name, known, '[{}]')}")
        if isinstance(value, Mapping) and any(k.startswith(name + ".") for k in known):
            for key, sub in value.items():
                check(f"{name}.{key}", sub)

    for key, value in doc.items():
        check(key, value)


def unknown_variables(env: Mapping[str, str], known: Collection[str]) -> list[str]:
    """One line per ``WATTLINE_*`` variable of ``env`` that is not in ``known``, with the closest."""
    return [
        f"environment variable {name[:100]} is not a wattline setting; ignored{closest(name, known)}"
        for name in sorted(env)
        if name.startswith("WATTLINE_") and name not in known
    ]


def coerce(value: Any, hint: Any, label: str) -> Any:
    """Convert ``value`` (TOML value or string) to the annotated type, or raise ConfigError."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    try:
        if origin in (typing.Union, types.UnionType):
            inner = [a for a in args if a is not type(None)]
            if value is None or value == "":
                return None
            return coerce(value, inner[0], label)
        if hint is bool:
            return _to_bool(value)
        if hint in (int, float):
            if isinstance(value, bool):
                raise ValueError
            number = hint(value)
            return number
        if hint is str:
            if not isinstance(value, str | int | float):
                raise ValueError
            return str(value)
        if hint is Path:
            return Path(str(value)).expanduser()
        if origin is list:
            items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else list(value)
            return [coerce(v, args[0], label) for v in items]
        if origin is dict:
            if isinstance(value, str):
                value = parse_pairs(value.split(","), label)
            if not isinstance(value, Mapping):
                raise ValueError
            return {str(k): coerce(v, args[1], label) for k, v in value.items()}
    except (TypeError, ValueError):
        raise ConfigError(f"option {label}: invalid value {value!r} (expected {_type_name(hint)})") from None
    raise ConfigError(f"option {label}: unsupported type {hint!r}")


def parse_pairs(items: list[str] | tuple[str, ...], label: str) -> dict[str, str]:
    """Parse ``k=v`` strings (labels) into a dict; a malformed item is a ConfigError."""
    out: dict[str, str] = {}
    for item in items:
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"option {label}: expected KEY=VALUE, got {item!r}")
        out[key.strip()] = val.strip()
    return out


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off"}:
        return False
    raise ValueError(text)


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint) if a is not type(None))
    if origin is list:
        return "a list"
    if origin is dict:
        return "a table of KEY=VALUE"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string", Path: "a path"}.get(
        hint, str(hint)
    )


def help_of(cls: type[Any], key: str) -> str:
    """The help text of field ``key`` of dataclass ``cls``."""
    for f in dataclasses.fields(cls):
        if f.name == key:
            return str(f.metadata.get("help", ""))
    raise KeyError(key)


def _check_private(path: Path, what: str) -> None:
    """Refuse a secret file that is missing, not a regular file, or group/world accessible."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ConfigError(f"{what} file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} file {path}: not a regular file")
    if st.st_mode & 0o077:
        raise ConfigError(f"{what} file {path}: permissions {oct(st.st_mode & 0o777)} too open; chmod 600 {path}")


def read_secret(path: Path | None, env_var: str, what: str) -> str | None:
    """A secret from ``path`` (refused when group/world readable) or the environment.

    Secrets never come from argv (visible in ``ps``) and are never logged.
    """
    if path is not None:
        _check_private(path, what)
        try:
            return path.read_text().strip()
        except (OSError, UnicodeError) as exc:
            raise ConfigError(f"{what} file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return os.environ.get(env_var) or None


def read_secret_bytes(path: Path, what: str) -> bytes:
    """The raw bytes of a secret file (a TLS private key), refused when group/world readable."""
    _check_private(path, what)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} file {path}: {exc.strerror}") from None


def read_public_file(path: Path, what: str) -> bytes:
    """The bytes of a non-secret file (a certificate), or a ConfigError naming it."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} file {path}: {exc.strerror}") from None
    if not data.strip():
        raise ConfigError(f"{what} file {path}: empty")
    return data
