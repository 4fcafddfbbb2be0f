"""One raw document -> its sentences, or the reason it is dropped."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

from bertcore.text.books import paragraphs, split_long, strip_gutenberg
from bertcore.text.config import CorpusConfig
from bertcore.text.records import RawDocument
from bertcore.text.sentences import split_sentences
from bertcore.text.wikisite import SiteInfo, back_matter_titles
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
# the magic word; "#넘겨주기" is Korean Wikipedia's alias, "#đổi" Vietnamese's.
_REDIRECT_PREFIXES = ("#redirect", "#넘겨주기", "#đổi", "#weiterleitung", "#redirection", "#転送", "#重定向")
# A complete HTML character reference (&amp; &#233; &#xE9;). Legacy references without
# the semicolon ("&copy") are left alone: in plain text they are more often words ("R&D").
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")


@dataclass(frozen=True)
class Wiki:
    """How to read one wiki's markup: its namespace names and dropped section titles."""

    site: SiteInfo
    dropped_sections: frozenset[str]

    @classmethod
    def of(cls, cfg: CorpusConfig, language: str, site: SiteInfo | None) -> Wiki:
        site = site or SiteInfo.default()
        return cls(site, back_matter_titles([language, site.language], cfg.back_matter_sections))


@dataclass(frozen=True)
class Cleaned:
    title: str
    sentences: list[str]
    chars: int  # sum of the sentences' lengths in characters
    long_sentences_split: int = 0
    """Sentences longer than max_sentence_chars that were cut into pieces."""
    boilerplate_chars: int = 0
    """Characters of licence header and footer removed (Project Gutenberg)."""


@dataclass(frozen=True)
class Dropped:
    reason: str  # one of DROP_REASONS


def decode_entities(text: str) -> str:
    """HTML character references in plain text decoded (&amp; -> &, &#233; -> é)."""
    return _ENTITY.sub(lambda m: html.unescape(m.group(0)), text) if "&" in text else text


def clean_document(raw: RawDocument, cfg: CorpusConfig, language: str, wiki: Wiki | None = None) -> Cleaned | Dropped:
    """Sentences of an article or plain document, or why it is dropped.

    The cheap checks come first, in this order: namespace, redirect, length (before any
    parsing, so one huge record costs no parse time), disambiguation; then wikitext is
    reduced to paragraphs (`wiki`: the wiki's names, default English), plain text has its
    licence boilerplate removed, entities decoded and hard wraps undone; paragraphs are
    split into sentences, sentences over `max_sentence_chars` are cut, and the minimum
    sentence count and character count are applied.
    """
    if raw.namespace != 0:
        return Dropped("non_article")
    is_wiki = raw.markup == "wikitext"
    if raw.redirect or (is_wiki and raw.text.lstrip()[:16].lower().startswith(_REDIRECT_PREFIXES)):
        return Dropped("redirect")
    if len(raw.text) > cfg.max_doc_chars:
        return Dropped("too_long")
    if is_wiki and cfg.drop_disambiguation and is_disambiguation(raw.text):
        return Dropped("disambiguation")
    boilerplate = 0
    if is_wiki:
        wiki = wiki or Wiki.of(cfg, language, None)
        blocks = wikitext_to_paragraphs(raw.text, wiki.site, wiki.dropped_sections)
    else:
        text, boilerplate = strip_gutenberg(raw.text)
        blocks = paragraphs(decode_entities(text))
    sentences, split = [], 0
    for sentence in split_sentences("\n\n".join(blocks), language):
        if len(sentence) > cfg.max_sentence_chars:
            split += 1
            sentences.extend(split_long(sentence, cfg.max_sentence_chars))
        else:
            sentences.append(sentence)
    if not sentences:
        return Dropped("empty")
    if len(sentences) < cfg.min_sentences:
        return Dropped("too_few_sentences")
    chars = sum(map(len, sentences))
    if chars < cfg.min_chars:
        return Dropped("too_few_chars")
    return Cleaned(title=raw.title, sentences=sentences, chars=chars, long_sentences_split=split, boilerplate_chars=boilerplate)
