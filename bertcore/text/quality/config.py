"""Settings of the quality filters (`corpus.quality:` in a recipe). Defaults are the papers':
Gopher (Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights from Training
Gopher", appendix A.1.1 and table A1) and C4 (Raffel et al. 2020, "Exploring the Limits of
Transfer Learning with a Unified Text-to-Text Transformer", section 2.2)."""

from __future__ import annotations

from pydantic import Field

from bertcore.section import Section


class GopherQualityConfig(Section):
    """Gopher's quality rules: a document outside any bound is dropped."""

    enabled: bool = True
    """Apply these rules."""
    min_words: int = Field(50, ge=0)
    """Fewest words (Gopher: 50)."""
    max_words: int = Field(100_000, ge=1)
    """Most words (Gopher: 100,000)."""
    min_mean_word_length: float = Field(3.0, ge=0)
    """Shortest mean word length in characters (Gopher: 3; Korean: 1.5, see bertcore/text/quality/words.py)."""
    max_mean_word_length: float = Field(10.0, gt=0)
    """Longest mean word length in characters (Gopher: 10)."""
    max_symbol_word_ratio: float = Field(0.1, ge=0)
    """Most hash symbols and ellipses per word (Gopher: 0.1)."""
    max_bullet_lines: float = Field(0.9, ge=0, le=1)
    """Largest share of lines that start with a bullet (Gopher: 90%)."""
    max_ellipsis_lines: float = Field(0.3, ge=0, le=1)
    """Largest share of lines that end with an ellipsis (Gopher: 30%)."""
    min_alpha_words: float = Field(0.8, ge=0, le=1)
    """Smallest share of words holding at least one letter (Gopher: 80%)."""
    min_stop_words: int = Field(2, ge=0)
    """Fewest stop words of the document's language (Gopher: 2 of the, be, to, of, and, that, have, with); languages
    without a list skip this rule."""


class NgramLimit(Section):
    n: int = Field(ge=1)
    """Words per n-gram."""
    max_fraction: float = Field(ge=0, le=1)
    """Largest share of the document's word characters the n-grams may cover."""


class GopherRepetitionConfig(Section):
    """Gopher's repetition rules: a document that repeats itself more is dropped."""

    enabled: bool = True
    """Apply these rules."""
    max_duplicate_lines: float = Field(0.3, ge=0, le=1)
    """Largest share of lines that repeat an earlier line (Gopher: 0.30)."""
    max_duplicate_paragraphs: float = Field(0.3, ge=0, le=1)
    """Largest share of paragraphs that repeat an earlier one (Gopher: 0.30)."""
    max_duplicate_line_chars: float = Field(0.2, ge=0, le=1)
    """Largest share of characters in repeated lines (Gopher: 0.20)."""
    max_duplicate_paragraph_chars: float = Field(0.2, ge=0, le=1)
    """Largest share of characters in repeated paragraphs (Gopher: 0.20)."""
    top_ngrams: list[NgramLimit] = Field(
        default_factory=lambda: [
            NgramLimit(n=2, max_fraction=0.2),
            NgramLimit(n=3, max_fraction=0.18),
            NgramLimit(n=4, max_fraction=0.16),
        ]
    )
    """Most frequent n-gram: largest share of characters its occurrences cover (Gopher: 2-grams 0.20, 3-grams 0.18,
    4-grams 0.16)."""
    duplicate_ngrams: list[NgramLimit] = Field(
        default_factory=lambda: [
            NgramLimit(n=n, max_fraction=f)
            for n, f in ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))
        ]
    )
    """Repeated n-grams: largest share of characters in words inside an n-gram seen before (Gopher: 5-grams 0.15 down to
    10-grams 0.10)."""


class C4Config(Section):
    """C4's line and page filters: lines are removed, pages dropped."""

    enabled: bool = True
    """Apply these rules."""
    terminal_punctuation: bool = True
    """Remove lines that do not end in a terminal punctuation mark (. ! ? or a closing quote)."""
    min_line_words: int = Field(5, ge=0)
    """Remove lines with fewer words (C4: 5)."""
    javascript: bool = True
    """Remove lines that mention javascript (C4: "enable Javascript" notices)."""
    policy: bool = True
    """Remove lines with policy boilerplate (C4's phrases: terms of use, privacy policy, cookie policy, uses cookies,
    use of cookies, use cookies; bertpipe adds their German and Korean counterparts)."""
    lorem_ipsum: bool = True
    """Drop pages that contain "lorem ipsum" (placeholder text)."""
    curly_braces: bool = True
    """Drop pages that contain a curly brace (code)."""
    min_sentences: int = Field(3, ge=0)
    """Drop pages left with fewer sentences (C4: 3), counted by terminal punctuation."""


class QualityConfig(Section):
    """The quality filters, applied in this order to web records (or to any input with `quality_filters: true`)."""

    gopher_repetition: GopherRepetitionConfig = Field(default_factory=GopherRepetitionConfig)
    """Gopher's repetition rules."""
    gopher_quality: GopherQualityConfig = Field(default_factory=GopherQualityConfig)
    """Gopher's quality rules."""
    c4: C4Config = Field(default_factory=C4Config)
    """C4's line and page filters (after the Gopher rules, as FineWeb orders them)."""
