"""Readers over decompressed streams: formats, partitioning, and errors that name offsets."""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import io
import json
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertcore.text import reader
from bertcore.text.records import InputError, RawDocument, ReadStats, detect_format, iter_raw_documents

# Sample data shipped in the gensim wheel (found without importing gensim).
DATA = Path(importlib.util.find_spec("gensim").submodule_search_locations[0]) / "test" / "test_data"
ENWIKI = DATA / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
LEE = DATA / "lee_background.cor"


@pytest.fixture(scope="module")
def enwiki_xml() -> bytes:
    return bz2.decompress(ENWIKI.read_bytes())


def read(data: bytes, fmt: str = "auto", name: str = "input", **kw) -> list[RawDocument]:
    return list(iter_raw_documents(io.BytesIO(data), fmt, name=name, **kw))


def read_range(
    data: bytes, fmt: str, start: int, end: int | None, header=None, name: str = "input", **kw
) -> list[RawDocument]:
    """What a task given bytes [start, end) of `data` reads (as pipelines/stages/corpus/pieces.py opens it)."""
    stream = io.BytesIO(data)
    stream.seek(start)
    aligned = start == 0 or data[start - 1 : start] == b"\n"
    return list(iter_raw_documents(stream, fmt, name=name, start=start, end=end, aligned=aligned, header=header, **kw))


