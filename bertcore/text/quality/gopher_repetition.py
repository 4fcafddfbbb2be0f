"""Gopher's repetition rules (Rae et al. 2021, table A1): a document is dropped when more
than 30% of its lines (or paragraphs) repeat an earlier one, or repeated lines (paragraphs)
hold more than 20% of its characters, or the most frequent 2-, 3- or 4-gram covers more
than 20%, 18% or 16% of its word characters, or the words inside 5- to 10-grams seen
earlier in the document hold more than 15% down to 10% of them.

Lines are the page's lines; paragraphs are runs of lines between blank lines of the
original text, which for extracted HTML and one-line-per-block text are the lines too.
"""

from __future__ import annotations

from collections import Counter

from bertcore.text.quality.config import GopherRepetitionConfig
from bertcore.text.quality.page import Page, Rejection
from bertcore.text.quality.words import rules_for, words


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(items that repeat an earlier item, characters in them)."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


def top_ngram_fraction(found: list[str], n: int) -> float:
    """Share of word characters covered by the occurrences of the most frequent n-gram."""
    total = sum(map(len, found))
    if total == 0 or len(found) < n:
        return 0.0
    counts = Counter(tuple(found[i : i + n]) for i in range(len(found) - n + 1))
    gram, times = counts.most_common(1)[0]
    return sum(map(len, gram)) * times / total if times > 1 else 0.0


def duplicate_ngram_fraction(found: list[str], n: int) -> float:
    """Share of word characters in words that lie inside an n-gram seen earlier."""
    total = sum(map(len, found))
    if total == 0 or len(found) < n:
        return 0.0
    seen: set[tuple[str, ...]] = set()
    covered = [False] * len(found)
    for i in range(len(found) - n + 1):
        gram = tuple(found[i : i + n])
        if gram in seen:
            covered[i : i + n] = [True] * n
        else:
            seen.add(gram)
    return sum(len(w) for w, c in zip(found, covered) if c) / total


class GopherRepetition:
    family = "gopher_repetition"

    def __init__(self, cfg: GopherRepetitionConfig):
        self.cfg = cfg

    def _reject(self, rule: str, detail: str) -> Rejection:
        return Rejection(self.family, rule, detail)

    def apply(self, page: Page) -> Rejection | None:
        cfg, lines = self.cfg, page.lines
        if not lines:
            return None
        units = [("line", lines, cfg.max_duplicate_lines, cfg.max_duplicate_line_chars)]
        if page.paragraphs is not None:
            units.append(
                ("paragraph", page.paragraphs, cfg.max_duplicate_paragraphs, cfg.max_duplicate_paragraph_chars)
            )
        for what, items, limit_count, limit_chars in units:
            if not items:
                continue
            count, chars = _duplicates(items)
            total_chars = sum(map(len, items)) or 1
            if count / len(items) > limit_count:
                return self._reject(
                    f"duplicate_{what}s",
                    f"{count / len(items):.0%} of {what}s repeat an earlier one, at most {limit_count:.0%}",
                )
            if chars / total_chars > limit_chars:
                return self._reject(
                    f"duplicate_{what}_chars",
                    f"repeated {what}s hold {chars / total_chars:.0%} of characters, at most {limit_chars:.0%}",
                )
        if not rules_for(page.language).spaced:
            return None
        found = [w.lower() for w in words(page.text)]
        for limit in cfg.top_ngrams:
            fraction = top_ngram_fraction(found, limit.n)
            if fraction > limit.max_fraction:
                return self._reject(
                    f"top_{limit.n}gram",
                    f"the most frequent {limit.n}-gram covers {fraction:.1%}, at most {limit.max_fraction:.0%}",
                )
        for limit in cfg.duplicate_ngrams:
            fraction = duplicate_ngram_fraction(found, limit.n)
            if fraction > limit.max_fraction:
                return self._reject(
                    f"duplicate_{limit.n}grams",
                    f"repeated {limit.n}-grams cover {fraction:.1%}, at most {limit.max_fraction:.0%}",
                )
        return None
