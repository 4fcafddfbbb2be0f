"""How a task opens its piece of an input file (a unit's `Piece`, units.py): the stream
its records are read from, decompressed where the piece needs it, with the reader's
arguments, the record order key and the count of compressed bytes read.
"""

from __future__ import annotations

import bz2
import contextlib
import lzma
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bertcore.text.compressed import Bz2Blocks, open_gzip
from bertcore.text.gzmembers import GzipMembers, per_record
from bertcore.text.multistream import Bz2Range
from pipelines.stages.corpus.inputs import InputFile
from pipelines.stages.corpus.units import MEMBER_HEAD, Piece, compression_of, is_warc
from pipelines.storage import Storage


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
    return {
        "name": posixpath.basename(file.uri),
        "text_column": file.spec.text_column,
        "title_column": file.spec.title_column,
        "encoding": file.spec.encoding,
    }


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
        elif piece.kind == "members":
            handle.seek(piece.start)
            yield Opened(GzipMembers(raw, piece.start, piece.end), common, lambda o: (o, 0), raw)
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
        elif compression_of(file.uri) == "gzip" and is_warc(file) and per_record(handle.read(MEMBER_HEAD)):
            handle.seek(0)
            yield Opened(GzipMembers(raw), common, lambda o: (o, 0), raw)
        else:
            handle.seek(0)
            compression = compression_of(file.uri)
            stream = _decompressed(raw, compression)
            try:
                yield Opened(stream, common, lambda o: (o, 0), raw)
            finally:
                if stream is not raw:
                    stream.close()
