"""Wikitext -> prose paragraphs, on real dump markup and on hand-written cases."""

from __future__ import annotations

import bz2
import importlib.util
from pathlib import Path

import pytest

from bertcore.text.records import iter_raw_documents
from bertcore.text.wikitext import is_disambiguation, wikitext_to_paragraphs

DATA = Path(importlib.util.find_spec("gensim").submodule_search_locations[0]) / "test" / "test_data"
ENWIKI = DATA / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
MARKUP_LEFTOVERS = ("{{", "}}", "[[", "]]", "<ref", "</ref", "{|", "|}", "<!--", "&nbsp;", "&amp;", "'''", "__TOC__")


@pytest.fixture(scope="module")
def articles():
    with bz2.open(ENWIKI) as stream:
        return [d for d in iter_raw_documents(stream, "wikipedia") if d.namespace == 0 and not d.redirect]


def text_of(wikitext: str) -> str:
    return "\n\n".join(wikitext_to_paragraphs(wikitext))


def test_anarchism_article(articles):
    anarchism = next(d for d in articles if d.title == "Anarchism")
    paragraphs = wikitext_to_paragraphs(anarchism.text)
    text = "\n\n".join(paragraphs)
    assert paragraphs[0].startswith("Anarchism is a political philosophy that advocates self-governed societies")
    # "[[political philosophy]]", "[[Self-governance|self-governed]]", "[[stateless society|stateless societies]]"
    assert "advocates self-governed societies based on voluntary institutions." in paragraphs[0]
    assert "These are often described as stateless societies" in paragraphs[0]
    # Piped link label, not its target.
    assert "Self-governance" not in paragraphs[0]
    assert "The first political philosopher to call himself an anarchist was Pierre-Joseph Proudhon" in text
    for leftover in MARKUP_LEFTOVERS:
        assert leftover not in text, leftover
    # Section headings are not prose: "== Etymology and terminology ==" heads a section
    # whose body stays.
    assert not any(
        p.strip("= ") in {"Etymology and terminology", "History", "See also", "References"} for p in paragraphs
    )
    assert "The term anarchism is a compound word" in text
    # Category and interlanguage links at the end are gone.
    assert "Category:" not in text and "Anarchism|" not in text
    assert len(text) > 30_000


def test_no_markup_survives_in_any_article(articles):
    for doc in articles:
        text = text_of(doc.text)
        for leftover in MARKUP_LEFTOVERS:
            assert leftover not in text, (doc.title, leftover)
        assert "thumb|" not in text and "px|" not in text, doc.title


def test_templates_including_nested_are_dropped():
    text = text_of("Before {{Infobox|name={{lang|fr|Nom}}|x={{a|{{b|{{c}}}}}}}} after {{cite web|url=http://x.org}}.")
    assert text == "Before after."


def test_refs_are_dropped():
    wikitext = (
        'A fact.<ref name="a">{{cite book|title=Source}} Some ref text.</ref> Another fact.<ref name="a/b" /> '
        "Third.<REF>upper</REF>\n\n<references />"
    )
    assert wikitext_to_paragraphs(wikitext) == ["A fact. Another fact. Third."]


def test_tables_are_dropped_nested_too():
    wikitext = "Intro line.\n{| class=wikitable\n|-\n| cell one || cell two\n|-\n|\n{|\n| inner\n|}\n|}\nOutro line."
    text = text_of(wikitext)
    assert "cell" not in text and "inner" not in text
    assert "Intro line." in text and "Outro line." in text
    html_table = text_of("Before.\n<table><tr><td>cell</td></tr></table>\nAfter.")
    assert "cell" not in html_table and "Before." in html_table and "After." in html_table


def test_links():
    text = text_of(
        "A [[political philosophy]], [[Stateless society|stateless societies]] and [[bus]]es "
        "([[New_York_City]], [[Foo (bar)|]])."
    )
    assert text == "A political philosophy, stateless societies and buses (New York City, Foo (bar))."


def test_link_label_with_markup_goes_through_the_parser():
    assert text_of("See [[Target|the ''italic'' &amp; {{tpl}} label]] here.") == "See the italic & label here."


def test_bold_italic_removed_keeping_words():
    assert text_of("'''Anarchism''' is ''very'' '''''old''''' and it's fine.") == "Anarchism is very old and it's fine."


def test_headings_dropped_section_body_kept():
    paragraphs = wikitext_to_paragraphs(
        "Lead text here.\n\n== History ==\nBody of history.\n=== Early ===\nEarly body."
    )
    assert paragraphs == ["Lead text here.", "Body of history.", "Early body."]


def test_back_matter_sections_dropped_until_the_next_section():
    wikitext = (
        "Lead.\n== History ==\nHistory body.\n== See also ==\n* [[Other topic]]\n"
        "=== Sub ===\nStill back matter.\n== Legacy ==\nLegacy body.\n"
        "== References ==\n{{reflist}}\n== External links ==\n* [http://x.org Site]"
    )
    assert wikitext_to_paragraphs(wikitext) == ["Lead.", "History body.", "Legacy body."]


