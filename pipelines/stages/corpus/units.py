"""The corpus stage's work units: how the input files are cut so that every input byte is
decompressed once, each unit one Ray task's share (or one file read by one task and
cleaned by many).

How a file is read (`plan_units`):
- small files (at most `split_bytes`) are read whole, several to a unit up to
  `split_bytes`;
- a multistream .bz2 dump with its index (beside it, or `index` on the input) is cut into
  ranges of whole bzip2 streams; each task seeks to its first stream;
- an uncompressed file in a format whose records can be found from any byte (MediaWiki
  XML, lines, jsonl, tsv, Parquet row groups) in UTF-8 is cut into byte ranges;
- a single-stream .bz2 in one of those formats (Parquet aside) is cut into compressed byte
  ranges; each task decodes the bzip2 blocks that start in its range
  (bertcore/text/compressed.py);
- any other large file (.gz/.xz/.zst, csv, a non-UTF-8 encoding, a .bz2 whose head cannot
  be read) is decompressed by one task that hands it to cleaning tasks in batches
  (`streamed`): chunks of whole records when they can be found from their bytes, else
  parsed records.
The driver reads what planning needs (a dump's <siteinfo>, a tsv header, the index) and
counts those bytes too.
"""

from __future__ import annotations

import bz2
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from bertcore.errors import ConfigError, InputDataError
from bertcore.text.config import CorpusConfig
from bertcore.text.encoding import sniff, splittable
from bertcore.text.gzmembers import per_record
from bertcore.text.multistream import Bz2Range, index_name, plan_ranges, stream_offsets
from bertcore.text.records import (
    CHUNKABLE,
    SPLITTABLE,
    InputError,
    ReadStats,
    detect_format,
    iter_raw_documents,
    strip_compression,
)
from bertcore.text.tabular import header_columns
from bertcore.text.wikisite import SiteInfo
from pipelines.stages.corpus.inputs import InputFile
from pipelines.storage import Storage

_COMPRESSION = {".bz2": "bz2", ".gz": "gzip", ".xz": "xz", ".lzma": "xz", ".zst": "zstd", ".zstd": "zstd"}
_HEAD_BYTES = 64 << 10
MEMBER_HEAD = 1 << 16  # a first member longer than this (whole-file gzip, or a huge record) is read as one stream
_MAX_BUNDLE = 1000  # most small files in one unit


def compression_of(uri: str) -> str | None:
    return next((kind for suffix, kind in _COMPRESSION.items() if uri.lower().endswith(suffix)), None)


@dataclass(frozen=True)
class Piece:
    """What one reader reads of one file: all of it, a byte range, a range of multistream
    streams, the bzip2 blocks that start in a compressed byte range, or the gzip members
    that start in one (a per-record WARC/WET .gz)."""

    file: InputFile
    kind: Literal["whole", "range", "streams", "blocks", "members"] = "whole"
    start: int = 0
    end: int | None = None
    fmt: str = "auto"
    header: Any = None
    """The file's header when the piece does not start the file (SiteInfo, tsv columns)."""


@dataclass(frozen=True)
class Unit:
    """One Ray task's share of the input, or (`streamed`) one file read by one task and
    cleaned by many, batch by batch."""

    index: int
    pieces: tuple[Piece, ...]
    streamed: bool = False

    @property
    def work_path(self) -> str:
        return f"_work/unit-{self.index:05d}.arrow"

    def batch_path(self, batch: int) -> str:
        return f"_work/unit-{self.index:05d}-b{batch:06d}.arrow"

    @property
    def read_marker(self) -> str:
        return f"_work/unit-{self.index:05d}.read"

    @property
    def files(self) -> list[int]:
        return sorted({p.file.index for p in self.pieces})


# -- planning -------------------------------------------------------------------------------


@dataclass
class Plan:
    units: list[Unit]
    planning_bytes: dict[int, int] = field(default_factory=dict)
    """Per file: bytes the driver decompressed to plan it (header, index)."""


def plan_units(cfg: CorpusConfig, files: list[InputFile], storage: Storage) -> Plan:
    plan = Plan(units=[])
    bundle: list[Piece] = []
    bundle_bytes = 0

    def add(pieces: list[Piece], streamed: bool = False) -> None:
        plan.units.append(Unit(len(plan.units), tuple(pieces), streamed))

    for file in files:
        if file.size <= cfg.split_bytes:
            if bundle and (bundle_bytes + file.size > cfg.split_bytes or len(bundle) >= _MAX_BUNDLE):
                add(bundle)
                bundle, bundle_bytes = [], 0
            bundle.append(Piece(file, fmt=file.spec.format))
            bundle_bytes += file.size
            continue
        if bundle:
            add(bundle)
            bundle, bundle_bytes = [], 0
        for pieces, streamed in _large_file(cfg, file, storage, plan):
            add(pieces, streamed)
    if bundle:
        add(bundle)
    return plan


