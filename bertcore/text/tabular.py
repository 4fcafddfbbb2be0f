"""Record formats made of lines or rows: lines, jsonl, tsv, csv (over a `Reader`) and
Parquet (over a seekable file). See records.py for how ranges of a file are read."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from typing import BinaryIO

from bertcore.text.reader import InputError, RawDocument, Reader, ReadStats, label

Owns = Callable[[int], bool]


def read(
    fmt: str, reader: Reader, owns: Owns, aligned: bool, columns: dict, header: list[str] | None
) -> Iterator[RawDocument]:
    """The records of a line format (lines, jsonl, tsv, csv); `columns` holds the text and
    title column names, `header` the column names when the range does not start the file."""
    if fmt == "lines":
        yield from _lines(reader, owns, aligned)
    elif fmt == "jsonl":
        yield from _jsonl(reader, owns, aligned, columns["text"], columns["title"])
    elif fmt == "tsv":
        yield from _tsv(reader, owns, aligned, columns, header)
    elif fmt == "csv":
        yield from _csv(reader, columns)
    else:
        raise ValueError(f"not a line format: {fmt}")


def iter_lines(reader: Reader, owns: Owns, aligned: bool) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line without its newline) of the lines that start in this range.

    Not `aligned`: the range starts inside a line, which belongs to the range before it.
    A line longer than a block is gathered from pieces and joined once (peak about twice
    its size); lines are read until the first one this range does not own."""
    start = reader.offset
    skipping = not aligned
    reader.record_open = skipping  # the first line start must be found, even past the end
    at_line_start = True
    pieces: list[bytes] = []
    while block := reader.read():
        block_start = reader.offset - len(block)
        pos = 0
        if skipping:
            nl = block.find(b"\n")
            if nl < 0:
                continue
            pos, start, skipping = nl + 1, block_start + nl + 1, False
        while True:
            if at_line_start:
                reader.record_open = False
                if not owns(start):
                    return
                at_line_start = False
                reader.record_open = True
            nl = block.find(b"\n", pos)
            if nl < 0:
                break
            pieces.append(block[pos:nl])
            line, pieces = b"".join(pieces), []
            line_start, start, pos, at_line_start = start, block_start + nl + 1, nl + 1, True
            reader.record_open = False
            yield line_start, line
        if pos < len(block):
            pieces.append(block[pos:] if pos else block)
    if pieces and not skipping:
        yield start, b"".join(pieces)


def _lines(reader: Reader, owns: Owns, aligned: bool) -> Iterator[RawDocument]:
    for offset, raw in iter_lines(reader, owns, aligned):
        text = reader.decode(raw, offset, " (in the line starting there)").removesuffix("\r")
        if text.strip():
            yield RawDocument(title=f"{reader.name}@{offset}", text=text, markup="plain", offset=offset)


def _jsonl(
    reader: Reader, owns: Owns, aligned: bool, text_column: str, title_column: str | None
) -> Iterator[RawDocument]:
    name = reader.name
    for offset, raw in iter_lines(reader, owns, aligned):
        if not raw.strip():
            continue
        where = f"the line at byte {offset}"
        line = reader.decode(raw, offset, " (in the line starting there)")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{label(name)}: {where} is not valid JSON ({exc.msg}); fix or remove the line "
                "(jsonl needs one JSON object per line)",
                offset,
            ) from None
        if not isinstance(record, dict):
            raise InputError(
                (
                    f"{label(name)}: {where} is a JSON {type(record).__name__}, not an object; jsonl needs one "
                    "JSON object per line"
                ),
                offset,
            )
        text = _field(record, text_column, "text_column", where, name, offset)
        title = (
            f"{name}@{offset}"
            if title_column is None
            else _field(record, title_column, "title_column", where, name, offset)
        )
        yield RawDocument(title=title, text=text, markup="plain", offset=offset)


def _field(record: dict, column: str, key: str, where: str, name: str, offset: int) -> str:
    if column not in record:
        raise InputError(
            f"{label(name)}: {where} has no field {column!r} (fields: {', '.join(map(repr, record))}); "
            f"set {key} to the field that holds it",
            offset,
        )
    value = record[column]
    if value is None:
        return ""  # a null text is an empty document, dropped later as `empty`
    if isinstance(value, (dict, list)):
        raise InputError(
            f"{label(name)}: {where} field {column!r} is a JSON {type(value).__name__}, not text; "
            f"set {key} to a field that holds a string",
            offset,
        )
    return value if isinstance(value, str) else json.dumps(value)


# ------------------------------------------------------------------------- tsv, csv


def header_columns(fmt: str, first_line: bytes, name: str) -> list[str]:
    """The column names in the first line of a tsv or csv file (UTF-8, BOM allowed)."""
    text = first_line.decode("utf-8-sig", errors="replace").rstrip("\r\n")
    return next(
        csv.reader(
            [text],
            delimiter="\t" if fmt == "tsv" else ",",
            quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL,
        ),
        [],
    )


