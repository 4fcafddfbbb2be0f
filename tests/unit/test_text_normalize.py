"""normalize_text: the character cleaning every sentence goes through."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from bertcore.text.normalize import normalize_text


def test_drops_invisible_characters_and_collapses_whitespace():
    s = "  Hello\x00 \u200bwor\u00adld\ufffd!\t\tBye\u00a0\u3000now \ufeff "
    assert normalize_text(s) == "Hello world! Bye now"


def test_whitespace_controls_separate_words_instead_of_gluing_them():
    assert normalize_text("a\tb\x0bc\x1fd\x85e", keep_newlines=False) == "a b c d e"


def test_lines_are_kept_or_folded():
    s = "  first   line \r\n\n second\u2028third  \n"
    assert normalize_text(s) == "first line\n\nsecond\nthird"
    assert normalize_text(s, keep_newlines=False) == "first line second third"


def test_nfc_composes_including_hangul():
    decomposed = unicodedata.normalize("NFD", "Café 한국어")
    assert decomposed != "Café 한국어"
    assert normalize_text(decomposed) == "Café 한국어"
    # A format character between a base letter and its combining accent is dropped first.
    assert normalize_text("e\u200d\u0301") == "é"


@given(st.text())
def test_properties(s):
    once = normalize_text(s)
    assert normalize_text(once) == once
    assert once == once.strip()
    assert unicodedata.is_normalized("NFC", once)
    assert "  " not in once and "\t" not in once and "\ufffd" not in once
    assert not any(unicodedata.category(c) in ("Cc", "Cf") for c in once if c != "\n")
    flat = normalize_text(s, keep_newlines=False)
    assert "\n" not in flat and flat == " ".join(once.split())
