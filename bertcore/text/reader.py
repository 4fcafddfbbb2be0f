"""What every input format shares: the record type, the error type, and block reads over a
decompressed stream that count bytes, detect the encoding and turn decompressor and
decoding failures into `InputError` at the byte offset reached."""

from __future__ import annotations

import lzma
import zlib
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Literal

from bertcore.text.encoding import Encoding, TranscodeError, Transcoder, sniff

BLOCK = 1 << 20  # bytes per read
TAIL_BLOCK = 1 << 16  # bytes per read past a range's end
MARGIN = 64  # bytes read past a range's end before it stops (a tag straddling the end is seen whole)


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
    markup: Literal["wikitext", "plain", "html"]
    offset: int  # byte offset in the decompressed input, for ordering and error messages
    namespace: int = 0
    redirect: bool = False
    url: str = ""
    """Web records: the URL the page was fetched from (WARC-Target-URI)."""
    crawl_date: str = ""
    """Web records: when it was fetched (WARC-Date, ISO 8601)."""
    content_type: str = ""
    """Web records: the media type of the payload (text/html, text/plain)."""


@dataclass
class ReadStats:
    """What reading one stream (or one range of it) found, filled in as it is read."""

    decompressed_bytes: int = 0
    """Bytes the decompressed stream handed out (the file's own bytes when uncompressed)."""
    truncated_records: int = 0
    """Records cut off by the end of the file (a dump that ends inside a page)."""
    truncated_bytes: int = 0
    """Bytes after the last complete record of a file that ends without its closing tag."""
    encoding: str = ""
    header: Any = None
    """What the file's header says: a wiki's SiteInfo, a table's column names."""
    extra: dict = field(default_factory=dict)


def label(name: str) -> str:
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


class _Counted:
    def __init__(self, stream: BinaryIO, stats: ReadStats):
        self.stream, self.stats = stream, stats

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.stats.decompressed_bytes += len(data)
        return data


class Prefixed:
    """Bytes already read, then the rest of a stream."""

    def __init__(self, prefix: bytes, stream):
        self.prefix, self.stream = prefix, stream

    def read(self, size: int = -1) -> bytes:
        if self.prefix:
            data, self.prefix = self.prefix, b""
            return data
        return self.stream.read(size)


def peek(stream: BinaryIO, size: int) -> tuple[bytes, Any]:
    """(the first `size` bytes of a stream, or all of a shorter one; the stream from its
    first byte again). Reads that return less are repeated."""
    pieces: list[bytes] = []
    while sum(map(len, pieces)) < size and (data := stream.read(size - sum(map(len, pieces)))):
        pieces.append(data)
    head = b"".join(pieces)
    return head, Prefixed(head, stream)


class Reader:
    """Block reads over a decompressed stream, as UTF-8 whatever the file's encoding.

    `offset` is the absolute position of the next byte handed out (`base` + bytes read;
    for a re-encoded file, bytes of its UTF-8 re-encoding).

    A range reader reads no further than it must: past its `end` (or, for a multistream
    range, past the start of the next range's first stream), reads stop as soon as no
    record is open (`record_open`, kept by the format's scanner); `stopped` then tells
    that apart from the end of the file. So neighbouring ranges share at most `MARGIN`
    bytes plus the one record that crosses the boundary."""

    def __init__(self, stream: BinaryIO, name: str, stats: ReadStats, base: int = 0, end: int | None = None):
        self.name = name
        self.stats = stats
        self.source = stream
        self.stream: Any = _Counted(stream, stats)
        self.offset = base
        self.end = end
        self.record_open = False
        self.stopped = False
        self.encoding = Encoding("utf-8", 0, "default: no byte-order mark")
        self._pending = b""

    def head(self, size: int) -> bytes:
        """At least `size` bytes from the current position (fewer only at EOF), left to be
        read again: a stream may return short reads."""
        pieces = [self._pending] if self._pending else []
        self._pending = b""
        while sum(map(len, pieces)) < size and (block := self._read_block(self._size())):
            pieces.append(block)
        data = b"".join(pieces)
        self._pending = data
        return data

    def detect_encoding(self, declared: str) -> Encoding:
        """Read the byte-order mark (skipped) and choose the encoding; a non-UTF-8 file is
        re-encoded from here on."""
        head = self.head(4)
        try:
            self.encoding = sniff(head, declared)
        except ValueError as exc:
            raise InputError(f"{label(self.name)}: {exc}; remove the setting or fix it", 0) from None
        self.stats.encoding = self.encoding.name
        rest, self._pending = self._pending[self.encoding.bom :], b""
        self.offset += self.encoding.bom
        if not self.encoding.is_utf8:
            self.stream = Transcoder(Prefixed(rest, self.stream), self.encoding, BLOCK)
        else:
            self._pending = rest
        return self.encoding

    def _read_block(self, size: int = BLOCK) -> bytes:
        try:
            return self.stream.read(size)
        except TranscodeError as exc:
            raise InputError(
                f"{label(self.name)}: {exc}; the file was {self.encoding.describe()}: set `encoding` on this input "
                "to the encoding the file is in",
                exc.offset,
            ) from None
        except Exception as exc:
            if not _is_decompression_error(exc):
                raise
            raise InputError(
                f"{label(self.name)}: the compressed data is truncated or corrupt "
                f"({type(exc).__name__}: {exc}) after byte {self.offset} of decompressed data; "
                "re-download or re-compress the file",
                self.offset,
            ) from exc

    def _size(self) -> int:
        """Bytes to ask for: a block, or what is left up to just past the range's end."""
        if self.end is None:
            return BLOCK
        if self.offset >= self.end:
            return TAIL_BLOCK  # finishing the record that crosses the end: small reads
        return max(MARGIN, min(BLOCK, self.end + MARGIN - self.offset))

    def read(self) -> bytes:
        if self._pending:
            data, self._pending = self._pending, b""
        elif self.end is not None and self.offset >= self.end + MARGIN and not self.record_open:
            self.stopped = True
            return b""
        else:
            size = self._size()
            data = self._read_block(size)
            if not data and getattr(self.source, "paused", False):  # a multistream range reached its end
                if not self.record_open:
                    self.stopped = True
                    return b""
                self.source.paused = False  # finish the open record in the next stream
                data = self._read_block(size)
        self.offset += len(data)
        return data

    def decode(self, data: bytes, offset: int, where: str = "") -> str:
        """UTF-8 bytes of the file (or of its re-encoding) as text; an InputError naming the
        byte and the encoding the file was read as when they are not valid."""
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            at = offset + exc.start
            raise InputError(
                f"{label(self.name)}: invalid UTF-8 at byte {at}{where}; the file was {self.encoding.describe()}: "
                "if it is in another encoding set `encoding` on this input (e.g. latin-1, cp1252, utf-16) "
                "or convert it (iconv -f LATIN1 -t UTF-8)",
                at,
            ) from None
