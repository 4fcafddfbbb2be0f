"""What a quality filter reads and returns: the `Page` (a document's lines and language), the
`Rejection` that drops it, and the `QualityFilter` interface every family implements."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class Page:
    """A document as the filters see it: its lines (an HTML block or a line of text each)
    and the language whose word rules apply."""

    lines: list[str]
    language: str
    paragraphs: list[str] | None = None
    """Runs of lines between blank lines of the original text; None: each line is one
    (extracted HTML, one-line-per-block text)."""
    removed: dict[str, list[str]] = field(default_factory=dict)
    """Per family: the lines it removed, in order."""

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def remove(self, family: str, keep: Callable[[str], bool]) -> None:
        kept = []
        for line in self.lines:
            if keep(line):
                kept.append(line)
            else:
                self.removed.setdefault(family, []).append(line)
        self.lines = kept


@dataclass(frozen=True)
class Rejection:
    family: str
    """The filter family that dropped the page (a key of FILTERS)."""
    rule: str
    """Which of its rules (word_count, duplicate_lines, curly_braces, ...)."""
    detail: str
    """The measured value against the bound, for people ("23 words, needs 50 to 100000")."""


class QualityFilter(Protocol):
    def apply(self, page: Page) -> Rejection | None:
        """Why the page is dropped, or None (a line filter may remove lines first)."""
        ...
