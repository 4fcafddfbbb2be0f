"""Which text encoding an input is in, and turning it into UTF-8 on the fly.

The readers (records.py) scan and parse UTF-8 bytes. An input is UTF-8 unless its first
bytes carry another byte-order mark (UTF-16/UTF-32 LE/BE) or start like UTF-16 XML
without one (`<\\x00` / `\\x00<`), or its input sets `encoding` (latin-1, cp1252, ...).
Anything else is re-encoded to UTF-8 block by block as it is read (`Transcoder`); byte
offsets in messages about such a file count bytes of that UTF-8 re-encoding, except a
decoding error, which names the byte of the original file.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import BinaryIO

_BOMS = (  # longest first: the UTF-32 LE mark starts with the UTF-16 LE one
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


@dataclass(frozen=True)
class Encoding:
    name: str
    """A codec name Python knows; "utf-8" means the bytes are used as they are."""
    bom: int
    """Bytes of byte-order mark at the start of the file (skipped)."""
    why: str
    """How it was chosen, for messages: "set on the input", "byte-order mark", "default"."""

    @property
    def is_utf8(self) -> bool:
        return codecs.lookup(self.name).name == "utf-8"

    def describe(self) -> str:
        return f"read as {self.name} ({self.why})"


def sniff(head: bytes, declared: str = "auto") -> Encoding:
    """The encoding of a file from its first bytes and the input's `encoding` setting.

    A byte-order mark that contradicts the declared encoding is an error (ValueError
    naming both): the setting is almost certainly wrong for this file."""
    found = next(((name, len(bom)) for bom, name in _BOMS if head.startswith(bom)), None)
    if declared != "auto":
        name = codecs.lookup(declared).name
        if found is not None and codecs.lookup(found[0]).name != name and not _bom_variant(name, found[0]):
            raise ValueError(f"starts with a {found[0]} byte-order mark but its input sets encoding: {declared}")
        bom = found[1] if found is not None and _bom_variant(name, found[0]) else 0
        return Encoding(declared, bom, "set on the input")
    if found is not None:
        return Encoding(found[0], found[1], "byte-order mark")
    if head[:2] == b"<\x00" and head[2:4] != b"\x00\x00":
        return Encoding("utf-16-le", 0, "XML without byte-order mark")
    if head[:2] == b"\x00<":
        return Encoding("utf-16-be", 0, "XML without byte-order mark")
    return Encoding("utf-8", 0, "default: no byte-order mark")


def _bom_variant(declared: str, found: str) -> bool:
    # encoding: utf-16 (no endianness) accepts either mark; utf-8 accepts its own (utf-8-sig)
    return declared in (found, found.rsplit("-", 1)[0], found.replace("-", "_")) or (
        declared == "utf-8" and found == "utf-8"
    )


def splittable(encoding: Encoding) -> bool:
    """Whether a byte range of the file can be read on its own: record boundaries
    (newline, `<page>`) are the same bytes in the file as in UTF-8."""
    return encoding.is_utf8


class TranscodeError(ValueError):
    """Bytes that are not valid in the file's encoding; `offset` is in the original file."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


class Transcoder:
    """A binary stream in any encoding read as UTF-8 bytes, block by block."""

    def __init__(self, stream: BinaryIO, encoding: Encoding, block: int):
        self.stream = stream
        self.encoding = encoding
        self.block = block
        self.decoder = codecs.getincrementaldecoder(encoding.name)("strict")
        self.consumed = 0  # bytes of the original stream handed to the decoder so far

    def read(self, size: int = -1) -> bytes:
        while True:
            data = self.stream.read(self.block)
            pending = len(self.decoder.getstate()[0])  # bytes of a character cut by the last block
            try:
                text = self.decoder.decode(data, final=not data)
            except UnicodeDecodeError as exc:
                at = self.consumed - pending + exc.start
                raise TranscodeError(f"invalid {self.encoding.name} at byte {at} ({exc.reason})", at) from None
            self.consumed += len(data)
            if text or not data:
                return text.encode("utf-8")