def test_file_category_and_interlanguage_links_dropped():
    wikitext = (
        "[[File:Flag.svg|thumb|200px|A caption with a [[link]] inside]]Text starts here. "
        "[[Image:Old.png|left]]More text.\n\n[[Category:Political philosophy]]\n[[de:Anarchismus]]\n"
        "[[zh-min-nan:Hui-thóng-tī-chú-gī]]\n[[파일:사진.jpg|섬네일|설명]]\n[[분류:정치 철학]]"
    )
    assert wikitext_to_paragraphs(wikitext) == ["Text starts here. More text."]


def test_visible_category_link_and_interwiki():
    text = text_of("See [[:Category:Philosophy]] and the [[wikt:anarchy|word anarchy]].[[wikt:anarchy]]")
    assert text == "See Category:Philosophy and the word anarchy."


def test_external_links_keep_label_drop_url():
    text = text_of("Visit [http://example.org the site] or [http://example.com] or http://bare.example.net now.")
    assert "the site" in text
    assert "http" not in text and "example" not in text


def test_other_tags_comments_magic_words_entities():
    wikitext = (
        "__TOC__\nEnergy <math>E = mc^2</math> is conserved<!-- a comment -->. "
        "<gallery>\nA.jpg|caption\n</gallery>Keep <small>small</small> <span>words</span>.\n"
        "Caf&eacute; &amp; bar&nbsp;tab &mdash; done.<br/>Next.__NOTOC__"
    )
    text = text_of(wikitext)
    assert "mc^2" not in text and "caption" not in text and "comment" not in text and "__" not in text
    assert "Energy is conserved." in text
    assert "Keep small words." in text
    assert "Café & bar tab — done. Next." in text


def test_list_items_keep_text_each_its_own_paragraph():
    paragraphs = wikitext_to_paragraphs("Intro sentence.\n* First item\n* Second [[item]]\n# Numbered\n: Indented")
    assert paragraphs == ["Intro sentence.", "First item", "Second item", "Numbered", "Indented"]


def test_hard_wrapped_paragraph_joins_lines():
    assert wikitext_to_paragraphs("One line\nwraps here.\n\nNew paragraph.") == [
        "One line wraps here.",
        "New paragraph.",
    ]


@pytest.mark.parametrize(
    "wikitext",
    [
        "'''Alien''' may refer to:\n* [[Alien (law)]]\n{{disambiguation}}",
        "{{Disambig}}",
        "{{ dab |date=May 2020}}",
        "{{hndis|Smith, John}}",
        "{{Geodis}}",
        "{{Place name disambiguation}}",
        "{{Human_name_disambiguation}}",
        "{{동음이의}}",
    ],
)
def test_is_disambiguation(wikitext):
    assert is_disambiguation(wikitext)


@pytest.mark.parametrize(
    "wikitext",
    [
        "An article about [[Mercury (planet)|Mercury]].{{Disambiguation needed|date=May 2020}}",
        "{{Other uses|Mercury (disambiguation)}} Mercury is a planet.",
        "{{Distinguish|Mars}} A normal article.",
    ],
)
def test_not_disambiguation(wikitext):
    assert not is_disambiguation(wikitext)


def test_disambiguation_pages_in_the_dump(articles):
    titles = {d.title for d in articles if is_disambiguation(d.text)}
    assert {"Alien", "Austin (disambiguation)", "Animal (disambiguation)"} <= titles
    assert "Anarchism" not in titles and "Autism" not in titles


def test_unclosed_markup_keeps_text_and_drops_markup():
    paragraphs = wikitext_to_paragraphs(
        "Alpha <ref>unclosed reference text. Beta {{unclosed template. Gamma [[unclosed link. "
        "Delta <math>x^2 Epsilon.\n\nZeta <ref>r</ref name=x> still ref</ref> eta."
    )
    text = "\n\n".join(paragraphs)
    for leftover in ("<ref", "{{", "[[", "<math", "</ref"):
        assert leftover not in text
    assert "Alpha" in text and "Epsilon." in text
    assert paragraphs[-1] == "Zeta eta."


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "unit",
    ["<ref>x ", "<span>x ", "[http://example.org x ", "{{tpl| x ", "[[a|", "<math>x "],
)
def test_hostile_unclosed_markup_does_not_hang(unit):
    # mwparserfromhell is superlinear on unclosed constructs (minutes for this size as
    # one parse); pre-stripping and chunked parsing keep it near linear.
    paragraphs = wikitext_to_paragraphs("Start. " + unit * 40_000 + " End.")
    assert paragraphs[0] == "Start." and paragraphs[-1].endswith("End.")
    text = " ".join(paragraphs)
    assert "<ref" not in text and "{{" not in text and "[[" not in text


def test_long_line_without_breaks_is_kept_whole():
    words = " ".join(f"w{i}" for i in range(5_000))  # ~29 k characters on one line
    assert " ".join(wikitext_to_paragraphs(words)) == words
