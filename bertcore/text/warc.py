"""WARC and WET files -> `RawDocument`s: web pages with their URL, crawl date and media type.

warcio (the Web Archive's maintained reader) parses each record: the WARC headers, the HTTP
response inside it, and its transfer and content encodings. What bertpipe adds is finding
the records, so that one damaged record is counted and skipped instead of ending the file:

- a per-record gzip file (`.warc.gz`, `.wet.gz` as Common Crawl publishes them) arrives as
  its gzip members (bertcore/text/gzmembers.py); each member is handed to warcio on its own,
  and a member that does not decode or parse is one malformed record;
- a plain `.warc` (or a gzip file that is one stream) is read front to back: a record is its
  header block, a blank line and `Content-Length` bytes; a record whose header cannot be
  read is skipped up to the next line that starts with `WARC/1.`.

Which records are documents:
- `response` records with an HTTP 2xx status and an HTML payload (text/html,
  application/xhtml+xml): markup `html`, extracted later by bertcore/text/html.py; with a
  text/plain payload: plain text;
- `resource` records (a page saved without its HTTP exchange), by their Content-Type;
- `conversion` records (WET: the text Common Crawl extracted) as plain text.
Everything else (requests, metadata, warcinfo, revisits, redirects and errors, images) is
counted per kind in `ReadStats.extra["warc"]` and passed over. The payload's character set
comes from the HTTP Content-Type, else resiliparse's detector (HTML meta tags, then the
bytes themselves), and undecodable bytes are dropped rather than ending the record.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterator
from typing import BinaryIO

from bertcore.text.gzmembers import GzipMembers
from bertcore.text.reader import RawDocument, ReadStats, label

_HTML = ("text/html", "application/xhtml+xml")
_TEXT = ("text/plain",)
_RECORD_START = b"WARC/1."
_MAX_HEADER = 1 << 16  # bytes of one record's WARC header block
_BLOCK = 1 << 20


def _media_type(content_type: str | None) -> tuple[str, str]:
    """('text/html', 'utf-8') from 'text/html; charset=UTF-8'."""
    if not content_type:
        return "", ""
    parts = [p.strip() for p in content_type.split(";")]
    charset = next(
        (p.split("=", 1)[1].strip("\"' ").lower() for p in parts[1:] if p.lower().startswith("charset=")), ""
    )
    return parts[0].lower(), charset


def _decode(data: bytes, charset: str, html: bool) -> str:
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    encoding = charset
    if encoding:
        try:
            "".encode(encoding)
        except LookupError:
            encoding = ""
    if not encoding:
        encoding = detect_encoding(data, from_html_meta=html)
    return bytes_to_str(data, encoding)


def _document(record, offset: int, name: str, counts: Counter) -> RawDocument | None:
    """The document a parsed warcio record holds, or None (counted by kind)."""
    kind = record.rec_type
    headers = record.rec_headers
    if kind == "response":
        http = record.http_headers
        if http is None:
            counts["response_without_http"] += 1
            return None
        status = http.get_statuscode() or ""
        if not status.startswith("2"):
            counts[f"http_{status[:1] or 'x'}xx"] += 1
            return None
        media, charset = _media_type(http.get_header("Content-Type"))
    elif kind in ("resource", "conversion"):
        media, charset = _media_type(headers.get_header("Content-Type"))
        media = media or ("text/plain" if kind == "conversion" else "")
    else:
        counts[kind or "unknown"] += 1
        return None
    if media not in _HTML + _TEXT:
        counts["other_media"] += 1
        return None
    payload = record.content_stream().read()
    html = media in _HTML
    url = headers.get_header("WARC-Target-URI") or ""
    counts["documents"] += 1
    return RawDocument(
        title=url or f"{name}@{offset}",
        text=_decode(payload, charset, html),
        markup="html" if html else "plain",
        offset=offset,
        url=url,
        crawl_date=headers.get_header("WARC-Date") or "",
        content_type=media,
    )


def _parse(blob: bytes, offset: int, name: str, counts: Counter) -> Iterator[RawDocument]:
    """The documents in the bytes of one or more whole records (a gzip member, or one
    record of a plain file); a record warcio cannot parse counts as malformed."""
    from warcio.archiveiterator import ArchiveIterator

    try:
        for record in ArchiveIterator(io.BytesIO(blob), check_digests=False):
            counts["records"] += 1
            document = _document(record, offset, name, counts)
            if document is not None:
                yield document
    except Exception:  # noqa: BLE001 - warcio and the decoders raise many kinds on damaged bytes
        counts["malformed"] += 1


def _from_members(members: GzipMembers, name: str, counts: Counter) -> Iterator[RawDocument]:
    for member in members.members():
        if member.data is None:
            counts["malformed"] += 1
            continue
        yield from _parse(member.data, member.offset, name, counts)


class _Frames:
    """Whole records of a plain WARC stream as (offset, bytes), found by their headers."""

    def __init__(self, stream: BinaryIO, counts: Counter, stats: ReadStats):
        self.stream, self.counts, self.stats = stream, counts, stats
        self.buffer = b""
        self.at = 0  # stream offset of buffer[0]
        self.eof = False

    def _fill(self, size: int) -> bool:
        while len(self.buffer) < size and not self.eof:
            data = self.stream.read(_BLOCK)
            self.stats.decompressed_bytes += len(data)
            if not data:
                self.eof = True
            self.buffer += data
        return len(self.buffer) >= size

    def _drop(self, n: int) -> None:
        self.buffer = self.buffer[n:]
        self.at += n

    def _resync(self) -> None:
        """Skip to the next line that starts a record (a damaged record is counted once)."""
        self.counts["malformed"] += 1
        while True:
            found = self.buffer.find(b"\n" + _RECORD_START, 1)
            if found >= 0:
                self._drop(found + 1)
                return
            self._drop(max(0, len(self.buffer) - len(_RECORD_START)))
            if not self._fill(len(self.buffer) + _BLOCK) and self.eof and len(self.buffer) <= len(_RECORD_START):
                self._drop(len(self.buffer))
                return

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        while True:
            self._fill(_MAX_HEADER)
            self._drop(len(self.buffer) - len(self.buffer.lstrip(b"\r\n")))
            if not self.buffer and (self.eof or not self._fill(1)):
                return
            if not self.buffer.startswith(_RECORD_START):
                self._resync()
                continue
            end = self.buffer.find(b"\r\n\r\n", 0, _MAX_HEADER)
            length = None if end < 0 else _content_length(self.buffer[:end])
            if length is None:
                self._resync()
                continue
            size = end + 4 + length
            if not self._fill(size):
                self.stats.truncated_records += 1
                self.stats.truncated_bytes += len(self.buffer)
                self._drop(len(self.buffer))
                return
            yield self.at, self.buffer[:size]
            self._drop(size)


def _content_length(header: bytes) -> int | None:
    for line in header.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            try:
                n = int(value.strip())
            except ValueError:
                return None
            return n if n >= 0 else None
    return None


def iter_warc(stream: BinaryIO, name: str = "", stats: ReadStats | None = None) -> Iterator[RawDocument]:
    """The documents of a WARC or WET file: `stream` is its gzip members (`GzipMembers`,
    offsets are compressed member offsets) or its decompressed bytes (offsets in them).
    `stats.extra["warc"]` counts records per kind, documents and malformed records."""
    stats = stats if stats is not None else ReadStats()
    counts: Counter = stats.extra.setdefault("warc", Counter())
    name = label(name)
    if isinstance(stream, GzipMembers):
        yield from _from_members(stream, name, counts)
        stats.decompressed_bytes += stream.decoded_bytes
        return
    for offset, blob in _Frames(stream, counts, stats):
        yield from _parse(blob, offset, name, counts)
