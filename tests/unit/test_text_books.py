"""Book text as files print it: a Project Gutenberg-style file (licence header and footer,
hard-wrapped prose, verse, a table of contents), written here, and what the cleaner makes
of it."""

from __future__ import annotations

import textwrap

import pytest

from bertcore.text.books import paragraphs, split_long, strip_gutenberg
from bertcore.text.clean import Cleaned, clean_document, decode_entities
from bertcore.text.config import CorpusConfig
from bertcore.text.records import RawDocument

HEADER = """The Project Gutenberg eBook of The Lighthouse Keeper, by Margaret Hale

This eBook is for the use of anyone anywhere in the United States and
most other parts of the world at no cost and with almost no restrictions
whatsoever. You may copy it, give it away or re-use it under the terms
of the Project Gutenberg License included with this eBook or online at
www.gutenberg.org.

Title: The Lighthouse Keeper

Author: Margaret Hale

Release Date: March 3, 2004 [eBook #11467]

Language: English

*** START OF THE PROJECT GUTENBERG EBOOK THE LIGHTHOUSE KEEPER ***




Produced by a volunteer.



CONTENTS

  I. The Storm
  II. The Boat
  III. The Letter
  IV. The Return
"""

PROSE = [
    (
        "The storm came in from the west on the third night of November, and by the time the "
        "lamp was lit the waves were already breaking over the lower rocks. Thomas Reid had kept "
        "the light for eleven years, and in all that time he had never seen the sea so grey or the "
        "sky so close to it."
    ),
    (
        "He climbed the hundred and twelve steps twice before midnight to trim the wick, and each "
        "time he stopped at the small window on the landing to look for the lights of the fishing "
        "boats that had gone out that morning. There were none."
    ),
    (
        "His daughter had written in the spring to say that she would come home before the winter, "
        "but the mail boat had not called for three weeks, and he had begun to think that the letter "
        "he had sent in reply had never left the island."
    ),
]

VERSE = """    The sea is calm to-night,
    The tide is full, the moon lies fair
    Upon the straits; on the French coast the light
    Gleams and is gone"""

FOOTER = """
*** END OF THE PROJECT GUTENBERG EBOOK THE LIGHTHOUSE KEEPER ***

Updated editions will replace the previous one--the old editions will
be renamed.

Section 1. General Terms of Use and Redistributing Project Gutenberg
electronic works

1.A. By reading or using any part of this Project Gutenberg electronic
work, you indicate that you have read, understand, agree to and accept
all the terms of the Full Project Gutenberg License.
"""


def book(width: int = 72, double_spaced: bool = False) -> str:
    wrapped = ["\n".join(textwrap.wrap(p, width)) for p in PROSE]
    body = "\n\nCHAPTER I.\nThe Storm\n\n\n" + "\n\n".join(wrapped[:2]) + "\n\n" + VERSE + "\n\n" + wrapped[2] + "\n"
    if double_spaced:
        body = "\n\n\n".join("\n\n".join(textwrap.wrap(p, width)) for p in PROSE)
    return HEADER + body + FOOTER


def test_gutenberg_header_and_licence_are_removed():
    text, removed = strip_gutenberg(book())
    assert "Project Gutenberg" not in text and "eBook" not in text
    assert text.lstrip().startswith("Produced by") and removed > len(HEADER) // 2
    assert strip_gutenberg("Plain text about gutenberg presses.") == ("Plain text about gutenberg presses.", 0)


@pytest.mark.parametrize("width", [60, 72, 78])
def test_hard_wrapped_prose_becomes_paragraphs_and_verse_keeps_its_lines(width):
    found = paragraphs(strip_gutenberg(book(width))[0])
    for prose in PROSE:
        assert prose in found  # every wrapped paragraph joined back, exactly
    for line in VERSE.splitlines():
        assert line.strip() in found  # a verse line ends on purpose: it stays a line
    assert "I. The Storm" in found and "II. The Boat" in found  # contents entries are not run together


def test_double_spaced_file_is_unwrapped_too():
    found = paragraphs(strip_gutenberg(book(double_spaced=True))[0])
    assert [p for p in found if len(p) > 100] == PROSE


def test_text_that_is_not_hard_wrapped_keeps_one_paragraph_per_line():
    text = "\n".join(PROSE)  # one paragraph per line, no blank lines
    assert paragraphs(text) == PROSE


def test_long_sentences_are_cut_at_clause_marks_then_spaces():
    sentence = "; ".join(f"clause number {i} of a list that never ends" for i in range(60))
    pieces = split_long(sentence, 300)
    assert all(len(p) <= 300 for p in pieces) and len(pieces) >= len(sentence) // 300
    assert all(p.endswith(";") for p in pieces[:-1])
    assert " ".join(pieces) == sentence
    words = " ".join(["word"] * 500)
    assert all(len(p) <= 120 for p in split_long(words, 120)) and " ".join(split_long(words, 120)) == words
    assert split_long("x" * 250, 100) == ["x" * 100, "x" * 100, "x" * 50]


def test_a_gutenberg_book_cleans_into_real_sentences():
    cfg = CorpusConfig(inputs=["x"], min_chars=0, max_sentence_chars=400)
    toc = "\n".join(
        f"  {i}. A chapter title without a full stop" for i in range(200)
    )  # one run-on "sentence" otherwise
    raw = RawDocument(
        title="keeper.txt", text=book().replace("CONTENTS\n", "CONTENTS\n" + toc + "\n"), markup="plain", offset=0
    )
    result = clean_document(raw, cfg, "en")
    assert isinstance(result, Cleaned)
    text = " ".join(result.sentences)
    assert "Gutenberg" not in text and "License" not in text
    assert max(map(len, result.sentences)) <= 400
    assert "There were none." in result.sentences
    assert (
        "He climbed the hundred and twelve steps twice before midnight to trim the wick, and each time he "
        "stopped at the small window on the landing to look for the lights of the fishing boats that had "
        "gone out that morning."
    ) in result.sentences
    assert result.boilerplate_chars > 0


def test_html_entities_in_plain_text():
    assert decode_entities("Fish &amp; chips &#8212; &eacute;t&eacute; &#x41;") == "Fish & chips — été A"
    assert decode_entities("R&D and AT&T &para") == "R&D and AT&T &para"  # no semicolon: left as written
