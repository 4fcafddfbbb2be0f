"""Wikis in any language: namespace names from the dump's <siteinfo>, back matter per
language, indented tables, and templates whose text is part of the sentence."""

from __future__ import annotations

import io

import pytest

from bertcore.text.clean import Cleaned, Wiki, clean_document
from bertcore.text.config import CorpusConfig
from bertcore.text.records import ReadStats, iter_raw_documents
from bertcore.text.wikisite import SiteInfo, back_matter_titles
from bertcore.text.wikitemplates import render, split_arguments
from bertcore.text.wikitext import wikitext_to_paragraphs

VI_SITEINFO = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" xml:lang="vi">
  <siteinfo>
    <sitename>Wikipedia</sitename>
    <dbname>viwiki</dbname>
    <base>https://vi.wikipedia.org/wiki/Trang_Ch%C3%ADnh</base>
    <namespaces>
      <namespace key="-2" case="first-letter">Phương tiện</namespace>
      <namespace key="0" case="first-letter" />
      <namespace key="6" case="first-letter">Tập tin</namespace>
      <namespace key="10" case="first-letter">Bản mẫu</namespace>
      <namespace key="14" case="first-letter">Thể loại</namespace>
    </namespaces>
  </siteinfo>
"""

HANOI = """'''Hà Nội''' là thủ đô của nước [[Việt Nam]]. \
[[Tập tin:Hanoi skyline.jpg|nhỏ|260x260px|Toàn cảnh [[Hà Nội]] nhìn từ trên cao]]
Thành phố nằm bên bờ [[sông Hồng]], cách biển khoảng {{convert|100|km}}. Dân số năm 2019 là hơn tám triệu người.

== Lịch sử ==
Thăng Long được chọn làm kinh đô từ năm 1010. Tên Hà Nội có từ năm 1831.
:{| class="wikitable"
|-
! colspan="2" | Năm !! Dân số
|-
| 1999 || 2.672.122
|}

== Tham khảo ==
{{tham khảo}}
* Sách về lịch sử Hà Nội.

== Liên kết ngoài ==
* [https://hanoi.gov.vn Cổng thông tin]

[[Thể loại:Thủ đô châu Á]]
[[Thể loại:Hà Nội]]"""


def page(title: str, text: str, page_id: int) -> str:
    escaped = text.replace("&", "&amp;").replace("<", "&lt;")
    return (
        f"<page><title>{title}</title><ns>0</ns><id>{page_id}</id><revision><id>{page_id}</id>"
        f"<text>{escaped}</text></revision></page>\n"
    )


@pytest.fixture
def vi_dump() -> bytes:
    return (VI_SITEINFO + page("Hà Nội", HANOI, 1) + "</mediawiki>\n").encode()


def test_vietnamese_dump_uses_its_own_namespace_and_section_names(vi_dump):
    stats = ReadStats()
    (raw,) = list(iter_raw_documents(io.BytesIO(vi_dump), "auto", name="viwiki.xml", stats=stats))
    site = stats.header
    assert site.language == "vi" and site.key("Tập tin") == 6 and site.key("thể  loại") == 14
    cfg = CorpusConfig(inputs=["x"], min_chars=0)
    result = clean_document(raw, cfg, "vi", Wiki.of(cfg, "vi", site))
    assert isinstance(result, Cleaned)
    text = " ".join(result.sentences)
    assert result.sentences[0] == "Hà Nội là thủ đô của nước Việt Nam."
    assert "cách biển khoảng 100 kilometres" in text  # {{convert}} keeps its words
    for leaked in (
        "nhỏ",
        "260x260px",
        "Toàn cảnh",
        "Thể loại",
        "Thủ đô châu Á",
        "colspan",
        "wikitable",
        "|-",
        "Sách về",
        "Cổng thông tin",
    ):
        assert leaked not in text, leaked
    assert "Thăng Long được chọn làm kinh đô từ năm 1010." in result.sentences


def test_without_siteinfo_an_english_default_applies_and_the_site_language_adds_its_titles():
    english = wikitext_to_paragraphs("Prose here.\n== References ==\nA citation.\n== Tham khảo ==\nMore.")
    assert english == ["Prose here.", "More."]
    both = back_matter_titles(["en", "vi"])
    assert {"references", "tham khảo", "liên kết ngoài"} <= both
    assert back_matter_titles(["de"], {"de": ["Quellen"]}) == frozenset(
        {"quellen"}
    )  # a configured list replaces the built-in one
    for language in ("en", "ko", "vi", "de", "fr", "ja", "zh", "bg"):
        assert back_matter_titles([language]), language


def test_localized_file_and_category_links_from_any_siteinfo():
    site = SiteInfo.from_xml(
        b'<siteinfo><dbname>bgwiki</dbname><namespaces><namespace key="6">\xd0\xa4\xd0\xb0\xd0\xb9\xd0\xbb</namespace>'
        b'<namespace key="14">\xd0\x9a\xd0\xb0\xd1\x82\xd0\xb5\xd0\xb3\xd0\xbe\xd1\x80\xd0\xb8\xd1\x8f</namespace>'
        b"</namespaces></siteinfo>"
    )
    text = "София е столица.[[Файл:Sofia.jpg|мини|Изглед]] Тя е голям град.\n[[Категория:Столици]]"
    assert wikitext_to_paragraphs(text, site) == ["София е столица. Тя е голям град."]
    assert site.language == "bg"
    # canonical English names work on every wiki
    assert wikitext_to_paragraphs("A [[File:x.png|thumb|caption]] b. [[Category:Y]]", site) == ["A b."]


def test_indented_and_nested_tables_are_removed():
    text = (
        "Before the table.\n:{| class=wikitable\n|-\n| colspan=2 | cell\n|-\n|\n{| \n| inner\n|}\n|}\n::{|\n| "
        "more\n|}\nAfter the table."
    )
    assert wikitext_to_paragraphs(text) == ["Before the table. After the table."]


@pytest.mark.parametrize(
    ("template", "shown"),
    [
        ("convert|5|km|mi", "5 kilometres"),
        ("convert|5|km|mi|abbr=on", "5 km"),
        ("cvt|3|to|7|ft", "3 to 7 feet"),
        ("lang|fr|la vie en rose", "la vie en rose"),
        ("lang-de|Weltanschauung", "Weltanschauung"),
        ("nihongo|Tokyo|東京|Tōkyō", "Tokyo (東京, Tōkyō)"),
        ("nowrap|[[New York|NYC]] area", "[[New York|NYC]] area"),
        ("birth date and age|1961|8|4", "4 August 1961"),
        ("circa|1900", "c. 1900"),
        ("frac|3|1|2", "3 1/2"),
        ("cite web|url=http://x|title=Not prose", ""),
        ("Infobox person|name=X", ""),
    ],
)
def test_inline_templates_keep_their_visible_text(template, shown):
    assert render(template) == shown


def test_inline_templates_inside_sentences():
    text = (
        "The road is {{convert|12|km|mi}} long and was built {{circa|1850}}. The word {{lang|de|Heimat}} has no "
        "English equal.{{citation needed}}"
    )
    assert wikitext_to_paragraphs(text) == [
        "The road is 12 kilometres long and was built c. 1850. The word Heimat has no English equal."
    ]
    assert split_arguments("nowrap|[[a|b]]|x=1") == ("nowrap", ["[[a|b]]"], {"x": "1"})
