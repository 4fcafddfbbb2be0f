"""Words as the quality rules count them, and what changes per language.

A word is a run of characters between spaces with the punctuation around it removed
("(Hamburg)," -> "Hamburg"); a token of punctuation only is not a word. Gopher's rules were
written for English; bertpipe keeps their thresholds and changes, per language:

- stop words: Gopher asks for 2 occurrences of the, be, to, of, and, that, have, with.
  German, French and Spanish get their 8-10 most frequent function words. Korean attaches
  its particles (은/는/이/가/을/를/의/에) to the word before them, so they are never words
  of their own; Korean counts the standalone words that fill the same role in running text:
  bound nouns and auxiliaries (것, 수, 등, 때, 및), conjunctions (그리고, 또는, 하지만) and the
  most frequent verb forms (있다, 있는, 하는, 한다, 위한, 대한, 통해). A language without a list
  skips the stop-word rule.
- mean word length: a Korean word (eojeol) is a stem plus particles or endings written in
  syllable blocks, each a whole syllable: 2 to 4 characters for most words, so its lower
  bound is 1.5 characters instead of 3 (measured with these words: the konlpy Korean law
  and bill text has a mean of 3.2 characters; English news 4.9 and Austen's Emma 4.4;
  German web pages 5.7 and the German Debian FAQ 6.4).
- languages written without spaces (Chinese, Japanese, Thai, Lao, Khmer, Burmese) have no
  words to count: the rules on words (count, mean length, stop words, letters, n-grams)
  are skipped for them; the line and character rules still apply.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

STOP_WORDS: dict[str, frozenset[str]] = {
    "en": frozenset("the be to of and that have with".split()),
    "de": frozenset("der die das und ist zu von mit nicht sich".split()),
    "fr": frozenset("le la les de et un une des est que".split()),
    "es": frozenset("el la los las de que y en es un".split()),
    "ko": frozenset("것 수 등 때 및 그리고 또는 하지만 있다 있는 하는 한다 위한 대한 통해".split()),
}
UNSPACED = frozenset({"zh", "ja", "th", "lo", "km", "my"})
_MIN_MEAN_LENGTH = {"ko": 1.5}


@dataclass(frozen=True)
class WordRules:
    stop_words: frozenset[str] | None
    """None: the language has no list and skips the stop-word rule."""
    spaced: bool
    min_mean_length: float | None
    """A language's own lower bound on mean word length, replacing the configured one."""


def rules_for(language: str) -> WordRules:
    return WordRules(STOP_WORDS.get(language), language not in UNSPACED, _MIN_MEAN_LENGTH.get(language))


def _strip_punctuation(token: str) -> str:
    start, end = 0, len(token)
    while start < end and unicodedata.category(token[start])[0] in "PS":
        start += 1
    while end > start and unicodedata.category(token[end - 1])[0] in "PS":
        end -= 1
    return token[start:end]


def words(text: str) -> list[str]:
    """The words of `text`: whitespace tokens without surrounding punctuation, non-empty."""
    return [w for w in map(_strip_punctuation, text.split()) if w]
