"""Streaming readers: one decompressed input file -> `RawDocument` records.

Every format numbers its records 0, 1, 2, ... in file order and record i belongs to part
i % n_parts, so n tasks reading the same file with parts 0..n-1 see every record exactly
once. A task only parses its own records: the others are skipped by a byte scan (page
tags, newlines) without decoding. Nothing here holds more than one record, one 1 MiB read
block and one Parquet batch in memory; text streams are read once, front to back (Parquet
is read by row group, so it needs a seekable file).

Record numbering per format:
  wikipedia  one record per <page>...</page> (the <siteinfo> header is not a record)
  book       the whole file is record 0
  lines      physical line i (0-based) is record i; blank lines yield nothing
  jsonl      as lines
  parquet    row group i is record i (all its rows go to part i % n_parts); a row's
             title defaults to f"{name}:{row}" (0-based row in the file) and its offset
             is that of the row group's first column chunk

Errors a user can cause (a damaged or mis-declared file) raise `InputError`, whose message
names the file, the byte offset in the decompressed data and what to do.
"""

from __future__ import annotations

import json
import lzma
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Literal
from xml.etree import ElementTree

_BLOCK = 1 << 20  # bytes per read
_HEAD = 4096  # bytes format detection looks at
_COMPRESSION_SUFFIXES = (".bz2", ".gz", ".xz", ".zst", ".zstd", ".lzma")
FORMATS = ("wikipedia", "book", "lines", "jsonl", "parquet")


class InputError(ValueError):
    """A corrupt or mis-declared input file; `offset` is the byte offset in the
    decompressed data where the problem was found (None when it has no position)."""

    def __init__(self, message: str, offset: int | None = None):
        super().__init__(message)
        self.offset = offset


@dataclass(frozen=True)
class RawDocument:
    title: str
    text: str
    markup: Literal["wikitext", "plain"]
    offset: int  # byte offset in the decompressed input, for error messages
    namespace: int = 0
    redirect: bool = False


def detect_format(name: str, head: bytes) -> str:
    """The input format from the file name and its first decompressed bytes.

    A MediaWiki export is recognised by its root tag whatever its name; otherwise the
    extension (after any compression suffix) decides. `lines` is never guessed: a .txt
    file is a book unless the input says `format: lines`.
    """
    start = head[:_HEAD].lstrip(b"\xef\xbb\xbf \t\r\n")
    if start.startswith(b"<?xml"):
        start = start[start.find(b"?>") + 2 :].lstrip()
    if start.startswith(b"<mediawiki"):
        return "wikipedia"
    if head.startswith(b"PAR1"):
        return "parquet"
    base = name.lower()
    for suffix in _COMPRESSION_SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    if base.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if base.endswith(".parquet"):
        return "parquet"
    if base.endswith(".txt"):
        return "book"
    raise InputError(
        f"{_label(name)}: cannot tell the input format from the name or the first bytes; "
        f"set `format` on this input to one of {', '.join(FORMATS)}"
    )


def iter_raw_documents(
    stream: BinaryIO,
    fmt: str,
    *,
    part: int = 0,
    n_parts: int = 1,
    text_column: str = "text",
    title_column: str | None = None,
    name: str = "",
) -> Iterator[RawDocument]:
    """The documents of part `part` of `n_parts` of one decompressed input stream.

    `fmt` is one of FORMATS or "auto" (`detect_format` on `name` and the first 4 KiB).
    Parquet needs a seekable stream. `name` is the file's name or URI, used for
    titles (book, lines, jsonl without a title column) and in error messages.
    """
    if not 0 <= part < n_parts:
        raise ValueError(f"part must be in [0, n_parts), got part={part}, n_parts={n_parts}")
    if fmt != "auto" and fmt not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r}; expected 'auto' or one of {FORMATS}")
    reader = _Reader(stream, name)
    head = reader.head(_HEAD)
    if not head:
        raise InputError(f"{_label(name)}: file is empty (0 bytes after decompression); remove it from the inputs", 0)
    if fmt == "auto":
        fmt = detect_format(name, head)

    def mine(index: int) -> bool:
        return index % n_parts == part

    if fmt == "wikipedia":
        yield from _wikipedia(reader, mine, name)
    elif fmt == "book":
        if part == 0:
            yield _book(reader, name)
    elif fmt == "lines":
        yield from _lines(reader, mine, name)
    elif fmt == "jsonl":
        yield from _jsonl(reader, mine, name, text_column, title_column)
    elif fmt == "parquet":
        yield from _parquet(stream, part, n_parts, name, text_column, title_column)


