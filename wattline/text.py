"""Short text for messages: a value quoted at most about :data:`QUOTE_CHARS` characters
(:func:`clip`), a free text on one short line (:func:`one_line`)."""

from __future__ import annotations

#: Characters of a bad value quoted in messages.
QUOTE_CHARS = 100


def clip(value: object, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` of at most about ``limit`` characters: a long string is cut, and its
    length said, so a 10 MiB tag makes a short message."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit + 20 else text[:limit] + "..."


def one_line(text: str, limit: int = 100) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
