"""Multistream .bz2 dumps: many bzip2 streams back to back, and an index that says where
each stream starts, so that a task can seek to a stream and decompress only its share.

Wikimedia publishes `*-pages-articles-multistream.xml.bz2` beside
`*-pages-articles-multistream-index.txt.bz2`: the first stream holds the <siteinfo>
header, then each stream holds 100 whole pages, and the last one the closing
</mediawiki>. Each index line is `offset:page_id:title`, the offset being that of the
stream (in the compressed file) holding the page.

`Bz2Range` decompresses the streams of one range [start, stop) of compressed offsets and,
when asked for more, goes on into the following streams (a page that does not end with
its stream is finished by the range it starts in). It knows where each stream began, so
a page is keyed by (its stream's compressed offset, its byte offset inside that stream's
data): the same key whichever range read it.
"""

from __future__ import annotations

import bisect
import bz2
from collections.abc import Iterable
from typing import BinaryIO

_CHUNK = 1 << 16  # compressed bytes fed at a time


def index_name(dump: str) -> list[str]:
    """Where Wikimedia puts the index of a multistream dump (…-multistream.xml.bz2 ->
    …-multistream-index.txt.bz2, or the plain .txt)."""
    stem = dump[: -len(".xml.bz2")] if dump.endswith(".xml.bz2") else dump.removesuffix(".bz2")
    return [f"{stem}-index.txt.bz2", f"{stem}-index.txt"]


def stream_offsets(index_lines: Iterable[bytes]) -> list[int]:
    """The distinct stream offsets of an index (`offset:page_id:title` lines), sorted.
    ValueError names the first line that is not of that form."""
    offsets: set[int] = set()
    for number, line in enumerate(index_lines, 1):
        line = line.strip()
        if not line:
            continue
        head = line.split(b":", 1)[0]
        if not head.isdigit():
            raise ValueError(f"line {number} is not offset:page_id:title ({line[:60]!r})")
        offsets.add(int(head))
    return sorted(offsets)


def plan_ranges(offsets: list[int], split_bytes: int) -> list[tuple[int, int | None]]:
    """Ranges [start, stop) of compressed offsets of about `split_bytes` each, cut at stream
    starts: the first from 0 (the header stream), the last to the end of the file (None)."""
    starts = [0] + [o for o in offsets if o > 0]
    ranges: list[tuple[int, int | None]] = []
    begin = 0
    for offset in starts[1:]:
        if offset - begin >= split_bytes:
            ranges.append((begin, offset))
            begin = offset
    ranges.append((begin, None))
    return ranges


class Bz2Range:
    """The decompressed bytes of the bzip2 streams from compressed offset `start` on (the
    raw file is positioned there), with the position where stream `stop` begins. Reads
    pause there (return b"") until `paused` is cleared."""

    def __init__(self, raw: BinaryIO, start: int, stop: int | None):
        self.raw = raw
        self.stop = stop
        self.compressed = start  # compressed offset of the next byte to decompress
        self.decompressed = 0  # bytes handed out so far
        self.compressed_read = 0
        self.boundary: int | None = None  # decompressed position where stream `stop` begins
        self.paused = False  # at `stop`: reads return b"" until the reader unpauses
        self.starts: list[int] = []  # decompressed position of each stream start ...
        self.offsets: list[int] = []  # ... and its compressed offset
        self._decompressor: bz2.BZ2Decompressor | None = None
        self._input = b""

    def owns(self, position: int) -> bool:
        """Whether a page starting at this decompressed position is in the range."""
        return self.boundary is None or position < self.boundary

    def key(self, position: int) -> tuple[int, int]:
        """(compressed offset of the stream holding `position`, offset inside its data)."""
        i = bisect.bisect_right(self.starts, position) - 1
        return self.offsets[i], position - self.starts[i]

    def _at_stop(self) -> bool:
        """Whether reads pause here: the next stream is the first one past the range."""
        if self.stop is None or self.compressed < self.stop:
            return False
        if self.boundary is None:
            if self.compressed != self.stop:
                raise ValueError(
                    f"no bzip2 stream starts at byte {self.stop} (the index says one does; the last stream "
                    f"before it ends at byte {self.compressed}): the index does not belong to this dump"
                )
            self.boundary = self.decompressed
            self.paused = True
        return self.paused

    def read(self, size: int = -1) -> bytes:
        while True:
            if self._decompressor is None and self._at_stop():
                return b""
            if not self._input:
                self._input = self.raw.read(_CHUNK)
                self.compressed_read += len(self._input)
                if not self._input:
                    if self._decompressor is not None:
                        raise EOFError(
                            f"compressed file ended inside the bzip2 stream starting at byte {self.offsets[-1]}"
                        )
                    return b""
            if self._decompressor is None:
                self.starts.append(self.decompressed)
                self.offsets.append(self.compressed)
                self._decompressor = bz2.BZ2Decompressor()
            data, self._input = self._input, b""
            out = self._decompressor.decompress(data)
            used = len(data)
            if self._decompressor.eof:
                self._input = self._decompressor.unused_data
                used -= len(self._input)
                self._decompressor = None
            self.compressed += used
            self.decompressed += len(out)
            if out:
                return out


def write_multistream(
    header: bytes,
    pages: Iterable[tuple[int, str, bytes]],
    footer: bytes,
    out: BinaryIO,
    index: BinaryIO,
    pages_per_stream: int = 100,
) -> None:
    """Write a multistream dump as Wikimedia does: the header in one stream, then
    `pages_per_stream` pages per stream, the footer in the last; and its index lines
    (`offset:page_id:title`). `pages` yields (page id, title, bytes of <page>...</page>)."""
    out.write(bz2.compress(header))
    batch: list[tuple[int, str, bytes]] = []

    def flush() -> None:
        offset = out.tell()
        out.write(bz2.compress(b"".join(page for _, _, page in batch)))
        index.write(b"".join(f"{offset}:{page_id}:{title}\n".encode() for page_id, title, _ in batch))
        batch.clear()

    for page in pages:
        batch.append(page)
        if len(batch) == pages_per_stream:
            flush()
    if batch:
        flush()
    out.write(bz2.compress(footer))


def split_dump(xml: bytes) -> tuple[bytes, list[tuple[int, str, bytes]], bytes]:
    """An uncompressed dump as (header, pages as (page id, title, bytes), footer): what
    `write_multistream` takes, to turn a single-stream dump into a multistream one."""
    first = xml.index(b"<page>")
    last = xml.rindex(b"</page>") + len(b"</page>")
    pages = []
    start = first
    while start < last:
        end = xml.index(b"</page>", start) + len(b"</page>")
        page = xml[start:end]
        title = page[page.index(b"<title>") + 7 : page.index(b"</title>")].decode()
        page_id = int(page[page.index(b"<id>") + 4 : page.index(b"</id>")])
        pages.append((page_id, title, xml[start:end] + b"\n"))
        nxt = xml.find(b"<page>", end)
        start = nxt if nxt >= 0 else last
    return xml[:first], pages, xml[last:]
