"""Which language a document is in, with lingua (a maintained detector whose language models
ship inside its wheel: nothing is downloaded at run time).

lingua scores every language it knows (75, Korean, German and English among them) from the
character n-grams of the text and gives each a confidence; the detected language is the
one with the highest, and its confidence (0-1, the confidences of all languages sum to 1)
is the score stored with the document. The detector runs in lingua's low-accuracy mode
(trigrams only): its authors measure it as nearly as accurate as the full mode on text of
a sentence or more, at a fraction of the memory and time. Measured here: a process that
detected English and German text peaked at 70 MB of RSS (1.3 GB with every model of the
full mode preloaded) and took 2-8 ms per document. Models load lazily, for the languages
whose alphabet a text uses.

Only `SAMPLE_CHARS` characters of a document are read, from its longest lines (running
text, not a page's title, menu remnants or captions): detection costs about 2 ms plus 5 ms
per 1,000 characters here, so reading 600 characters instead of 2,000 halves its cost on
Wikipedia articles, and beyond a few hundred characters the answer does not change (the
Korean, English and web-sample tests identify every document either way).
"""

from __future__ import annotations

from functools import lru_cache

SAMPLE_CHARS = 600


@lru_cache(maxsize=1)
def _detector():
    from lingua import LanguageDetectorBuilder

    return LanguageDetectorBuilder.from_all_languages().with_low_accuracy_mode().build()


def detect(text: str) -> tuple[str, float]:
    """(ISO 639-1 code, confidence) of the language `text` is in; ("", 0.0) when it holds no
    letters lingua can judge (digits, symbols, an empty page)."""
    sample = _sample(text)
    values = _detector().compute_language_confidence_values(sample) if sample.strip() else []
    if not values or values[0].value <= 0:
        return "", 0.0
    best = values[0]
    return best.language.iso_code_639_1.name.lower(), round(float(best.value), 4)


def _sample(text: str) -> str:
    """Up to SAMPLE_CHARS characters of `text`: its longest lines first (in their order on ties)."""
    if len(text) <= SAMPLE_CHARS:
        return text
    picked, size = [], 0
    for line in sorted(text.splitlines(), key=len, reverse=True):
        picked.append(line[: SAMPLE_CHARS - size])
        size += len(picked[-1]) + 1
        if size >= SAMPLE_CHARS:
            break
    return "\n".join(picked)


def known(code: str) -> bool:
    """Whether lingua knows the language with this ISO 639-1 code."""
    from lingua import IsoCode639_1

    return hasattr(IsoCode639_1, code.upper())
