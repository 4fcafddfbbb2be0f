"""Gopher's quality rules (Rae et al. 2021, appendix A.1.1): a document is kept when it has
50 to 100,000 words, a mean word length of 3 to 10 characters, at most 0.1 hash symbols or
ellipses per word, at most 90% of lines starting with a bullet, at most 30% of lines
ending with an ellipsis, at least 80% of words holding a letter, and at least two stop
words. Per-language changes (Korean, unspaced scripts) are in words.py."""

from __future__ import annotations

from bertcore.text.quality.config import GopherQualityConfig
from bertcore.text.quality.page import Page, Rejection
from bertcore.text.quality.words import rules_for, words

_BULLETS = ("\u2022", "\u25cf", "\u25aa", "\u2023", "\u2043", "\u25e6", "-", "*")
_ELLIPSES = ("...", "\u2026")


class GopherQuality:
    family = "gopher_quality"

    def __init__(self, cfg: GopherQualityConfig):
        self.cfg = cfg

    def _reject(self, rule: str, detail: str) -> Rejection:
        return Rejection(self.family, rule, detail)

    def apply(self, page: Page) -> Rejection | None:
        cfg, rules = self.cfg, rules_for(page.language)
        text = page.text
        lines = page.lines
        if lines:
            bullets = sum(line.lstrip().startswith(_BULLETS) for line in lines) / len(lines)
            if bullets > cfg.max_bullet_lines:
                return self._reject(
                    "bullet_lines", f"{bullets:.0%} of lines start with a bullet, at most {cfg.max_bullet_lines:.0%}"
                )
            ellipses = sum(line.rstrip().endswith(_ELLIPSES) for line in lines) / len(lines)
            if ellipses > cfg.max_ellipsis_lines:
                return self._reject(
                    "ellipsis_lines",
                    f"{ellipses:.0%} of lines end with an ellipsis, at most {cfg.max_ellipsis_lines:.0%}",
                )
        if not rules.spaced:
            return None
        found = words(text)
        n = len(found)
        if not cfg.min_words <= n <= cfg.max_words:
            return self._reject("word_count", f"{n} words, needs {cfg.min_words} to {cfg.max_words}")
        mean = sum(map(len, found)) / n if n else 0.0
        low = rules.min_mean_length if rules.min_mean_length is not None else cfg.min_mean_word_length
        if not low <= mean <= cfg.max_mean_word_length:
            return self._reject(
                "mean_word_length", f"mean word length {mean:.1f}, needs {low:g} to {cfg.max_mean_word_length:g}"
            )
        symbols = text.count("#") + sum(text.count(e) for e in _ELLIPSES)
        if n and symbols / n > cfg.max_symbol_word_ratio:
            return self._reject(
                "symbol_ratio",
                f"{symbols / n:.2f} hash symbols and ellipses per word, at most {cfg.max_symbol_word_ratio:g}",
            )
        alpha = sum(any(ch.isalpha() for ch in w) for w in found) / n if n else 0.0
        if alpha < cfg.min_alpha_words:
            return self._reject("alpha_words", f"{alpha:.0%} of words hold a letter, needs {cfg.min_alpha_words:.0%}")
        if rules.stop_words is not None:
            stops = sum(w.lower() in rules.stop_words for w in found)
            if stops < cfg.min_stop_words:
                return self._reject("stop_words", f"{stops} stop words of {page.language}, needs {cfg.min_stop_words}")
        return None
