"""Streaming readers: one decompressed input stream, or one byte range of it, ->
`RawDocument` records.

A large file is read by several tasks, each over a byte range [start, end) of it: a task
owns the records that *start* in its range, skips the partial record its range begins in
the middle of, and reads past `end` to finish its last record. So ranges that tile a file
see every record exactly once, and what a record contains does not depend on where the
file was cut. Only the range that starts the file reads its header (a wiki's <siteinfo>,
a table's column names); the others are given it.

Record boundaries per format:
  wikipedia  a <page>...</page> (the <siteinfo> header is not a record); a file that ends
             without </mediawiki> keeps its complete pages and counts the cut-off tail
  book       the whole file is one record (never split)
  lines      a line; blank lines yield nothing
  jsonl      a line holding a JSON object
  tsv        a line of tab-separated fields, the first line naming the columns
  csv        a CSV record (quoted fields may span lines, so a CSV file is never split)
  parquet    the rows of a row group (the range holds the group's first column chunk)
  warc       a WARC or WET record holding a page or its text (bertcore/text/warc.py); a
             per-record .gz file is read in ranges of gzip members, a plain one whole

Nothing here holds more than one record, one 1 MiB read block and one Parquet batch in
memory. Errors a user can cause (a damaged or mis-declared file) raise `InputError`, whose
message names the file, the byte offset in the decompressed data and what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO
from xml.etree import ElementTree

from bertcore.text import tabular
from bertcore.text.gzmembers import GzipMembers
from bertcore.text.reader import InputError, Prefixed, RawDocument, Reader, ReadStats, label
from bertcore.text.warc import iter_warc
from bertcore.text.wikisite import SiteInfo

__all__ = [
    "FORMATS",
    "Chunk",
    "InputError",
    "RawDocument",
    "ReadStats",
    "detect_format",
    "iter_raw_documents",
    "record_chunks",
]

_HEAD = 4096  # bytes format detection looks at
_COMPRESSION_SUFFIXES = (".bz2", ".gz", ".xz", ".zst", ".zstd", ".lzma")
FORMATS = ("wikipedia", "book", "lines", "jsonl", "tsv", "csv", "parquet", "warc")
SPLITTABLE = frozenset({"wikipedia", "lines", "jsonl", "tsv", "parquet"})
"""Formats whose files can be read in byte ranges (UTF-8 text, or Parquet row groups)."""
CHUNKABLE = SPLITTABLE - {"parquet"}
"""Formats whose records can be found by their first bytes (`<page>`, a line start), so a
decompressed stream can be cut into chunks of whole records (`record_chunks`)."""
_HEADER_LIMIT = 16 << 20  # most bytes kept from before a dump's first <page>


def strip_compression(name: str) -> str:
    base = name.lower()
    for suffix in _COMPRESSION_SUFFIXES:
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def detect_format(name: str, head: bytes) -> str:
    """The input format from the file name and its first decompressed bytes.

    A MediaWiki export is recognised by its root tag whatever its name (in UTF-8 or with a
    UTF-16 byte-order mark); otherwise the extension (after any compression suffix)
    decides. `lines` is never guessed: a .txt file is a book unless the input says
    `format: lines`.
    """
    start = head[:_HEAD]
    if start.startswith((b"\xff\xfe", b"\xfe\xff")):
        start = start.decode("utf-16", errors="ignore").encode()
    start = start.lstrip(b"\xef\xbb\xbf \t\r\n")
    if start.startswith(b"<?xml"):
        start = start[start.find(b"?>") + 2 :].lstrip()
    if start.startswith(b"<mediawiki"):
        return "wikipedia"
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"WARC/1."):
        return "warc"
    base = strip_compression(name)
    for suffixes, fmt in (
        ((".jsonl", ".json", ".ndjson"), "jsonl"),
        ((".parquet",), "parquet"),
        ((".txt",), "book"),
        ((".tsv", ".tab"), "tsv"),
        ((".csv",), "csv"),
        ((".xml",), "wikipedia"),
        ((".warc", ".wet"), "warc"),
    ):
        if base.endswith(suffixes):
            return fmt
    raise InputError(
        f"{label(name)}: cannot tell the input format from the name or the first bytes; "
        f"set `format` on this input to one of {', '.join(FORMATS)}"
    )


def iter_raw_documents(
    stream: BinaryIO,
    fmt: str,
    *,
    name: str = "",
    text_column: str = "text",
    title_column: str | None = None,
    encoding: str = "auto",
    start: int = 0,
    end: int | None = None,
    owns: Callable[[int], bool] | None = None,
    aligned: bool = True,
    first: bool | None = None,
    header: object = None,
    stats: ReadStats | None = None,
) -> Iterator[RawDocument]:
    """The documents of one decompressed input stream, or of the range of it that starts
    at byte `start` (the stream is positioned there) and ends at `end`.

    `fmt` is one of FORMATS or "auto" (`detect_format` on `name` and the first 4 KiB).
    `owns(offset)` decides instead of `end` whether a record starting at that absolute
    offset is this range's (a multistream dump knows its range's end only once it is
    reached). `first`: whether the range starts the file (default: `start == 0`; a
    multistream range counts its bytes from 0). A range not at the file's start skips to its first record boundary
    (`aligned`: byte `start` begins a record, for the line formats) and needs the file's
    `header` (the SiteInfo of a dump, the columns of a tsv file). Parquet needs the whole,
    seekable file. `name` is the file's name or URI, used in titles and messages; `stats`
    receives the bytes read, the encoding, the header and any cut-off tail.
    """
    if fmt != "auto" and fmt not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r}; expected 'auto' or one of {FORMATS}")
    stats = stats if stats is not None else ReadStats()
    if fmt == "auto" and strip_compression(name).endswith((".warc", ".wet")):
        fmt = "warc"
    if fmt == "warc" or isinstance(stream, GzipMembers):
        yield from iter_warc(stream, name, stats)  # binary records: no text encoding, no byte ranges
        return
    if owns is None:
        owns = (lambda offset: True) if end is None else (lambda offset: offset < end)
    reader = Reader(stream, name, stats, base=start, end=end)
    first = start == 0 if first is None else first
    if first:
        head = reader.head(_HEAD)
        if not head:
            raise InputError(
                f"{label(name)}: file is empty (0 bytes after decompression); remove it from the inputs", 0
            )
        if fmt == "auto":
            fmt = detect_format(name, head)
        if fmt == "warc":  # found by its first bytes: read again from the first byte
            stats.decompressed_bytes -= len(head)
            yield from iter_warc(Prefixed(head, stream), name, stats)
            return
        if fmt != "parquet":
            reader.detect_encoding(encoding)
    elif fmt == "auto":
        raise ValueError("a range after the start of a file needs its format")

    if fmt == "wikipedia":
        yield from _wikipedia(reader, owns, first, header, stats)
    elif fmt == "book":
        if first:
            yield _book(reader)
    elif fmt == "parquet":
        yield from tabular.parquet(stream, name, text_column, title_column, owns, start, stats)
    else:
        columns = {"text": text_column, "title": title_column}
        yield from tabular.read(fmt, reader, owns, aligned or first, columns, None if first else header)


# ------------------------------------------------------------------- chunks of records


@dataclass(frozen=True)
class Chunk:
    """Whole records of a decompressed file, as bytes: a piece that one task parses."""

    offset: int
    """Byte offset of data[0] in the decompressed file."""
    data: bytes
    last: bool
    """The chunk ends the file (a non-last chunk ends where a record starts)."""

    def stream(self) -> _ChunkStream:
        return _ChunkStream(self)


class _ChunkStream:
    """A chunk's bytes as a stream for `iter_raw_documents` (with start=chunk.offset): a
    non-last chunk ends `paused`, so the reader stops there instead of taking the chunk's
    end for the file's end."""

    def __init__(self, chunk: Chunk):
        self.data, self.position = memoryview(chunk.data), 0
        self.paused = not chunk.last

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size is None or size < 0 else self.position + size
        out = bytes(self.data[self.position : end])
        self.position += len(out)
        return out


