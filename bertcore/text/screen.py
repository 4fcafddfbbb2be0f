"""What a document must pass after its text is extracted and before it is split into
sentences: language identification (bertcore/text/langid.py, `corpus.languages`) and the
quality filters (bertcore/text/quality/), which may also remove lines.

The filters apply to web records (documents with a URL) unless an input says otherwise
(`quality_filters: true` on a book or JSONL input, `false` on a crawl); language
identification applies to every input while `corpus.detect_language` is on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bertcore.text import langid, quality
from bertcore.text.config import CorpusConfig


@dataclass(frozen=True)
class Verdict:
    lines: list[str]
    """The lines left (line filters may remove some)."""
    language: str = ""
    language_score: float = 0.0
    dropped: str = ""
    """The filter that drops the document ("language" or a quality family), or ""."""
    rule: str = ""
    detail: str = ""
    removed: dict[str, list[str]] = field(default_factory=dict)
    """Per quality family: the lines it removed from a kept document."""


@dataclass(frozen=True)
class Screen:
    detect: bool
    languages: frozenset[str]
    threshold: float
    filters: list
    quality_filters: bool | None
    """The input's setting: True/False, or None (on for web records)."""

    @classmethod
    def of(cls, cfg: CorpusConfig, quality_filters: bool | None = None) -> Screen:
        return cls(
            cfg.detect_language or bool(cfg.languages),
            frozenset(cfg.languages),
            cfg.language_threshold,
            quality.build(cfg.quality),
            quality_filters,
        )

    def judge(self, lines: list[str], language: str, web: bool) -> Verdict:
        """The verdict on a document's lines; `language` is its input's, used when no
        language is detected with confidence."""
        detected, score = langid.detect("\n".join(lines)) if self.detect else ("", 0.0)
        if self.languages and (detected not in self.languages or score < self.threshold):
            wanted = ", ".join(sorted(self.languages))
            return Verdict(
                lines,
                detected,
                score,
                "language",
                detected or "unknown",
                f"detected {detected or 'no language'} ({score:.2f}); keeping {wanted} at {self.threshold:.2f} or more",
            )
        rules_language = detected if detected and score >= self.threshold else language
        on = self.quality_filters if self.quality_filters is not None else web
        if not on or not self.filters:
            return Verdict(lines, detected, score)
        page = quality.Page(list(lines), rules_language)
        rejection = quality.screen(page, self.filters)
        if rejection is not None:
            return Verdict(lines, detected, score, rejection.family, rejection.rule, rejection.detail)
        return Verdict(page.lines, detected, score, removed=page.removed)

    @staticmethod
    def split_language(verdict: Verdict, language: str, threshold: float) -> str:
        """The language to split sentences in: the detected one when confident, else the input's."""
        return verdict.language if verdict.language and verdict.language_score >= threshold else language
