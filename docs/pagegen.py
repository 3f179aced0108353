"""What the generated docs pages share: a page that a script writes, a check that tells a
stale page (``--check`` exits 1) and an MkDocs hook that stops the build on one.

A page is whole (``docs/options.md``) or has generated regions between hand-written prose
(``docs/performance.md``): its ``render`` gets the page's text on disk and returns what it
should be. A source that cannot make the page raises :class:`Unusable`, whose one line is
what the reader sees (exit 2; the hook stops the build with it too).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class Unusable(Exception):
    """The page cannot be made from its source; the message is one line saying why."""


@dataclass(frozen=True)
class Generated:
    page: Path
    #: The command that rewrites the page, as the stale message tells it.
    command: str
    #: The page's text on disk ("" when there is none) -> the page as it should be.
    render: Callable[[str], str]

    def _current(self) -> str:
        return self.page.read_text() if self.page.exists() else ""

    def stale_message(self) -> str | None:
        """None when the page on disk is what ``render`` writes, else one line saying so.

        Raises :class:`Unusable` when the source cannot make the page."""
        current = self._current()
        if self.page.exists() and self.render(current) == current:
            return None
        return f"{self.page.name} is stale: run {self.command}"

    def check(self) -> int:
        """``--check``: 0 when current, 1 when stale, 2 when the page cannot be made."""
        try:
            message = self.stale_message()
        except Unusable as exc:
            print(f"{self.page.name}: {exc}", file=sys.stderr)
            return 2
        if message:
            print(message, file=sys.stderr)
            return 1
        return 0

    def write(self) -> int:
        """Rewrite the page: 0, or 2 when it cannot be made."""
        try:
            self.page.write_text(self.render(self._current()))
        except Unusable as exc:
            print(f"{self.page.name}: {exc}", file=sys.stderr)
            return 2
        return 0

    def on_pre_build(self, config: Any) -> None:
        """MkDocs hook: a stale page, or one its source cannot make, stops the build."""
        try:
            message = self.stale_message()
        except Unusable as exc:
            message = f"{self.page.name}: {exc}"
        if message:
            from mkdocs.exceptions import PluginError

            raise PluginError(message)
