"""The corpus stage's raw inputs: listing them with their content identity, planning the
work units that read them so that every input byte is decompressed once, and opening one
piece of a file for a task.

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
import contextlib
import lzma
import math
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from bertcore.errors import ConfigError, InputDataError
from bertcore.redact import mask_text
from bertcore.text.compressed import Bz2Blocks, open_gzip
from bertcore.text.config import CorpusConfig, InputSpec
from bertcore.text.encoding import sniff, splittable
from bertcore.text.multistream import Bz2Range, index_name, plan_ranges, stream_offsets
from bertcore.text.records import CHUNKABLE, SPLITTABLE, InputError, ReadStats, detect_format, iter_raw_documents
from bertcore.text.tabular import header_columns
from bertcore.text.wikisite import SiteInfo
from pipelines.content_id import HashCache, content_id
from pipelines.storage import Storage, is_hidden

_COMPRESSION = {".bz2": "bz2", ".gz": "gzip", ".xz": "xz", ".lzma": "xz", ".zst": "zstd", ".zstd": "zstd"}
_HEAD_BYTES = 64 << 10
_MAX_BUNDLE = 1000  # most small files in one unit


def compression_of(uri: str) -> str | None:
    return next((kind for suffix, kind in _COMPRESSION.items() if uri.lower().endswith(suffix)), None)


@dataclass(frozen=True)
class InputFile:
    index: int
    position: int
    """Its input's position in corpus.inputs."""
    uri: str
    spec: InputSpec
    source: str
    name: str
    """Path relative to its input (a folder or glob), the file name for a single file."""
    size: int
    content: str
    """Content identity (pipelines/content_id.py)."""


@dataclass(frozen=True)
class Piece:
    """What one reader reads of one file: all of it, a byte range, a range of multistream
    streams, or the bzip2 blocks that start in a compressed byte range."""

    file: InputFile
    kind: Literal["whole", "range", "streams", "blocks"] = "whole"
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


@dataclass
class Listing:
    files: list[InputFile]
    skipped: list[dict] = field(default_factory=list)
    identity: dict = field(default_factory=dict)


# -- listing --------------------------------------------------------------------------------


def _folder(storage: Storage, pattern: str) -> tuple[str, bool]:
    """The folder names are relative to, and whether the pattern is a folder itself."""
    fs, path = storage.fs(pattern)
    if any(ch in path for ch in "*?["):
        fixed = path[: min(path.index(ch) for ch in "*?[" if ch in path)]
        return fixed.rsplit("/", 1)[0] if "/" in fixed else "", False
    if fs.isdir(path):
        return path.rstrip("/"), True
    return posixpath.dirname(path), False


def _unmatched(key: str, reason: str) -> InputDataError:
    return InputDataError(f"{key}: {reason} (check the path, bucket and credentials)")


def check_local_inputs(cfg: CorpusConfig, storage: Storage) -> None:
    """The corpus stage's preflight: with `on_error: raise`, a local input that matches no
    file ends the run at once, in the words `list_inputs` would use tens of seconds later.
    Remote inputs wait for the stage (listing a bucket may be slow, and its errors need the
    retries the stage has)."""
    if cfg.on_error != "raise":
        return
    for position, spec in enumerate(cfg.inputs):
        if storage.local_path(spec.uri) is None:
            continue
        try:
            found = storage.list_files(spec.uri, include_hidden=True)
        except OSError:
            continue  # list_inputs reports it with its cause
        if not found.files and not found.skipped:
            raise _unmatched(f"corpus.inputs[{position}]", f"no file matches {spec.uri}")