# ---------------------------------------------------------------------------- reading


def _label(name: str) -> str:
    return name or "input"


def _is_decompression_error(exc: BaseException) -> bool:
    # bz2/gzip raise EOFError on a cut-off stream and OSError on bad data, lzma and zlib
    # their own errors, zstandard ZstdError. Network and filesystem OSErrors are not a
    # damaged file (and may be worth a retry), so they pass through unchanged.
    if isinstance(exc, (ConnectionError, TimeoutError, FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    if isinstance(exc, (EOFError, OSError, lzma.LZMAError, zlib.error)):
        return True
    return type(exc).__name__ == "ZstdError"


class _Reader:
    """Block reads over the stream that count decompressed bytes and turn decompressor
    failures into InputError at the offset reached."""

    def __init__(self, stream: BinaryIO, name: str):
        self.stream = stream
        self.name = name
        self.offset = 0  # decompressed bytes handed out so far
        self._pending = b""

    def head(self, size: int) -> bytes:
        """At least `size` bytes from the start (fewer only at EOF), left to be read
        again: a stream may return short reads."""
        pieces = []
        while sum(map(len, pieces)) < size and (block := self.read()):
            pieces.append(block)
        data = b"".join(pieces)
        self._pending, self.offset = data, 0
        return data

    def read(self) -> bytes:
        if self._pending:
            data, self._pending = self._pending, b""
        else:
            try:
                data = self.stream.read(_BLOCK)
            except Exception as exc:
                if not _is_decompression_error(exc):
                    raise
                raise InputError(
                    f"{_label(self.name)}: the compressed data is truncated or corrupt "
                    f"({type(exc).__name__}: {exc}) after byte {self.offset} of decompressed data; "
                    "re-download or re-compress the file",
                    self.offset,
                ) from exc
        self.offset += len(data)
        return data


def _decode(data: bytes, offset: int, name: str, where: str = "") -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = offset + exc.start
        raise InputError(
            f"{_label(name)}: invalid UTF-8 at byte {at}{where}; "
            "convert the file to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8)",
            at,
        ) from None


# ------------------------------------------------------------------------- wikipedia

_OPEN, _CLOSE, _ROOT_END = b"<page>", b"</page>", b"</mediawiki>"


def _page_chunks(reader: _Reader, mine: Callable[[int], bool], name: str) -> Iterator[tuple[int, bytes]]:
    """(offset, bytes of <page>...</page>) for this part's pages; other pages are only
    located (bytes.find over each block), never copied or parsed."""
    index = 0
    data_start = reader.offset  # file offset of data[0]
    carry = b""  # unsearched tail of the previous block (a tag may straddle blocks)
    in_page, keep, page_start, seg = False, False, 0, 0
    pieces: list[bytes] = []  # the current page so far, when it is ours
    tail = b""  # last bytes of the file, to check it ends with </mediawiki>
    while True:
        block = reader.read()
        data = carry + block
        pos = 0
        while True:
            if not in_page:
                p = data.find(_OPEN, pos)
                stray = data.find(_CLOSE, pos, p if p >= 0 else len(data))
                if stray >= 0:
                    at = data_start + stray
                    raise InputError(
                        f"{_label(name)}: malformed XML: </page> without <page> at byte {at}; "
                        "the dump is damaged, re-download it",
                        at,
                    )
                if p < 0:
                    cut = max(pos, len(data) - len(_OPEN) + 1)
                    break
                in_page, keep, page_start, seg = True, mine(index), data_start + p, p
                pos = p + len(_OPEN)
            else:
                c = data.find(_CLOSE, pos)
                o = data.find(_OPEN, pos, c if c >= 0 else len(data))
                if o >= 0:
                    raise InputError(
                        f"{_label(name)}: malformed XML: the page starting at byte {page_start} is not "
                        f"closed before the next <page> at byte {data_start + o}; the dump is damaged, re-download it",
                        page_start,
                    )
                if c < 0:
                    cut = max(pos, len(data) - len(_CLOSE) + 1)
                    if keep:
                        pieces.append(data[seg:cut])
                    seg = 0
                    break
                end = c + len(_CLOSE)
                if keep:
                    pieces.append(data[seg:end])
                    chunk, pieces = b"".join(pieces), []
                    yield page_start, chunk
                index += 1
                in_page, keep = False, False
                pos = end
        if not block:
            break
        tail = (tail + block[-64:])[-64:]
        carry = data[cut:]
        data_start += cut
    if in_page:
        raise InputError(
            f"{_label(name)}: the file ends inside the page starting at byte {page_start} "
            f"(byte {reader.offset}); it is truncated, re-download it",
            reader.offset,
        )
    if not tail.rstrip().endswith(_ROOT_END):
        raise InputError(
            f"{_label(name)}: the file ends at byte {reader.offset} without </mediawiki>; "
            "it is truncated or not a MediaWiki export (set `format` if it is not)",
            reader.offset,
        )


def _wikipedia(reader: _Reader, mine: Callable[[int], bool], name: str) -> Iterator[RawDocument]:
    for offset, chunk in _page_chunks(reader, mine, name):
        yield _parse_page(chunk, offset, name)


def _parse_page(chunk: bytes, offset: int, name: str) -> RawDocument:
    try:
        page = ElementTree.fromstring(chunk)
    except ElementTree.ParseError as exc:
        _decode(chunk, offset, name, " (inside a <page>)")  # raises when that is the cause
        line, column = exc.position
        at = offset + sum(len(x) for x in chunk.split(b"\n")[: line - 1]) + line - 1 + column
        raise InputError(
            f"{_label(name)}: malformed XML at byte {at} in the page starting at byte {offset} "
            f"({exc}); the dump is damaged, re-download it",
            at,
        ) from None
    try:
        namespace = int(page.findtext("ns") or 0)
    except ValueError:
        raise InputError(
            f"{_label(name)}: the page starting at byte {offset} has a non-numeric <ns>; the dump is damaged",
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


# ------------------------------------------------------------------ text line formats


def _iter_lines(reader: _Reader, mine: Callable[[int], bool]) -> Iterator[tuple[int, int, bytes]]:
    """(line index, byte offset, line without its newline) for this part's lines.

    A line longer than a block is gathered from pieces and joined once (peak about twice
    its size); lines of other parts are counted, never copied.
    """
    index, start = 0, reader.offset
    keep = mine(0)
    pieces: list[bytes] = []
    while block := reader.read():
        block_start = reader.offset - len(block)
        pos = 0
        while (nl := block.find(b"\n", pos)) >= 0:
            if keep:
                pieces.append(block[pos:nl])
                line, pieces = b"".join(pieces), []
                yield index, start, line
            index += 1
            start, pos = block_start + nl + 1, nl + 1
            keep = mine(index)
        if keep and pos < len(block):
            pieces.append(block[pos:] if pos else block)
    if keep and pieces:
        yield index, start, b"".join(pieces)


def _lines(reader: _Reader, mine: Callable[[int], bool], name: str) -> Iterator[RawDocument]:
    for index, offset, raw in _iter_lines(reader, mine):
        text = _decode(raw, offset, name, f" (line {index + 1})")
        if index == 0:
            text = text.removeprefix("\ufeff")
        text = text.removesuffix("\r")
        if text.strip():
            yield RawDocument(title=f"{name}:{index + 1}", text=text, markup="plain", offset=offset)


def _jsonl(
    reader: _Reader, mine: Callable[[int], bool], name: str, text_column: str, title_column: str | None
) -> Iterator[RawDocument]:
    for index, offset, raw in _iter_lines(reader, mine):
        if not raw.strip():
            continue
        where = f"line {index + 1} (byte {offset})"
        line = _decode(raw, offset, name, f" (line {index + 1})")
        try:
            record = json.loads(line.removeprefix("\ufeff") if index == 0 else line)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{_label(name)}: {where} is not valid JSON ({exc.msg}); fix or remove the line "
                "(jsonl needs one JSON object per line)",
                offset,
            ) from None
        if not isinstance(record, dict):
            raise InputError(
                f"{_label(name)}: {where} is a JSON {type(record).__name__}, not an object; "
                "jsonl needs one JSON object per line",
                offset,
            )
        text = _field(record, text_column, "text_column", where, name, offset)
        if title_column is None:
            title = f"{name}:{index + 1}"
        else:
            title = _field(record, title_column, "title_column", where, name, offset)
        yield RawDocument(title=title, text=text, markup="plain", offset=offset)


def _field(record: dict, column: str, key: str, where: str, name: str, offset: int) -> str:
    if column not in record:
        raise InputError(
            f"{_label(name)}: {where} has no field {column!r} (fields: {', '.join(map(repr, record))}); "
            f"set {key} to the field that holds it",
            offset,
        )
    value = record[column]
    if value is None:
        return ""  # a null text is an empty document, dropped later as `empty`
    if isinstance(value, (dict, list)):
        raise InputError(
            f"{_label(name)}: {where} field {column!r} is a JSON {type(value).__name__}, not text; "
            f"set {key} to a field that holds a string",
            offset,
        )
    return value if isinstance(value, str) else json.dumps(value)


def _book(reader: _Reader, name: str) -> RawDocument:
    blocks = []
    while block := reader.read():
        blocks.append(block)
    data = b"".join(blocks)
    del blocks
    text = _decode(data, 0, name).removeprefix("\ufeff")
    # Paragraph breaks (blank lines) are kept; the cleaner splits on them.
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return RawDocument(title=name, text=text, markup="plain", offset=0)


# --------------------------------------------------------------------------- parquet


def _parquet(
    stream: BinaryIO, part: int, n_parts: int, name: str, text_column: str, title_column: str | None
) -> Iterator[RawDocument]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not stream.seekable():
        raise InputError(
            f"{_label(name)}: Parquet is read by row group and needs a seekable file; "
            "store Parquet files uncompressed (they compress internally)"
        )
    try:
        stream.seek(0)
        pf = pq.ParquetFile(stream)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(
            f"{_label(name)}: not a readable Parquet file ({exc}); check the file, or set `format` if it is not Parquet"
        ) from exc
    fields = pf.schema_arrow.names
    columns = [text_column]
    for column, key in ((text_column, "text_column"), (title_column, "title_column")):
        if column is None:
            continue
        if column not in fields:
            raise InputError(
                f"{_label(name)}: no column {column!r} (columns: {', '.join(map(repr, fields))}); "
                f"set {key} to the column that holds it"
            )
    if not pa.types.is_string(t := pf.schema_arrow.field(text_column).type) and not pa.types.is_large_string(t):
        raise InputError(
            f"{_label(name)}: column {text_column!r} has type {t}, not string; set text_column to a text column"
        )
    if title_column is not None and title_column != text_column:
        columns.append(title_column)
    meta = pf.metadata
    first_row = 0
    for group in range(meta.num_row_groups):
        rows = meta.row_group(group).num_rows
        if group % n_parts == part:
            chunk = meta.row_group(group).column(0)
            offset = chunk.dictionary_page_offset or chunk.data_page_offset
            row = first_row
            try:
                for batch in pf.iter_batches(batch_size=1024, row_groups=[group], columns=columns):
                    texts = batch.column(text_column).to_pylist()
                    titles = batch.column(title_column).to_pylist() if title_column else None
                    for i, text in enumerate(texts):
                        title = f"{name}:{row + i}" if titles is None else ("" if titles[i] is None else str(titles[i]))
                        yield RawDocument(title=title, text=text or "", markup="plain", offset=offset)
                    row += len(texts)
            except (pa.ArrowException, OSError) as exc:
                raise InputError(
                    f"{_label(name)}: row group {group} (byte {offset}) cannot be read ({exc}); "
                    "the file is damaged, rewrite it",
                    offset,
                ) from exc
        first_row += rows