def _positions(header: list[str], columns: dict, name: str) -> tuple[int, int | None]:
    found = {}
    for role, key in (("text", "text_column"), ("title", "title_column")):
        column = columns[role]
        if column is None:
            found[role] = None
        elif column in header:
            found[role] = header.index(column)
        else:
            raise InputError(
                f"{label(name)}: no column {column!r} in the header line (columns: {', '.join(map(repr, header))}); "
                f"set {key} to the column that holds it",
                0,
            )
    return found["text"], found["title"]


def _row_document(row: list[str], offset: int, positions: tuple[int, int | None], name: str) -> RawDocument:
    text_at, title_at = positions
    needed = max(text_at, title_at if title_at is not None else -1)
    if len(row) <= needed:
        raise InputError(
            f"{label(name)}: the row at byte {offset} has {len(row)} fields, the header names more; "
            "fix the row (a tab or comma inside a value must be quoted or escaped)",
            offset,
        )
    title = row[title_at] if title_at is not None else f"{name}@{offset}"
    return RawDocument(title=title, text=row[text_at], markup="plain", offset=offset)


def _tsv(reader: Reader, owns: Owns, aligned: bool, columns: dict, header: list[str] | None) -> Iterator[RawDocument]:
    positions = None if header is None else _positions(header, columns, reader.name)
    for offset, raw in iter_lines(reader, owns, aligned):
        line = reader.decode(raw, offset, " (in the line starting there)").removesuffix("\r")
        if positions is None:
            positions = _positions(line.split("\t"), columns, reader.name)
            continue
        if line.strip():
            yield _row_document(line.split("\t"), offset, positions, reader.name)


def _csv(reader: Reader, columns: dict) -> Iterator[RawDocument]:
    starts: list[int] = []  # offsets of the lines the csv module took since the last row

    def lines() -> Iterator[str]:
        for offset, raw in iter_lines(reader, lambda _: True, True):
            starts.append(offset)
            yield reader.decode(raw, offset, " (in the line starting there)") + "\n"

    rows = csv.reader(lines())
    positions = None
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except csv.Error as exc:
            at = starts[0] if starts else reader.offset
            raise InputError(
                f"{label(reader.name)}: the CSV record at byte {at} cannot be read ({exc}); fix the quoting", at
            ) from None
        offset = starts[0] if starts else reader.offset
        starts.clear()
        if positions is None:
            positions = _positions(row, columns, reader.name)
        elif row and any(cell.strip() for cell in row):
            yield _row_document(row, offset, positions, reader.name)


# --------------------------------------------------------------------------- parquet


def parquet(
    stream: BinaryIO, name: str, text_column: str, title_column: str | None, owns: Owns, start: int, stats: ReadStats
) -> Iterator[RawDocument]:
    """The rows of the row groups whose first column chunk starts in this range."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not stream.seekable():
        raise InputError(
            f"{label(name)}: Parquet is read by row group and needs a seekable file; "
            "store Parquet files uncompressed (they compress internally)"
        )
    try:
        stream.seek(0)
        pf = pq.ParquetFile(stream)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(
            f"{label(name)}: not a readable Parquet file ({exc}); check the file, or set `format` if it is not Parquet"
        ) from exc
    fields = pf.schema_arrow.names
    columns = [text_column]
    for column, key in ((text_column, "text_column"), (title_column, "title_column")):
        if column is not None and column not in fields:
            raise InputError(
                f"{label(name)}: no column {column!r} (columns: {', '.join(map(repr, fields))}); set {key} "
                "to the column that holds it"
            )
    if not pa.types.is_string(t := pf.schema_arrow.field(text_column).type) and not pa.types.is_large_string(t):
        raise InputError(
            f"{label(name)}: column {text_column!r} has type {t}, not string; set text_column to a text column"
        )
    if title_column is not None and title_column != text_column:
        columns.append(title_column)
    meta = pf.metadata
    first_row = 0
    for group in range(meta.num_row_groups):
        rows = meta.row_group(group).num_rows
        chunk = meta.row_group(group).column(0)
        offset = chunk.dictionary_page_offset or chunk.data_page_offset
        if offset >= start and owns(offset):
            stats.decompressed_bytes += meta.row_group(group).total_byte_size
            yield from _row_group(pf, group, columns, text_column, title_column, first_row, offset, name)
        first_row += rows


def _row_group(
    pf, group: int, columns: list[str], text_column: str, title_column: str | None, row: int, offset: int, name: str
) -> Iterator[RawDocument]:
    import pyarrow as pa

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
            f"{label(name)}: row group {group} (byte {offset}) cannot be read ({exc}); the file is damaged, rewrite it",
            offset,
        ) from exc