def list_inputs(cfg: CorpusConfig, storage: Storage, cache: HashCache | None = None) -> Listing:
    """Expand the inputs into files with their content identity. Files a folder input
    holds under names starting with `.` or `_`, multistream indexes beside their dumps,
    and what a local folder walk does not follow or open (a symbolic link out of the
    folder or to a folder, a broken link, a FIFO, a socket, a device) are listed under
    `skipped` with the reason; so are inputs that match nothing when `on_error: skip`."""
    listing = Listing(files=[])
    cache = cache or HashCache()  # one connection for every file
    for position, spec in enumerate(cfg.inputs):
        key = f"corpus.inputs[{position}]"
        try:
            found = storage.list_files(spec.uri, include_hidden=True)
            matches = found.files
            folder, is_folder = _folder(storage, spec.uri)
        except Exception as exc:  # OSError, or a remote filesystem's own (an HTTP 401, a botocore error)
            text = " ".join(str(exc).split())[:300] or type(exc).__name__
            matches, folder, is_folder, reason = [], "", False, f"cannot list {spec.uri}: {text}"
        else:
            reason = f"no file matches {spec.uri}"
            # links out of the folder or to folders, FIFOs, sockets, devices: never opened
            listing.skipped += [{"file": uri, "reason": why} for uri, why in found.skipped]
            if found.skipped and not matches:
                reason = f"no regular file matches {spec.uri} ({found.skipped[0][0]}: {found.skipped[0][1]})"
        kept = []
        indexes = {index for other in matches if other.endswith(".bz2") for index in index_name(other)}
        for uri in matches:
            path = storage.fs(uri)[1]
            if is_folder and not spec.include_hidden and is_hidden(path, folder):
                listing.skipped.append({"file": uri, "reason": f"its name starts with . or _ (set include_hidden: true on {key} to read it)"})
            elif uri in indexes:
                listing.skipped.append({"file": uri, "reason": "the multistream index of a dump in the same input (used to split the dump)"})
            else:
                kept.append(uri)
        if not kept:
            if cfg.on_error == "raise":
                raise _unmatched(key, reason)
            listing.skipped.append({"file": spec.uri, "reason": reason})
            listing.identity[f"inputs[{position}]"] = "missing"
            continue
        source = spec.name or posixpath.basename(mask_text(spec.uri).rstrip("/")) or mask_text(spec.uri)
        entries = {}
        for uri in kept:
            info = storage.info(uri)
            path = storage.fs(uri)[1]
            name = path[len(folder) :].lstrip("/") if folder and path.startswith(folder) else posixpath.basename(path)
            size = int(info.get("size") or 0)
            file = InputFile(len(listing.files), position, uri, spec, source, name, size, content_id(storage, uri, info, cache))
            listing.files.append(file)
            entries[name] = {"size": size, "content": file.content}
        listing.identity[f"inputs[{position}]"] = {"source": source, "files": entries}
    return listing


def input_location_free(config: dict) -> dict:
    """The corpus section's JSON without where its inputs are (`uri`, `index`): the
    fingerprint takes their content identity instead, so moving the data changes nothing."""
    out = dict(config)
    out["inputs"] = [{k: v for k, v in spec.items() if k not in ("uri", "index")} for spec in config.get("inputs", [])]
    return out


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