def record_chunks(
    stream: BinaryIO, fmt: str, size: int, *, name: str = "", stats: ReadStats | None = None
) -> Iterator[Chunk]:
    """A decompressed stream of a CHUNKABLE format (in UTF-8) cut into chunks of about
    `size` bytes, each ending where a record starts (before `<page>`, after a newline); a
    record longer than `size` makes its chunk longer. Decompression errors become
    InputError at the offset reached; `stats` counts the bytes read."""
    if fmt not in CHUNKABLE:
        raise ValueError(f"{fmt} records cannot be found from their first bytes")
    reader = Reader(stream, name, stats if stats is not None else ReadStats())
    mark = _OPEN if fmt == "wikipedia" else b"\n"
    after = 0 if fmt == "wikipedia" else len(mark)  # a record starts at the mark, or after it
    buffer = bytearray()
    offset = scanned = 0  # file offset of buffer[0]; buffer[:scanned] holds no mark past `size`
    while block := reader.read():
        buffer += block
        while len(buffer) >= size:
            # the last record start at or before `size` (not at 0), else the first one after
            back = buffer.rfind(mark, 1 - after, size + len(mark) - 2 * after)
            if back >= 0:
                cut = back + after
            else:
                forward = buffer.find(mark, max(size, scanned - len(mark) + 1))
                if forward < 0:
                    scanned = len(buffer)
                    break
                cut = forward + after
            yield Chunk(offset, bytes(buffer[:cut]), False)
            del buffer[:cut]
            offset, scanned = offset + cut, 0
    yield Chunk(offset, bytes(buffer), True)