def _large_file(cfg: CorpusConfig, file: InputFile, storage: Storage, plan: Plan) -> Iterator[tuple[list[Piece], bool]]:
    compression = compression_of(file.uri)
    fmt = file.spec.format
    if compression == "bz2" and fmt in ("auto", "wikipedia") and (index := _find_index(file, storage)) is not None:
        offsets = _stream_offsets(storage, index, file)
        site = _multistream_header(storage, file, offsets, plan)
        if site is not None:
            for start, stop in plan_ranges(offsets, cfg.split_bytes):
                yield [Piece(file, "streams", start, stop, "wikipedia", header=site)], False
            return
    if compression == "bz2":
        try:
            fmt, header, can_split = _head(storage, file, plan, compression)
        except InputDataError:  # the reading task reports it (or skips the file)
            can_split = False
        if can_split and fmt in CHUNKABLE:
            for start, end in _byte_ranges(file.size, cfg.split_bytes):
                yield [Piece(file, "blocks", start, end, fmt, header=header)], False
            return
    if compression == "gzip" and is_warc(file) and _per_record(storage, file, plan):
        for start, end in _byte_ranges(file.size, cfg.split_bytes):
            yield [Piece(file, "members", start, end, "warc")], False
        return
    if compression is not None:
        yield [Piece(file, fmt=fmt)], True
        return
    fmt, header, can_split = _head(storage, file, plan)
    if fmt == "book":
        yield [Piece(file, fmt=fmt)], False
    elif can_split:
        for start, end in _byte_ranges(file.size, cfg.split_bytes):
            yield [Piece(file, "range", start, end, fmt, header=header)], False
    else:
        yield [Piece(file, fmt=fmt)], True


def is_warc(file: InputFile) -> bool:
    """Whether a file is read as WARC/WET: by its input's format, or by its name."""
    named = strip_compression(file.uri).endswith((".warc", ".wet"))
    return file.spec.format == "warc" or (file.spec.format == "auto" and named)


def _per_record(storage: Storage, file: InputFile, plan: Plan) -> bool:
    """Whether a .gz WARC/WET file holds a record per gzip member (then tasks read ranges of
    members); from its first 64 KiB, counted as planning bytes."""
    with storage.open(file.uri, "rb") as raw:
        head = raw.read(MEMBER_HEAD)
    plan.planning_bytes[file.index] = plan.planning_bytes.get(file.index, 0) + len(head)
    return per_record(head)


def _byte_ranges(size: int, split_bytes: int) -> list[tuple[int, int | None]]:
    """[start, end) ranges of about `split_bytes` tiling `size` bytes; the last ends at None."""
    n = math.ceil(size / split_bytes)
    return [(i * size // n, (i + 1) * size // n if i + 1 < n else None) for i in range(n)]


def _find_index(file: InputFile, storage: Storage) -> str | None:
    if file.spec.index:
        if not storage.exists(file.spec.index):
            raise ConfigError(
                f"corpus.inputs[{file.position}].index: {file.spec.index} does not exist; fix the path or "
                "remove the key"
            )
        return file.spec.index
    return next((candidate for candidate in index_name(file.uri) if storage.exists(candidate)), None)


def _stream_offsets(storage: Storage, index: str, file: InputFile) -> list[int]:
    with storage.open(index, "rb", compression="infer") as handle:
        try:
            offsets = stream_offsets(handle)
        except (ValueError, OSError, EOFError) as exc:
            raise InputDataError(
                f"{index}: not a multistream index ({exc}); remove `index` from "
                f"corpus.inputs[{file.position}] or fix the file"
            ) from None
    if not offsets or offsets[-1] >= file.size:
        raise InputDataError(
            f"{index}: its stream offsets do not fit {file.uri} ({file.size} bytes): the index belongs to another dump"
        )
    return offsets


def _multistream_header(storage: Storage, file: InputFile, offsets: list[int], plan: Plan) -> SiteInfo | None:
    """The <siteinfo> of a multistream dump, from its first stream; None when the file
    does not start like a MediaWiki export (then it is read as a single stream)."""
    with storage.open(file.uri, "rb") as raw:
        reader = Bz2Range(raw, 0, offsets[0])  # pauses at the first page stream
        try:
            data = b"".join(iter(reader.read, b""))
        except (OSError, EOFError, ValueError) as exc:
            raise InputDataError(
                f"{file.uri}: the first bzip2 stream cannot be read ({exc}); re-download the dump"
            ) from None
    plan.planning_bytes[file.index] = plan.planning_bytes.get(file.index, 0) + len(data)
    if detect_format(file.uri, data[:4096]) != "wikipedia":
        return None
    return SiteInfo.from_xml(data)


def _head(storage: Storage, file: InputFile, plan: Plan, compression: str | None = None) -> tuple[str, Any, bool]:
    """(format, header for later ranges, whether byte ranges can be read on their own) of
    a file (uncompressed, or bz2), from its first bytes (and a dump's whole <siteinfo>)."""
    spec = file.spec
    with storage.open(file.uri, "rb") as raw:
        stream = bz2.BZ2File(raw) if compression == "bz2" else raw
        try:
            head = stream.read(_HEAD_BYTES)
        except (OSError, EOFError) as exc:
            raise InputDataError(f"{file.uri}: {exc}") from None
        used = len(head)
        try:
            fmt = spec.format if spec.format != "auto" else detect_format(file.uri, head)
            encoding = sniff(head, spec.encoding)
        except (InputError, ValueError) as exc:
            raise InputDataError(f"{file.uri}: {str(exc).removeprefix(file.uri + ': ')}") from None
        header: Any = None
        if fmt == "wikipedia" and splittable(encoding):
            raw.seek(0)
            stream = bz2.BZ2File(raw) if compression == "bz2" else raw
            stats = ReadStats()
            try:
                for _ in iter_raw_documents(
                    stream, fmt, name=file.uri, encoding=spec.encoding, owns=lambda _: False, stats=stats
                ):
                    pass
            except InputError as exc:
                raise InputDataError(str(exc)) from None
            header, used = stats.header, stats.decompressed_bytes
        elif fmt == "tsv":
            header = header_columns(fmt, head.split(b"\n", 1)[0], file.uri)
    plan.planning_bytes[file.index] = plan.planning_bytes.get(file.index, 0) + used
    return fmt, header, fmt in SPLITTABLE and (fmt == "parquet" or splittable(encoding))
