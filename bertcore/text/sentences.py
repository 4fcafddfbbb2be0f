"""Paragraphs -> sentences with sentencex (rule-based, many languages, Korean included)."""

from __future__ import annotations

import re

import sentencex

from bertcore.text.normalize import normalize_text

_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n\s*")  # one or more blank (or blank-looking) lines


def split_sentences(text: str, language: str) -> list[str]:
    """The sentences of `text` in order, each normalized (`normalize_text`, one line).

    Paragraphs (separated by blank lines) are segmented separately, so a sentence never
    spans a paragraph break; single line breaks inside a paragraph are hard wraps, not
    boundaries. `language` is an ISO 639-1 code; sentencex falls back to its generic
    rules for a language it has none for. sentencex 1.x is a stateless Rust function,
    so there is no per-language segmenter object to cache.
    """
    sentences: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        if not paragraph or paragraph.isspace():
            continue
        for piece in sentencex.segment(language, paragraph.replace("\n", " ")):
            sentence = normalize_text(piece, keep_newlines=False)
            if sentence:
                sentences.append(sentence)
    return sentences