# ------------------------------------------------------------------------- wikipedia

_OPEN, _CLOSE, _ROOT_END = b"<page>", b"</page>", b"</mediawiki>"


class _PageScan:
    """Locates <page>...</page> in a stream of blocks (tags may straddle blocks) and keeps
    the bytes of the pages this range owns; other bytes are only searched."""

    def __init__(self, reader: Reader, owns: Callable[[int], bool], first: bool):
        self.reader, self.owns, self.first = reader, owns, first
        self.header: list[bytes] = []  # bytes before the first <page>, when the range starts the file
        self.page_start: int | None = None  # absolute offset of the open page
        self.seen_page = False
        self.tail = b""  # last bytes of the file, to check it ends with </mediawiki>
        self.after_last_page = 0  # absolute offset just after the last </page>
        self.at_eof = False  # False when the scan stopped at the next range's first page

    def _stray_close(self, at: int) -> InputError:
        return InputError(
            (
                f"{label(self.reader.name)}: malformed XML: </page> without <page> at byte {at}; the dump is "
                "damaged, re-download it"
            ),
            at,
        )

    def pages(self) -> Iterator[tuple[int, bytes]]:
        """(offset, bytes of <page>...</page>) for this range's pages, in order."""
        reader = self.reader
        data_start = reader.offset  # absolute offset of data[0]
        carry = b""
        pieces: list[bytes] = []
        seg = 0
        while True:
            block = reader.read()
            data = carry + block
            pos = 0
            while True:
                if self.page_start is None:
                    p = data.find(_OPEN, pos)
                    stray = data.find(_CLOSE, pos, p if p >= 0 else len(data))
                    if stray >= 0 and (self.seen_page or self.first):
                        raise self._stray_close(data_start + stray)
                    if p < 0:
                        cut = max(pos, len(data) - len(_OPEN) + 1)
                        if self.first and not self.seen_page and sum(map(len, self.header)) < _HEADER_LIMIT:
                            self.header.append(data[pos:cut])
                        break
                    if self.first and not self.seen_page:
                        self.header.append(data[pos:p])
                    if not self.owns(data_start + p):
                        return  # the next range's first page
                    self.seen_page, self.page_start, seg = True, data_start + p, p
                    reader.record_open = True
                    pos = p + len(_OPEN)
                else:
                    c = data.find(_CLOSE, pos)
                    o = data.find(_OPEN, pos, c if c >= 0 else len(data))
                    if o >= 0:
                        raise InputError(
                            f"{label(reader.name)}: malformed XML: the page starting at byte {self.page_start} is not "
                            f"closed before the next <page> at byte {data_start + o}; the dump is damaged, "
                            "re-download it",
                            self.page_start,
                        )
                    if c < 0:
                        cut = max(pos, len(data) - len(_CLOSE) + 1)
                        pieces.append(data[seg:cut])
                        seg = 0
                        break
                    end = c + len(_CLOSE)
                    pieces.append(data[seg:end])
                    chunk, pieces = b"".join(pieces), []
                    start, self.page_start = self.page_start, None
                    reader.record_open = False
                    self.after_last_page = data_start + end
                    yield start, chunk
                    pos = end
            if not block:
                self.at_eof = not reader.stopped
                return
            self.tail = (self.tail + block[-64:])[-64:]
            carry = data[cut:]
            data_start += cut

    def site(self) -> SiteInfo:
        return SiteInfo.from_xml(b"".join(self.header))


