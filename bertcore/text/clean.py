"""One raw document -> its sentences, or the reason it is dropped."""

from __future__ import annotations

from dataclasses import dataclass

from bertcore.text.config import CorpusConfig
from bertcore.text.records import RawDocument
from bertcore.text.sentences import split_sentences
from bertcore.text.wikitext import is_disambiguation, wikitext_to_paragraphs

DROP_REASONS = (
    "non_article",
    "redirect",
    "too_long",
    "disambiguation",
    "empty",
    "too_few_sentences",
    "too_few_chars",
)

# A redirect page whose <redirect/> element is missing (older exports) still starts with
# the magic word; "#넘겨주기" is Korean Wikipedia's alias.
_REDIRECT_PREFIXES = ("#redirect", "#넘겨주기")


@dataclass(frozen=True)
class Cleaned:
    title: str
    sentences: list[str]
    chars: int  # sum of the sentences' lengths in characters


@dataclass(frozen=True)
class Dropped:
    reason: str  # one of DROP_REASONS


def clean_document(raw: RawDocument, cfg: CorpusConfig, language: str) -> Cleaned | Dropped:
    """Sentences of an article or plain document, or why it is dropped.

    The cheap checks come first, in this order: namespace, redirect, length (before any
    parsing, so one huge record costs no parse time), disambiguation; then wikitext is
    reduced to paragraphs, paragraphs are split into sentences, and the minimum sentence
    count and character count are applied.
    """
    if raw.namespace != 0:
        return Dropped("non_article")
    wiki = raw.markup == "wikitext"
    if raw.redirect or (wiki and raw.text.lstrip()[:16].lower().startswith(_REDIRECT_PREFIXES)):
        return Dropped("redirect")
    if len(raw.text) > cfg.max_doc_chars:
        return Dropped("too_long")
    if wiki and cfg.drop_disambiguation and is_disambiguation(raw.text):
        return Dropped("disambiguation")
    text = "\n\n".join(wikitext_to_paragraphs(raw.text)) if wiki else raw.text
    sentences = split_sentences(text, language)
    if not sentences:
        return Dropped("empty")
    if len(sentences) < cfg.min_sentences:
        return Dropped("too_few_sentences")
    chars = sum(map(len, sentences))
    if chars < cfg.min_chars:
        return Dropped("too_few_chars")
    return Cleaned(title=raw.title, sentences=sentences, chars=chars)
