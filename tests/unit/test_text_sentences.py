"""Sentence splitting with sentencex, English and Korean."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bertcore.text.sentences import split_sentences

KOLAW = Path(importlib.util.find_spec("konlpy").submodule_search_locations[0]) / "data" / "corpus" / "kolaw"


def test_english_sentences_abbreviations_and_paragraphs():
    text = (
        "Mr. Smith went to Washington. He arrived at 5 p.m. on Monday!\n"
        "This line is hard\nwrapped here.\n\n  Second   paragraph? Yes.\n\n\n"
    )
    assert split_sentences(text, "en") == [
        "Mr. Smith went to Washington.",
        "He arrived at 5 p.m. on Monday!",
        "This line is hard wrapped here.",
        "Second paragraph?",
        "Yes.",
    ]


def test_a_sentence_never_spans_a_paragraph_break():
    # Without the blank line sentencex would not split here (no terminal punctuation).
    assert split_sentences("A heading without a full stop\n\nThe body starts here.", "en") == [
        "A heading without a full stop",
        "The body starts here.",
    ]


def test_korean_sentences():
    assert split_sentences("오늘은 날씨가 좋다. 내일은 비가 온다고 한다.", "ko") == [
        "오늘은 날씨가 좋다.",
        "내일은 비가 온다고 한다.",
    ]
    assert split_sentences("서울은 한국의 수도입니다. 인구가 많습니까? 네, 많아요!", "ko") == [
        "서울은 한국의 수도입니다.",
        "인구가 많습니까?",
        "네, 많아요!",
    ]


def test_korean_constitution():
    text = (KOLAW / "constitution.txt").read_text(encoding="utf-8")
    sentences = split_sentences(text, "ko")
    assert len(sentences) > 300
    assert "②대한민국의 주권은 국민에게 있고, 모든 권력은 국민으로부터 나온다." in sentences
    assert all(s and "\n" not in s and s == s.strip() for s in sentences)


def test_sentences_are_normalized_and_empty_dropped():
    assert split_sentences("\x00 \u200b \n\n Caf\u0065\u0301 is\u00a0open.  ", "en") == ["Café is open."]
    assert split_sentences("   \n\n \t ", "en") == []


def test_unknown_language_falls_back():
    assert split_sentences("First one. Second one.", "xx") == ["First one.", "Second one."]


DIALOGUE = (
    '"If we can persuade your father to all this," said Lady Russell, looking over her paper, "much may be done. '
    "If he will adopt these regulations, in seven years he will be clear. What will he be doing, in fact, "
    "but what very "
    "many of our first families have done, or ought to do? There will be nothing singular in his case. Mr. Shepherd "
    'agrees with me, and so does Dr. Grant." She laid the paper down. "Well!" cried Anne, and went out.'
)


def test_dialogue_is_split_at_the_sentence_ends_inside_its_quotes():
    # sentencex alone keeps the quoted speech whole: one segment of four sentences
    assert any(len(s) > 300 for s in split_sentences(DIALOGUE, "en", quote_split_chars=0))
    assert split_sentences(DIALOGUE, "en") == [
        '"If we can persuade your father to all this," said Lady Russell, looking over her paper, "much may be done.',
        "If he will adopt these regulations, in seven years he will be clear.",
        "What will he be doing, in fact, but what very many of our first families have done, or ought to do?",
        "There will be nothing singular in his case.",
        'Mr. Shepherd agrees with me, and so does Dr. Grant."',  # abbreviations stay sentencex's business
        "She laid the paper down.",
        '"Well!" cried Anne, and went out.',  # a lower-case word after the quote: the sentence goes on
    ]


def test_short_quoted_segments_keep_sentencex_choice():
    text = "'Stop. Now.' he said, and the horses stopped."
    assert split_sentences(text, "en") == split_sentences(text, "en", quote_split_chars=0)
