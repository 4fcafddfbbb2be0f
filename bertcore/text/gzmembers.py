"""Per-record gzip files (how Common Crawl publishes WARC and WET files): one gzip member
per record, so a task can start at any member and many tasks can share one file.

A gzip member starts with the bytes 1f 8b 08 and decodes on its own. A task given the
compressed byte range [start, stop) reads the members whose first byte lies in its range:
it scans from `start` for the magic bytes and takes the first place where they begin a
member that decodes to a WARC record (`WARC/`), then follows the members one after the
other (each member's end is where the next begins) until one starts at or past `stop`.
So ranges that tile a file decode every member once, and which task reads a record does
not depend on how the file was cut. A member that does not decode (damaged bytes) is
counted and skipped: reading goes on at the next place where a member decodes.

zlib (Python's standard library) decodes the members; nothing here holds more than one
member's decoded bytes, and a member over `max_bytes` (a record no cleaning would keep) is
decoded to find its end, then skipped and counted.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

MAGIC = b"\x1f\x8b\x08"
_READ = 1 << 16  # compressed bytes per read: what a range reads past its last member is at most this
_PROBE = 4096  # compressed bytes decoded to check that a candidate starts a WARC member
_HEAD_MEMBER = 1 << 20  # per_record: the first member must end within this many compressed bytes


def _starts_warc(data: bytes) -> bool:
    """Whether a gzip member starts at data[0] and decodes to a WARC record's first bytes."""
    try:
        out = zlib.decompressobj(31).decompress(data[:_PROBE], 16)
    except zlib.error:
        return False
    return out.startswith(b"WARC/")


def per_record(head: bytes) -> bool:
    """Whether a gzip file whose first bytes are `head` holds a WARC record per member: its
    first member decodes to a WARC record and ends within `head` (and within 1 MiB), where
    the next member or the end of the file follows."""
    if not _starts_warc(head):
        return False
    decoder = zlib.decompressobj(31)
    data = head[:_HEAD_MEMBER]
    try:
        while data and not decoder.eof:
            decoder.decompress(data, 1 << 16)
            data = decoder.unconsumed_tail
    except zlib.error:
        return False
    return decoder.eof and (not decoder.unused_data or decoder.unused_data.startswith(MAGIC))


@dataclass(frozen=True)
class Member:
    offset: int
    """Compressed byte offset of the member in the file."""
    data: bytes | None
    """Its decoded bytes; None when it was skipped (see `problem`)."""
    problem: str = ""
    """Why it was skipped: damaged (does not decode) or oversized."""


class GzipMembers:
    """The members of a per-record gzip file that start in the compressed byte range
    [start, stop) (`stop` None: to the end), read front to back from `raw`, which the
    caller has positioned at `start`. `compressed_read` counts the raw bytes read."""

    def __init__(self, raw: BinaryIO, start: int = 0, stop: int | None = None, max_bytes: int = 256 << 20):
        self.raw, self.start, self.stop, self.max_bytes = raw, start, stop, max_bytes
        self.compressed_read = 0
        self.decoded_bytes = 0
        self._buffer = b""
        self._at = start  # file offset of _buffer[0]

    def _more(self) -> bool:
        data = self.raw.read(_READ)
        self.compressed_read += len(data)
        self._buffer += data
        return bool(data)

    def _drop(self, n: int) -> None:
        self._buffer = self._buffer[n:]
        self._at += n

    def _owns(self, offset: int) -> bool:
        return self.stop is None or offset < self.stop

    def _find(self) -> bool:
        """Move to the next place at or after the current one where a WARC member starts;
        False at the end of the file or past the range."""
        while True:
            at = self._buffer.find(MAGIC)
            while at >= 0:
                if not self._owns(self._at + at):
                    return False
                if len(self._buffer) - at < _PROBE and self._more():
                    at = self._buffer.find(MAGIC)
                    continue
                if _starts_warc(self._buffer[at:]):
                    self._drop(at)
                    return True
                at = self._buffer.find(MAGIC, at + 1)
            keep = len(MAGIC) - 1
            if not self._owns(self._at + max(0, len(self._buffer) - keep)):
                return False
            self._drop(max(0, len(self._buffer) - keep))
            if not self._more():
                return False

    def members(self) -> Iterator[Member]:
        """The range's members in file order; damaged or oversized ones with data None."""
        if not self._find():
            return
        while self._buffer or self._more():
            if not self._owns(self._at):
                return
            offset = self._at
            decoder = zlib.decompressobj(31)
            pieces, size, used = [], 0, 0
            try:
                while not decoder.eof:
                    if used >= len(self._buffer) and not self._more():
                        raise zlib.error("the file ends inside this member")
                    block = decoder.decompress(self._buffer[used:], _READ)
                    # after the end of the member zlib leaves the rest in unused_data (and may leave it in
                    # unconsumed_tail as well); before it, in unconsumed_tail only
                    used = len(self._buffer) - len(decoder.unused_data if decoder.eof else decoder.unconsumed_tail)
                    size += len(block)
                    if size <= self.max_bytes:
                        pieces.append(block)
            except zlib.error as exc:
                yield Member(offset, None, f"damaged gzip member at compressed byte {offset} ({exc})")
                self._drop(1)
                if not self._find():
                    return
                continue
            self._drop(used)
            self.decoded_bytes += size
            if size > self.max_bytes:
                yield Member(offset, None, f"gzip member at compressed byte {offset} decodes to {size} bytes")
            else:
                yield Member(offset, b"".join(pieces))
            if len(self._buffer) < len(MAGIC):
                self._more()
            if not self._buffer:
                return
            if not self._buffer.startswith(MAGIC) and not self._find():
                return  # bytes after a member that start no other one: skipped up to the next member
