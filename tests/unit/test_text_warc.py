"""WARC and WET records -> documents, on the shipped web sample (real pages written to WARC by
warcio): HTML kept with its URL, date and media type, other records counted, damaged
records counted and skipped, and gzip member ranges that tile a file read each record once."""

from __future__ import annotations

import gzip
import importlib.util
import io
import re
from pathlib import Path

import pytest

from bertcore.sample_data import WEB_DATA
from bertcore.text.gzmembers import GzipMembers, per_record
from bertcore.text.html import main_text_lines
from bertcore.text.records import ReadStats, detect_format, iter_raw_documents

WARC = WEB_DATA / "sample.warc.gz"
WET = WEB_DATA / "sample.wet.gz"
TAG = re.compile(r"</?[A-Za-z][^>]{0,200}>|<!--|-->")
BUILD = Path(__file__).resolve().parents[1] / "support" / "web_sample" / "build_sample.py"
PAGE = "https://www.horizont.net/marketing/kommentare/"  # a German news page, and where its URL starts


def sample_build():
    """tests/support/web_sample/build_sample.py: which page is which (URL, language, kind; pages.tsv)."""
    spec = importlib.util.spec_from_file_location("build_sample", BUILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(stream, name="sample.warc.gz"):
    stats = ReadStats()
    return list(iter_raw_documents(stream, "auto", name=name, stats=stats)), stats


def members(data: bytes, start=0, stop=None):
    raw = io.BytesIO(data)
    raw.seek(start)
    return GzipMembers(raw, start, stop)


def test_format_is_inferred_from_the_name_or_the_first_bytes():
    for name in ("crawl.warc.gz", "crawl.warc", "CC-MAIN-0001.warc.wet.gz", "x.wet"):
        assert detect_format(name, b"") == "warc"
    assert detect_format("download.bin", b"WARC/1.0\r\nWARC-Type: warcinfo\r\n") == "warc"


def test_pages_become_documents_with_their_metadata():
    documents, stats = read(members(WARC.read_bytes()))
    counts = stats.extra["warc"]
    pages = sample_build().table()
    assert len(documents) == counts["documents"] == len(pages) == 82
    # the crawl's other records are counted by kind, never documents
    assert counts["request"] == 82 and counts["warcinfo"] == 1 and counts["metadata"] == 1
    assert counts["http_3xx"] == 1 and counts["http_4xx"] == 1 and counts["other_media"] == 1
    assert counts["records"] == 82 * 2 + 5 and not counts["malformed"]
    assert sorted(d.url for d in documents) == sorted(p.url for p in pages)
    page = next(d for d in documents if d.url.startswith(PAGE))
    assert page.markup == "html" and page.content_type == "text/html"
    assert page.crawl_date.startswith("2024-03-15T10:") and page.title == page.url
    lines = main_text_lines(page.text)
    assert "Was sich nach dem Vreni-Frost-Urteil ändert (und ändern muss)" in lines  # the headline
    text = "\n".join(lines)
    assert "dataLayer" in page.text and "googletag" in page.text  # its scripts ...
    assert "dataLayer" not in text and "googletag" not in text and not TAG.search(text)  # ... are not text
    assert page.text.count("Agenturen") == 5 and "Agenturen" not in text  # nor is its menu
    # character sets: the pages' declared or detected encodings give text, not mojibake
    german = {p.url for p in pages if p.language == "de"}
    for document in documents:
        if document.url in german and "naturgruen" not in document.url:  # that one mixes Latin-1 into UTF-8
            assert "\ufffd" not in document.text and "Ã¤" not in document.text, document.url


def test_a_plain_warc_gives_the_same_documents():
    plain = gzip.decompress(WARC.read_bytes())
    from_plain, _ = read(io.BytesIO(plain), "sample.warc")
    from_members, _ = read(members(WARC.read_bytes()))
    assert [(d.url, d.text) for d in from_plain] == [(d.url, d.text) for d in from_members]


@pytest.mark.parametrize("cuts", [(0.5,), (0.1, 0.11, 0.5, 0.9), tuple(i / 7 for i in range(1, 7))])
def test_member_ranges_that_tile_the_file_read_every_record_once(cuts):
    data = WARC.read_bytes()
    whole, _ = read(members(data))
    bounds = [0, *(int(c * len(data)) for c in cuts), None]
    pieces = []
    for start, stop in zip(bounds, bounds[1:]):
        documents, _ = read(members(data, start, stop))
        pieces += documents
    assert [(d.offset, d.url) for d in pieces] == [(d.offset, d.url) for d in whole]


def test_a_damaged_member_is_counted_and_skipped():
    data = bytearray(WARC.read_bytes())
    whole, _ = read(members(bytes(data)))
    target = whole[10]  # a page's response record: damage the middle of its deflate data
    at = target.offset + 200
    data[at : at + 16] = bytes(16)
    documents, stats = read(members(bytes(data)))
    assert stats.extra["warc"]["malformed"] == 1
    assert [d.url for d in documents] == [d.url for d in whole if d.offset != target.offset]
    assert per_record(WARC.read_bytes()[: 1 << 16])


def test_a_plain_warc_with_a_broken_header_goes_on_at_the_next_record():
    plain = gzip.decompress(WARC.read_bytes())
    whole, _ = read(io.BytesIO(plain), "sample.warc")
    # the record after the 5th document loses its Content-Length: skipped up to the next record
    at = plain.index(b"Content-Length", whole[5].offset + 10)
    broken = plain[:at] + b"Content-Lxngth" + plain[at + 14 :]
    documents, stats = read(io.BytesIO(broken), "sample.warc")
    assert stats.extra["warc"]["malformed"] == 1
    assert len(documents) >= len(whole) - 2 and documents[-1].url == whole[-1].url
    # a file cut inside a record keeps the records before it and counts the cut one
    documents, stats = read(io.BytesIO(plain[: whole[20].offset + 500]), "sample.warc")
    assert len(documents) == 20 and stats.truncated_records == 1


def test_wet_conversion_records_are_plain_text():
    documents, stats = read(members(WET.read_bytes()), "sample.wet.gz")
    assert len(documents) == 82 and stats.extra["warc"]["conversion"] == 0  # conversion records are documents
    assert all(d.markup == "plain" and d.content_type == "text/plain" and d.url for d in documents)
    page = next(d for d in documents if d.url.startswith(PAGE))
    assert "Kammergericht Berlin" in page.text and not TAG.search(page.text)
    assert "• Agenturen" in page.text  # WET text is the whole page, its menu included