def _wikipedia(
    reader: Reader, owns: Callable[[int], bool], first: bool, site: object, stats: ReadStats
) -> Iterator[RawDocument]:
    """Pages of a dump or of a range of one; the header (SiteInfo) is read from the file
    when the range starts it, else `site` (default names when not given)."""
    if not first and site is None:
        site = SiteInfo.default()
    scan = _PageScan(reader, owns, first)
    for offset, chunk in scan.pages():
        if site is None:
            site = scan.site()
            stats.header = site
        yield _parse_page(reader, chunk, offset)
    if site is None:  # no page at all
        stats.header = scan.site()
    if not scan.at_eof:
        return  # stopped at the next range's first page
    if scan.page_start is not None:  # the file ends inside a page: keep what came before
        stats.truncated_records += 1
        stats.truncated_bytes += reader.offset - scan.page_start
    elif not scan.tail.rstrip().endswith(_ROOT_END):
        if first and not scan.seen_page:
            raise InputError(
                f"{label(reader.name)}: no <page> and no </mediawiki> in {reader.offset} bytes; "
                "the file is truncated or not a MediaWiki export (set `format` if it is not)",
                reader.offset,
            )
        stats.truncated_bytes += reader.offset - max(scan.after_last_page, 0)
    stats.extra["complete"] = scan.page_start is None and scan.tail.rstrip().endswith(_ROOT_END)


def _parse_page(reader: Reader, chunk: bytes, offset: int) -> RawDocument:
    name = reader.name
    try:
        page = ElementTree.fromstring(chunk)
    except ElementTree.ParseError as exc:
        reader.decode(chunk, offset, " (inside a <page>)")  # raises when that is the cause
        line, column = exc.position
        at = offset + sum(len(x) for x in chunk.split(b"\n")[: line - 1]) + line - 1 + column
        raise InputError(
            f"{label(name)}: malformed XML at byte {at} in the page starting at byte {offset} "
            f"({exc}); the dump is damaged, re-download it",
            at,
        ) from None
    try:
        namespace = int(page.findtext("ns") or 0)
    except ValueError:
        raise InputError(
            f"{label(name)}: the page starting at byte {offset} has a non-numeric <ns>; the dump is damaged",
            offset,
        ) from None
    revisions = page.findall("revision")
    # pages-articles has one revision; a full-history dump lists them oldest first.
    text = (revisions[-1].findtext("text") or "") if revisions else ""
    return RawDocument(
        title=page.findtext("title") or "",
        text=text,
        markup="wikitext",
        offset=offset,
        namespace=namespace,
        redirect=page.find("redirect") is not None,
    )


# ------------------------------------------------------------------------------ book


def _book(reader: Reader) -> RawDocument:
    start = reader.offset
    blocks = []
    while block := reader.read():
        blocks.append(block)
    data = b"".join(blocks)
    del blocks
    text = reader.decode(data, start)
    # Paragraph breaks (blank lines) are kept; the cleaner unwraps lines and splits on them.
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return RawDocument(title=reader.name, text=text, markup="plain", offset=0)
