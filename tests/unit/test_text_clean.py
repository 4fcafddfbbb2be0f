"""clean_document: raw record -> sentences or a drop reason."""

from __future__ import annotations

import bz2
import collections
import importlib.util
from pathlib import Path

import pytest

from bertcore.text.clean import DROP_REASONS, Cleaned, Dropped, clean_document
from bertcore.text.config import CorpusConfig
from bertcore.text.records import RawDocument, iter_raw_documents

DATA = Path(importlib.util.find_spec("gensim").submodule_search_locations[0]) / "test" / "test_data"
ENWIKI = DATA / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
KOLAW = Path(importlib.util.find_spec("konlpy").submodule_search_locations[0]) / "data" / "corpus" / "kolaw"

PROSE = "The river rises in the hills. It flows east to the sea. Towns grew along its banks over centuries."


def config(**overrides) -> CorpusConfig:
    return CorpusConfig(inputs=["unused.txt"], **overrides)


def wiki(text: str, **kw) -> RawDocument:
    return RawDocument(title="T", text=text, markup="wikitext", offset=0, **kw)


def plain(text: str) -> RawDocument:
    return RawDocument(title="P", text=text, markup="plain", offset=0)


def test_wikipedia_article_becomes_sentences():
    raw = wiki("'''River''' [[Source|rises]] in the hills.<ref>x</ref> It flows east.\n\n== Towns ==\nTowns grew.")
    result = clean_document(raw, config(min_chars=10), "en")
    assert result == Cleaned(
        title="T", sentences=["River rises in the hills.", "It flows east.", "Towns grew."], chars=50
    )


def test_plain_text_paragraphs_become_sentences():
    result = clean_document(
        plain("First paragraph, one sentence.\n\nSecond one. Third one."), config(min_chars=0), "en"
    )
    assert isinstance(result, Cleaned)
    assert result.sentences == ["First paragraph, one sentence.", "Second one.", "Third one."]
    assert result.chars == sum(map(len, result.sentences))


@pytest.mark.parametrize(
    ("raw", "overrides", "reason"),
    [
        (wiki(PROSE, namespace=4), {}, "non_article"),
        (wiki(PROSE, redirect=True), {}, "redirect"),
        (wiki("#REDIRECT [[Elsewhere]]"), {}, "redirect"),
        (wiki("#넘겨주기 [[다른 문서]]"), {}, "redirect"),
        (wiki("'''Mercury''' may refer to:\n* [[Mercury (planet)]]\n{{disambiguation}}"), {}, "disambiguation"),
        (wiki("{{Infobox}}\n[[Category:Empty]]"), {}, "empty"),
        (plain("   \n\n  "), {}, "empty"),
        (plain("Only one sentence here, though it is long enough to pass."), {"min_chars": 0}, "too_few_sentences"),
        (plain("Short. Text."), {"min_chars": 50}, "too_few_chars"),
        (plain(PROSE), {"max_doc_chars": len(PROSE) - 1, "min_chars": 0}, "too_long"),
    ],
)
def test_drop_reasons(raw, overrides, reason):
    assert reason in DROP_REASONS
    assert clean_document(raw, config(**overrides), "en") == Dropped(reason)


def test_length_is_checked_before_parsing():
    # Over the limit and also a disambiguation page: the length check comes first, so
    # the text is never parsed.
    raw = wiki("{{disambiguation}}" + "[[unclosed " * 1000)
    assert clean_document(raw, config(max_doc_chars=1000, min_chars=0), "en") == Dropped("too_long")


def test_disambiguation_kept_when_not_dropped():
    raw = wiki("'''Mercury''' is a planet. It is small.\n{{disambiguation}}")
    result = clean_document(raw, config(drop_disambiguation=False, min_chars=0), "en")
    assert isinstance(result, Cleaned) and result.sentences == ["Mercury is a planet.", "It is small."]


def test_shipped_dump_end_to_end():
    cfg = config()
    with bz2.open(ENWIKI) as stream:
        results = [(raw, clean_document(raw, cfg, "en")) for raw in iter_raw_documents(stream, "wikipedia")]
    reasons = collections.Counter(r.reason if isinstance(r, Dropped) else "kept" for _, r in results)
    assert reasons["redirect"] >= 99 and reasons["non_article"] == 1 and reasons["disambiguation"] >= 5
    assert reasons["kept"] >= 90
    kept = {r.title: r for _, r in results if isinstance(r, Cleaned)}
    anarchism = kept["Anarchism"]
    assert anarchism.sentences[0] == (
        "Anarchism is a political philosophy that advocates self-governed societies based on voluntary institutions."
    )
    for doc in kept.values():
        assert len(doc.sentences) >= cfg.min_sentences and doc.chars >= cfg.min_chars
        for sentence in doc.sentences:
            assert sentence == sentence.strip() and "\n" not in sentence and "  " not in sentence
            assert "[[" not in sentence and "{{" not in sentence


def test_korean_plain_document():
    raw = RawDocument(
        title="constitution",
        text=(KOLAW / "constitution.txt").read_text(encoding="utf-8"),
        markup="plain",
        offset=0,
    )
    result = clean_document(raw, config(), "ko")
    assert isinstance(result, Cleaned)
    assert result.sentences[0] == "대한민국헌법"
    assert "제3조 대한민국의 영토는 한반도와 그 부속도서로 한다." in result.sentences


def test_enormous_record_is_dropped_as_too_long_without_parsing():
    # A 25 M-character single line (the default limit is 20 M): dropped by length alone.
    raw = RawDocument(title="big:1", text="x" * 25_000_000, markup="wikitext", offset=0)
    assert clean_document(raw, config(), "en") == Dropped("too_long")
