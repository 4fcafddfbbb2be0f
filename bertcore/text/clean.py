"""One raw document -> its sentences, or the reason it is dropped."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

from bertcore.text.books import paragraphs, split_long, strip_gutenberg
from bertcore.text.config import CorpusConfig
from bertcore.text.html import main_text_lines, strip_bullet
from bertcore.text.quality import FILTERS
from bertcore.text.records import RawDocument
from bertcore.text.screen import Screen
from bertcore.text.sentences import split_sentences
from bertcore.text.wikisite import SiteInfo, back_matter_titles
from bertcore.text.wikitext import is_disambiguation, wikitext_to_paragraphs

DROP_REASONS = (
    "non_article",
    "redirect",
    "too_long",
    "disambiguation",
    "language",
    *FILTERS,
    "empty",
    "too_few_sentences",
    "too_few_chars",
)
SAMPLE_CHARS = 600
"""Characters of a dropped document (or of a filter's removed lines) kept as its sample."""

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
    # What is known about the document beside its text (equality compares the text only):
    language: str = field(default="", compare=False)
    """Detected language (ISO 639-1), "" when not detected."""
    language_score: float = field(default=0.0, compare=False)
    url: str = field(default="", compare=False)
    crawl_date: str = field(default="", compare=False)
    content_type: str = field(default="", compare=False)
    removed: dict[str, list[str]] = field(default_factory=dict, compare=False)
    """Per quality filter: the lines it removed from this document."""


@dataclass(frozen=True)
class Dropped:
    reason: str  # one of DROP_REASONS
    rule: str = field(default="", compare=False)
    """Which rule of the filter (word_count, curly_braces, ...), or the detected language."""
    detail: str = field(default="", compare=False)
    """The measured value against its bound."""
    chars: int = field(default=0, compare=False)
    """Characters of the document when it was dropped (its raw text before extraction)."""
    text: str = field(default="", compare=False)
    """Its first SAMPLE_CHARS characters, as the filter saw them."""
    language: str = field(default="", compare=False)
    language_score: float = field(default=0.0, compare=False)


def _dropped(reason: str, text: str, **more) -> Dropped:
    return Dropped(reason, chars=len(text), text=text[:SAMPLE_CHARS], **more)


def decode_entities(text: str) -> str:
    """HTML character references in plain text decoded (&amp; -> &, &#233; -> é)."""
    return _ENTITY.sub(lambda m: html.unescape(m.group(0)), text) if "&" in text else text


def clean_document(
    raw: RawDocument, cfg: CorpusConfig, language: str, wiki: Wiki | None = None, screen: Screen | None = None
) -> Cleaned | Dropped:
    """Sentences of an article, plain document or web page, or why it is dropped.

    The cheap checks come first, in this order: namespace, redirect, length (before any
    parsing, so one huge record costs no parse time), disambiguation; then wikitext is
    reduced to paragraphs (`wiki`: the wiki's names, default English), a web page to the
    lines of its main text, plain text has its licence boilerplate removed, entities
    decoded and hard wraps undone; the language is identified and the quality filters run
    (`screen`, default from `cfg`); paragraphs are split into sentences in the detected
    language (or the input's), sentences over `max_sentence_chars` are cut, and the
    minimum sentence count and character count are applied.
    """
    if raw.namespace != 0:
        return _dropped("non_article", raw.text)
    is_wiki = raw.markup == "wikitext"
    if raw.redirect or (is_wiki and raw.text.lstrip()[:16].lower().startswith(_REDIRECT_PREFIXES)):
        return _dropped("redirect", raw.text)
    if len(raw.text) > cfg.max_doc_chars:
        return Dropped("too_long", chars=len(raw.text), text=raw.text[:SAMPLE_CHARS])
    if is_wiki and cfg.drop_disambiguation and is_disambiguation(raw.text):
        return _dropped("disambiguation", raw.text)
    boilerplate = 0
    if is_wiki:
        wiki = wiki or Wiki.of(cfg, language, None)
        blocks = wikitext_to_paragraphs(raw.text, wiki.site, wiki.dropped_sections)
    elif raw.markup == "html":
        blocks = main_text_lines(raw.text)
    else:
        text, boilerplate = strip_gutenberg(raw.text)
        blocks = paragraphs(decode_entities(text))
    screen = screen or Screen.of(cfg)
    verdict = screen.judge(blocks, language, web=bool(raw.url))
    if verdict.dropped:
        return Dropped(
            verdict.dropped,
            verdict.rule,
            verdict.detail,
            sum(map(len, blocks)),
            "\n".join(blocks)[:SAMPLE_CHARS],
            verdict.language,
            verdict.language_score,
        )
    blocks = [strip_bullet(line) for line in verdict.lines] if raw.markup == "html" else verdict.lines
    sentences, split = [], 0
    split_language = screen.split_language(verdict, language, screen.threshold)
    for sentence in split_sentences("\n\n".join(blocks), split_language, cfg.quote_split_chars):
        if len(sentence) > cfg.max_sentence_chars:
            split += 1
            sentences.extend(split_long(sentence, cfg.max_sentence_chars))
        else:
            sentences.append(sentence)
    kept = {"language": verdict.language, "language_score": verdict.language_score}
    if not sentences:
        return _dropped("empty", "\n".join(blocks), **kept)
    if len(sentences) < cfg.min_sentences:
        return _dropped("too_few_sentences", "\n".join(sentences), **kept)
    chars = sum(map(len, sentences))
    if chars < cfg.min_chars:
        return _dropped("too_few_chars", "\n".join(sentences), **kept)
    web = {"url": raw.url, "crawl_date": raw.crawl_date, "content_type": raw.content_type}
    return Cleaned(
        title=raw.title,
        sentences=sentences,
        chars=chars,
        long_sentences_split=split,
        boilerplate_chars=boilerplate,
        removed=verdict.removed,
        **web,
        **kept,
    )
