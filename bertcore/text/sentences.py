"""Paragraphs -> sentences with sentencex (rule-based, many languages, Korean included).

sentencex does not end a sentence inside quotation marks, so a paragraph of dialogue
("If we can persuade your father to all this," said Lady Russell, "much may be done. If he
will adopt these regulations, ...") comes out as one segment of several sentences: in
novels, 1.2% of segments ran over 600 characters. A segment longer than `quote_split_chars`
is segmented again with its quotation marks hidden (each replaced by a space, so offsets
stay put), which lets sentencex's own rules (abbreviations, numbers, its language's
sentence ends) find the sentence ends inside the quotes; the segment is cut there, an
opening quotation mark staying with the sentence it opens, but not before a lower-case
word ("Yes!" he cried: the sentence goes on). Shorter segments keep
sentencex's choice ("'Stop. Now.' he said." stays one sentence).
"""

from __future__ import annotations

import re

import sentencex

from bertcore.text.normalize import normalize_text

_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n\s*")  # one or more blank (or blank-looking) lines
_QUOTES = re.compile("[\"'\u201c\u201d\u201e\u00ab\u00bb\u2039\u203a\u2018\u2019\u300c\u300d\u300e\u300f]")
_OPENING = frozenset("\"'\u201c\u201e\u00ab\u2039\u2018\u300c\u300e")
QUOTE_SPLIT_CHARS = 300


def split_in_quotes(segment: str, language: str) -> list[str]:
    """`segment` cut at the sentence ends sentencex finds once its quotation marks are
    hidden; [segment] when there are none."""
    masked = _QUOTES.sub(" ", segment)
    cuts, at = [0], 0
    for piece in sentencex.segment(language, masked):
        piece = piece.strip()
        if not piece:
            continue
        start = masked.find(piece, at)
        if start < 0:
            return [segment]  # sentencex changed the text: keep the segment whole
        at = start + len(piece)
        before = segment[cuts[-1] : start]
        if not _QUOTES.sub("", before).strip() or piece[0].islower():
            continue  # only quotation marks before it, or a sentence going on after a quote ("Yes!" he cried)
        while start - 1 > cuts[-1] and segment[start - 1] in _OPENING:
            start -= 1  # the quotation mark that opens this sentence belongs to it
        cuts.append(start)
    pieces = [segment[a:b].strip() for a, b in zip(cuts, [*cuts[1:], len(segment)])]
    return [p for p in pieces if p] or [segment]


def split_sentences(text: str, language: str, quote_split_chars: int = QUOTE_SPLIT_CHARS) -> list[str]:
    """The sentences of `text` in order, each normalized (`normalize_text`, one line).

    Paragraphs (separated by blank lines) are segmented separately, so a sentence never
    spans a paragraph break; single line breaks inside a paragraph are hard wraps, not
    boundaries. `language` is an ISO 639-1 code; sentencex falls back to its generic
    rules for a language it has none for. A segment over `quote_split_chars` characters is
    cut at the sentence ends inside its quotes (0: never). sentencex 1.x is a stateless
    Rust function, so there is no per-language segmenter object to cache.
    """
    sentences: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        if not paragraph or paragraph.isspace():
            continue
        for segment in sentencex.segment(language, paragraph.replace("\n", " ")):
            overlong = quote_split_chars and len(segment) > quote_split_chars
            pieces = split_in_quotes(segment, language) if overlong else [segment]
            for piece in pieces:
                sentence = normalize_text(piece, keep_newlines=False)
                if sentence:
                    sentences.append(sentence)
    return sentences
