"""A reader for the block YAML that kubectl writes (``kubectl config view``, ``use-context``):
mappings and sequences by indentation, one scalar per line, nothing else.

kubectl serialises a kubeconfig through ``sigs.k8s.io/yaml`` (go-yaml): keys sorted, block
style, a sequence at its key's indentation, strings plain or quoted, ``{}``/``[]`` for empty
collections. That subset is read here exactly; anything else (anchors, tags, block or
multi-line scalars, flow collections with content, tabs, several documents) is refused with
a :class:`YamlSubsetError` naming the line, never guessed at: PyYAML is a dev dependency
only, and a kubeconfig is read only for its current context's namespace.
"""

from __future__ import annotations

import re
from typing import Any

#: A plain mapping key as kubeconfigs use them (``current-context``, ``certificate-authority-data``).
_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]*")
#: Characters that start a YAML construct this reader does not read (anchor, alias, tag,
#: block scalar, flow collection, directive, reserved).
_REFUSED_START = set("&*!|>{[%@`?")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "n": "\n", "t": "\t"}


class YamlSubsetError(ValueError):
    """Text outside the subset read here, in one line (with its line number)."""


def parse(text: str) -> Any:
    """The document in ``text``: dicts, lists, strings, booleans and None (numbers stay strings)."""
    lines: list[tuple[int, str, int]] = []  # (indent, content, line number)
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.lstrip(" ")
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("\t") or raw.rstrip() in ("---", "..."):
            raise YamlSubsetError(f"line {number}: a tab or a document marker (not read here)")
        lines.append((len(raw) - len(stripped), stripped.rstrip(" "), number))
    if not lines:
        return None
    value, end = _block(lines, 0, lines[0][0])
    if end < len(lines):
        raise YamlSubsetError(f"line {lines[end][2]}: unexpected indentation")
    return value


def _block(lines: list[tuple[int, str, int]], i: int, indent: int) -> tuple[Any, int]:
    """The mapping or sequence whose lines start at ``indent`` from line ``i``, and the next line."""
    if _is_item(lines[i][1]):
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _is_item(content: str) -> bool:
    return content == "-" or content.startswith("- ")


def _mapping(lines: list[tuple[int, str, int]], i: int, indent: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent and not _is_item(lines[i][1]):
        _, content, number = lines[i]
        key, sep, rest = content.partition(":")
        if not sep or not _KEY.fullmatch(key) or (rest and not rest.startswith(" ")):
            raise YamlSubsetError(f"line {number}: not a KEY: VALUE line")
        if key in out:
            raise YamlSubsetError(f"line {number}: key {key!r} given twice")
        rest, i = rest.strip(), i + 1
        if rest and not rest.startswith("#"):
            out[key] = _scalar(rest, number)
        elif i < len(lines) and (lines[i][0] > indent or (lines[i][0] == indent and _is_item(lines[i][1]))):
            out[key], i = _block(lines, i, lines[i][0])
        else:
            out[key] = None
    if i < len(lines) and lines[i][0] > indent:
        raise YamlSubsetError(f"line {lines[i][2]}: unexpected indentation")
    return out, i


def _sequence(lines: list[tuple[int, str, int]], i: int, indent: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    while i < len(lines) and lines[i][0] == indent and _is_item(lines[i][1]):
        _, content, number = lines[i]
        after = content[1:]
        text = after.lstrip(" ")
        if not text or text.startswith("#"):  # "-" alone: the item is the block below
            i += 1
            if i < len(lines) and lines[i][0] > indent:
                item, i = _block(lines, i, lines[i][0])
            else:
                item = None
        elif _is_item(text) or (_KEY.match(text) and re.match(r"[^:]*:( |$)", text)):
            # "- key: value": a mapping whose first line starts after the dash
            lines[i] = (indent + 1 + len(after) - len(text), text, number)
            item, i = _block(lines, i, lines[i][0])
        else:
            item, i = _scalar(text, number), i + 1
            if i < len(lines) and lines[i][0] > indent:
                raise YamlSubsetError(f"line {lines[i][2]}: a scalar on several lines (not read here)")
        out.append(item)
    return out, i


def _scalar(text: str, number: int) -> Any:
    """One line's value: quoted, ``{}``/``[]``, null, a boolean, or a plain string."""
    if text[0] in "\"'":
        value, rest = _quoted(text, number)
        if rest.strip() and not rest.strip().startswith("#"):
            raise YamlSubsetError(f"line {number}: text after a quoted value")
        return value
    plain = text.split(" #", 1)[0].rstrip()
    if plain in ("{}", "[]"):
        return {} if plain == "{}" else []
    if plain[0] in _REFUSED_START or plain.startswith(("- ", ": ")) or ": " in plain or plain.endswith(":"):
        raise YamlSubsetError(f"line {number}: {plain[:40]!r} is YAML this reader does not read")
    if plain in ("null", "~", "Null", "NULL"):
        return None
    if plain in ("true", "True", "TRUE", "false", "False", "FALSE"):
        return plain.lower() == "true"
    return plain


def _quoted(text: str, number: int) -> tuple[str, str]:
    """A single- or double-quoted string at the start of ``text``, and the text after it."""
    quote, out, i = text[0], [], 1
    while i < len(text):
        char = text[i]
        if char == quote:
            if quote == "'" and text[i + 1 : i + 2] == "'":  # '' is one quote in single quotes
                out.append("'")
                i += 2
                continue
            return "".join(out), text[i + 1 :]
        if char == "\\" and quote == '"':
            code = text[i + 1 : i + 2]
            if code in _ESCAPES:
                out.append(_ESCAPES[code])
                i += 2
                continue
            if code == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", text[i + 2 : i + 6]):
                out.append(chr(int(text[i + 2 : i + 6], 16)))
                i += 6
                continue
            raise YamlSubsetError(f"line {number}: an escape this reader does not read")
        out.append(char)
        i += 1
    raise YamlSubsetError(f"line {number}: a quoted value not closed on its line")