def read_in_ranges(data: bytes, fmt: str, n: int, **kw) -> list[list[RawDocument]]:
    """`data` cut into n equal byte ranges, each read on its own (the first one's header is
    handed to the others)."""
    stats = ReadStats()
    cuts = [i * len(data) // n for i in range(n)] + [None]
    first = list(iter_raw_documents(io.BytesIO(data), fmt, end=cuts[1], stats=stats, **kw))
    return [first] + [read_range(data, fmt, a, b, header=stats.header, **kw) for a, b in zip(cuts[1:-1], cuts[2:])]


# ------------------------------------------------------------------------ wikipedia


def test_wikipedia_dump_pages_metadata_and_text():
    with bz2.open(ENWIKI) as stream:
        docs = list(iter_raw_documents(stream, "auto", name=ENWIKI.name))
    assert len(docs) == 206  # every <page>; the <siteinfo> header is not a record
    assert all(d.markup == "wikitext" for d in docs)
    first = docs[0]
    assert (first.title, first.namespace, first.redirect) == ("AccessibleComputing", 0, True)
    assert first.text.startswith("#REDIRECT [[Computer accessibility]]")
    anarchism = next(d for d in docs if d.title == "Anarchism")
    assert not anarchism.redirect
    # XML entities are decoded: the dump stores "&lt;ref&gt;" for "<ref>".
    assert "<ref" in anarchism.text and "&lt;" not in anarchism.text
    assert [d.title for d in docs if d.namespace != 0] == ["Wikipedia:Adding Wikipedia articles to Nupedia"]
    assert sum(d.redirect for d in docs) == 100
    offsets = [d.offset for d in docs]
    assert offsets == sorted(offsets)


def test_wikipedia_offsets_point_at_page_tags(enwiki_xml):
    for doc in read(enwiki_xml)[:20]:
        assert enwiki_xml[doc.offset : doc.offset + 6] == b"<page>"


@pytest.mark.parametrize("n", [2, 3, 7, 40])
def test_byte_ranges_cover_every_page_exactly_once(enwiki_xml, n):
    whole = read(enwiki_xml)
    ranges = read_in_ranges(enwiki_xml, "wikipedia", n)
    assert [d for part in ranges for d in part] == whole
    # a range owns the pages whose <page> tag starts inside it
    cuts = [i * len(enwiki_xml) // n for i in range(n)] + [len(enwiki_xml)]
    for (a, b), part in zip(zip(cuts, cuts[1:]), ranges):
        assert all(a <= d.offset < b for d in part)


def test_a_page_is_parsed_only_by_its_range(enwiki_xml):
    # Break the XML of one page: the range that does not own it skips it without parsing.
    start = enwiki_xml.index(b"<title>Anarchism</title>")
    page_start = enwiki_xml.rindex(b"<page>", 0, start)
    broken = enwiki_xml[:start] + b"<title>Anarchism</titel>" + enwiki_xml[start + 24 :]
    cut = page_start + 100  # the second range starts inside the broken page
    assert len(read_range(broken, "wikipedia", cut, None, header=None)) == 205 - 1
    with pytest.raises(InputError) as err:
        list(iter_raw_documents(io.BytesIO(broken), "wikipedia", end=cut))
    assert page_start <= err.value.offset <= start + 24
    assert f"byte {page_start}" in str(err.value)


@pytest.mark.parametrize("block", [5, 6, 7, 13, 4096])
def test_tags_split_across_read_blocks(enwiki_xml, monkeypatch, block):
    # Tags and lines straddle read blocks at every possible place; records do not change.
    fifth = 0
    for _ in range(5):
        fifth = enwiki_xml.index(b"<page>", fifth + 1)
    head = enwiki_xml[:fifth] + b"</mediawiki>\n"  # the first 4 pages (~240 kB)
    expected = read(head)
    assert len(expected) == 4
    monkeypatch.setattr(reader, "BLOCK", block)
    assert read(head) == expected
    assert [d for part in read_in_ranges(head, "wikipedia", 3) for d in part] == expected
    lines = LEE.read_bytes()[:20_000]
    assert read(lines, "lines", name="lee") == [
        RawDocument(title=f"lee@{o}", text=t, markup="plain", offset=o) for o, t in _line_offsets(lines) if t.strip()
    ]
    assert [d for part in read_in_ranges(lines, "lines", 5, name="lee") for d in part] == read(
        lines, "lines", name="lee"
    )


def _line_offsets(data: bytes):
    offset = 0
    for line in data.split(b"\n"):
        yield offset, line.decode()
        offset += len(line) + 1


def test_wikipedia_full_history_takes_the_last_revision():
    xml = (
        b'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><siteinfo><sitename>W</sitename></siteinfo>'
        b"<page><title>T</title><ns>0</ns><id>1</id>"
        b"<revision><id>1</id><text>old</text></revision>"
        b'<revision><id>2</id><text xml:space="preserve">new &amp; better</text></revision>'
        b"</page></mediawiki>\n"
    )
    (doc,) = read(xml, "wikipedia")
    assert (doc.title, doc.text, doc.namespace, doc.redirect) == ("T", "new & better", 0, False)


def test_dump_without_closing_tag_keeps_its_complete_pages(enwiki_xml):
    whole = read(enwiki_xml)
    cut = len(enwiki_xml) // 2
    last_start = enwiki_xml.rindex(b"<page>", 0, cut)
    stats = ReadStats()
    kept = read(enwiki_xml[:cut], stats=stats)
    assert kept == [d for d in whole if d.offset < last_start]  # every page before the cut one
    assert (stats.truncated_records, stats.truncated_bytes) == (1, cut - last_start)
    # Cut exactly between two pages: no page is lost, only </mediawiki> is missing.
    between = enwiki_xml.index(b"</page>", cut) + len(b"</page>")
    stats = ReadStats()
    assert read(enwiki_xml[:between], stats=stats) == [d for d in whole if d.offset < between]
    assert stats.truncated_records == 0 and stats.extra["complete"] is False
    with pytest.raises(InputError, match="no <page> and no </mediawiki>"):
        read(b"<mediawiki><siteinfo><sitename>W</sitename></siteinfo>", "wikipedia")


def test_unclosed_page_is_malformed(enwiki_xml):
    end = enwiki_xml.index(b"</page>")
    broken = enwiki_xml[:end] + enwiki_xml[end + len(b"</page>") :]
    with pytest.raises(InputError, match="not closed") as err:
        read(broken)
    assert err.value.offset == enwiki_xml.index(b"<page>")


def test_non_utf8_inside_a_page_names_the_byte(enwiki_xml):
    at = enwiki_xml.index(b"Anarchism is a") + len(b"Anarchism ")
    bad = enwiki_xml[:at] + b"\xff" + enwiki_xml[at + 1 :]
    with pytest.raises(InputError, match="UTF-8") as err:
        read(bad)
    assert err.value.offset == at
    assert f"byte {at}" in str(err.value)


def test_truncated_bz2_is_an_input_error(tmp_path):
    compressed = ENWIKI.read_bytes()
    cut = tmp_path / "cut.xml.bz2"
    cut.write_bytes(compressed[: len(compressed) * 2 // 3])
    with bz2.open(cut) as stream, pytest.raises(InputError, match="truncated or corrupt") as err:
        list(iter_raw_documents(stream, "auto", name=str(cut)))
    assert err.value.offset > 0
    assert f"byte {err.value.offset}" in str(err.value) and str(cut) in str(err.value)


def test_corrupt_bz2_is_an_input_error(tmp_path):
    compressed = bytearray(ENWIKI.read_bytes())
    middle = len(compressed) // 2
    compressed[middle : middle + 64] = bytes(64)
    path = tmp_path / "corrupt.xml.bz2"
    path.write_bytes(bytes(compressed))
    with bz2.open(path) as stream, pytest.raises(InputError, match="truncated or corrupt") as err:
        list(iter_raw_documents(stream, "wikipedia", name=str(path)))
    assert err.value.offset is not None


def test_truncated_gzip_is_an_input_error():
    data = gzip.compress(LEE.read_bytes())
    with pytest.raises(InputError, match="truncated or corrupt"):
        list(iter_raw_documents(gzip.GzipFile(fileobj=io.BytesIO(data[: len(data) // 2])), "lines", name="lee.gz"))


def test_empty_file_is_an_input_error():
    for fmt in ("auto", "wikipedia", "book", "lines", "jsonl", "parquet"):
        with pytest.raises(InputError, match="file is empty") as err:
            read(b"", fmt, name="empty.txt")
        assert err.value.offset == 0


# --------------------------------------------------------------------- text formats


def test_lines_one_document_per_non_empty_line():
    docs = read(b"first line\n\n  \nsecond\r\nthird without newline", "lines", name="f.txt")
    assert [(d.title, d.text) for d in docs] == [
        ("f.txt@0", "first line"),
        ("f.txt@15", "second"),
        ("f.txt@23", "third without newline"),
    ]
    assert [d.offset for d in docs] == [0, 15, 23]


@pytest.mark.parametrize("n", [2, 5, 300])
def test_line_ranges_cover_every_line_once(n):
    data = LEE.read_bytes()
    whole = read(data, "lines", name="lee")
    assert len(whole) == 300
    assert [d for part in read_in_ranges(data, "lines", n, name="lee") for d in part] == whole
    # a range starting exactly at a line start owns that line
    second = data.index(b"\n") + 1
    assert read_range(data, "lines", second, None, name="lee") == whole[1:]


def test_non_utf8_line_names_byte_and_encoding():
    data = b"good line\nsecond \xe9t\xe9 line\n"
    with pytest.raises(InputError, match=r"byte 17 .*read as utf-8.*set `encoding`") as err:
        read(data, "lines", name="latin1.txt")
    assert err.value.offset == 17
    # The range that does not own line 2 never decodes it.
    assert len(read_range(data, "lines", 0, 5)) == 1
    # Declared, it reads.
    assert [d.text for d in read(data, "lines", encoding="latin-1")] == ["good line", "second été line"]


def test_fifty_megabyte_line_is_one_record_in_bounded_memory():
    size = 50_000_000
    data = b"x" * size + b"\nnext\n"
    tracemalloc.start()
    try:
        docs = read(data, "lines", name="big")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [len(d.text) for d in docs] == [size, 4]
    assert peak < 4 * size


def test_book_is_one_document_with_paragraph_breaks():
    data = "\ufeffChapter one.\r\nA wrapped\r\nline.\r\n\r\nSecond paragraph.\n".encode()
    (doc,) = read(data, "book", name="novel.txt")
    assert doc.title == "novel.txt" and doc.markup == "plain"
    assert doc.text == "Chapter one.\nA wrapped\nline.\n\nSecond paragraph.\n"
    assert read_range(data, "book", 10, None) == []  # a book is never split


def test_book_non_utf8_names_the_byte():
    with pytest.raises(InputError) as err:
        read(b"abc\ndef\x80", "book", name="b.txt")
    assert err.value.offset == 7


def test_jsonl_columns_and_titles():
    lines = [{"text": "alpha", "id": 7}, {"text": "beta", "id": "b"}, {"text": None, "id": 9}]
    data = "\n".join(json.dumps(x) for x in lines).encode() + b"\n\n"
    docs = read(data, name="d.jsonl")
    assert [(d.title, d.text) for d in docs] == [("d.jsonl@0", "alpha"), ("d.jsonl@27", "beta"), ("d.jsonl@55", "")]
    titled = read(data, "jsonl", name="d.jsonl", title_column="id")
    assert [d.title for d in titled] == ["7", "b", "9"]
    other = read(b'{"body": "x"}\n', "jsonl", text_column="body")
    assert other[0].text == "x"


def test_bad_jsonl_line_names_the_line():
    data = b'{"text": "a"}\n{"text": "b"}\n{"text": \n{"text": "d"}\n'
    with pytest.raises(InputError, match=r"the line at byte 28 is not valid JSON") as err:
        read(data, name="bad.jsonl")
    assert err.value.offset == 28
    with pytest.raises(InputError, match=r"the line at byte 14 has no field 'text'.*text_column"):
        read(b'{"text": "a"}\n{"body": "b"}\n', name="cols.jsonl")
    with pytest.raises(InputError, match="not an object"):
        read(b'["a", "b"]\n', name="arr.jsonl")


# -------------------------------------------------------------------------- parquet


@pytest.fixture
def parquet_file(tmp_path) -> Path:
    table = pa.table({"text": [f"document number {i}" for i in range(50)], "key": [f"k{i}" for i in range(50)]})
    path = tmp_path / "docs.parquet"
    pq.write_table(table, path, row_group_size=7)  # 8 row groups
    return path


def test_parquet_row_groups_partition(parquet_file):
    def docs(**kw):
        with open(parquet_file, "rb") as f:
            return list(iter_raw_documents(f, kw.pop("fmt", "auto"), name="docs.parquet", **kw))

    whole = docs()
    assert [d.text for d in whole] == [f"document number {i}" for i in range(50)]
    assert [d.title for d in whole[:2]] == ["docs.parquet:0", "docs.parquet:1"]
    assert [d.title for d in docs(title_column="key")][:2] == ["k0", "k1"]
    size = parquet_file.stat().st_size
    cuts = [0, size // 3, 2 * size // 3, None]
    parts = [docs(start=a, end=b, first=a == 0, fmt="parquet") for a, b in zip(cuts, cuts[1:])]
    assert (
        sum(map(bool, parts)) >= 2 and [d for part in parts for d in part] == whole
    )  # row groups by their byte offset
    assert all(cuts[i] <= d.offset < (cuts[i + 1] or size) for i, part in enumerate(parts) for d in part)


def test_parquet_missing_column_and_garbage(parquet_file, tmp_path):
    with open(parquet_file, "rb") as f, pytest.raises(InputError, match="no column 'body'.*text_column"):
        list(iter_raw_documents(f, "parquet", text_column="body"))
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"this is not parquet at all")
    with open(junk, "rb") as f, pytest.raises(InputError, match="not a readable Parquet file"):
        list(iter_raw_documents(f, "parquet", name=str(junk)))


# --------------------------------------------------------------------------- detect


def test_detect_format():
    assert detect_format("dump.xml.bz2", b'<mediawiki xmlns="http://www.mediawiki.org/">') == "wikipedia"
    assert detect_format("anything", b'<?xml version="1.0"?>\n<mediawiki>') == "wikipedia"
    assert detect_format("a.jsonl.gz", b'{"text": 1}') == "jsonl"
    assert detect_format("a.JSON", b"{}") == "jsonl"
    assert detect_format("a.parquet", b"PAR1") == "parquet"
    assert detect_format("book.txt.zst", b"Call me Ishmael.") == "book"
    assert detect_format("data.csv", b"a,b\n1,2") == "csv"
    assert detect_format("data.tsv.gz", b"a\tb\n") == "tsv"
    assert detect_format("dump.xml", "<mediawiki>".encode("utf-16")) == "wikipedia"
    with pytest.raises(InputError, match="set `format`"):
        detect_format("data.dat", b"a;b\n1;2")