def _byte_ranges(size: int, split_bytes: int) -> list[tuple[int, int | None]]:
    """[start, end) ranges of about `split_bytes` tiling `size` bytes; the last ends at None."""
    n = math.ceil(size / split_bytes)
    return [(i * size // n, (i + 1) * size // n if i + 1 < n else None) for i in range(n)]


def _find_index(file: InputFile, storage: Storage) -> str | None:
    if file.spec.index:
        if not storage.exists(file.spec.index):
            raise ConfigError(f"corpus.inputs[{file.position}].index: {file.spec.index} does not exist; fix the path or remove the key")
        return file.spec.index
    return next((candidate for candidate in index_name(file.uri) if storage.exists(candidate)), None)


def _stream_offsets(storage: Storage, index: str, file: InputFile) -> list[int]:
    with storage.open(index, "rb", compression="infer") as handle:
        try:
            offsets = stream_offsets(handle)
        except (ValueError, OSError, EOFError) as exc:
            raise InputDataError(f"{index}: not a multistream index ({exc}); remove `index` from corpus.inputs[{file.position}] or fix the file") from None
    if not offsets or offsets[-1] >= file.size:
        raise InputDataError(f"{index}: its stream offsets do not fit {file.uri} ({file.size} bytes): the index belongs to another dump")
    return offsets


def _multistream_header(storage: Storage, file: InputFile, offsets: list[int], plan: Plan) -> SiteInfo | None:
    """The <siteinfo> of a multistream dump, from its first stream; None when the file
    does not start like a MediaWiki export (then it is read as a single stream)."""
    with storage.open(file.uri, "rb") as raw:
        reader = Bz2Range(raw, 0, offsets[0])  # pauses at the first page stream
        try:
            data = b"".join(iter(reader.read, b""))
        except (OSError, EOFError, ValueError) as exc:
            raise InputDataError(f"{file.uri}: the first bzip2 stream cannot be read ({exc}); re-download the dump") from None
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
                for _ in iter_raw_documents(stream, fmt, name=file.uri, encoding=spec.encoding, owns=lambda _: False, stats=stats):
                    pass
            except InputError as exc:
                raise InputDataError(str(exc)) from None
            header, used = stats.header, stats.decompressed_bytes
        elif fmt == "tsv":
            header = header_columns(fmt, head.split(b"\n", 1)[0], file.uri)
    plan.planning_bytes[file.index] = plan.planning_bytes.get(file.index, 0) + used
    return fmt, header, fmt in SPLITTABLE and (fmt == "parquet" or splittable(encoding))


# -- reading one piece ------------------------------------------------------------------------


class _Counting:
    """A raw file that counts the bytes read from it."""

    def __init__(self, raw):
        self.raw, self.bytes = raw, 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.bytes += len(data)
        return data

    def readinto(self, buffer) -> int:
        n = self.raw.readinto(buffer)
        self.bytes += n or 0
        return n

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        """Bytes read so far (where a decompressor that fails has got to)."""
        return self.bytes

    def readable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return False


def _decompressed(raw: _Counting, compression: str | None):
    if compression == "bz2":
        return bz2.BZ2File(raw)
    if compression == "gzip":
        return open_gzip(raw)
    if compression == "xz":
        return lzma.LZMAFile(raw)
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False)
    return raw


@dataclass
class Opened:
    stream: Any
    arguments: dict
    """Keyword arguments of iter_raw_documents for this piece."""
    key: Callable[[int], tuple[int, int]]
    """A record's offset -> its order key (major, minor), the same however the file is cut."""
    raw: _Counting
    decoded: Callable[[], int] | None = None
    """Bytes the decompressor decoded, when that is more than it handed out."""

    @property
    def compressed_bytes(self) -> int:
        return self.raw.bytes


def reading_arguments(file: InputFile) -> dict:
    """Keyword arguments of iter_raw_documents that every piece of `file` shares."""
    return {"name": posixpath.basename(file.uri), "text_column": file.spec.text_column,
            "title_column": file.spec.title_column, "encoding": file.spec.encoding}


@contextlib.contextmanager
def open_piece(storage: Storage, piece: Piece) -> Iterator[Opened]:
    file = piece.file
    common = reading_arguments(file)
    with storage.open(file.uri, "rb") as handle:
        raw = _Counting(handle)
        if piece.kind == "streams":
            handle.seek(piece.start)
            streams = Bz2Range(raw, piece.start, piece.end)
            arguments = {"owns": streams.owns, "first": piece.start == 0, "header": piece.header}
            yield Opened(streams, {**common, **arguments}, streams.key, raw)
        elif piece.kind == "blocks":
            with Bz2Blocks(handle, piece.start, piece.end, file.size, line_records=piece.fmt != "wikipedia") as blocks:
                first = piece.start == 0
                arguments = {"owns": blocks.owns, "first": first, "aligned": first, "header": piece.header}
                yield Opened(blocks, {**common, **arguments}, blocks.key, blocks.window, lambda: blocks.decoded_bytes)
        elif piece.kind == "range" and piece.fmt == "parquet":
            yield Opened(handle, {**common, "start": piece.start, "end": piece.end}, lambda o: (o, 0), raw)
        elif piece.kind == "range":
            aligned = True
            if piece.start > 0:
                handle.seek(piece.start - 1)
                aligned = handle.read(1) == b"\n"
            arguments = {"start": piece.start, "end": piece.end, "aligned": aligned, "header": piece.header}
            yield Opened(raw, {**common, **arguments}, lambda o: (o, 0), raw)
        elif piece.fmt == "parquet" or (piece.fmt == "auto" and file.uri.lower().endswith(".parquet")):
            yield Opened(handle, common, lambda o: (o, 0), raw)
        else:
            compression = compression_of(file.uri)
            stream = _decompressed(raw, compression)
            try:
                yield Opened(stream, common, lambda o: (o, 0), raw)
            finally:
                if stream is not raw:
                    stream.close()
