"""Single-stream compressed inputs read in pieces, on small files made here: a .bz2 cut into
compressed byte ranges (each task decodes the blocks that start in its range) and a .gz
cut into chunks of whole records give the same documents, in the same order, as one
reader; a truncated file is one error naming the file and an offset."""

from __future__ import annotations

import bz2
import gzip
import json
import random

import pytest

from bertcore.config import StorageConfig
from bertcore.text.config import CorpusConfig
from bertcore.text.records import InputError, ReadStats, iter_raw_documents, record_chunks
from pipelines.content_id import HashCache
from pipelines.stages.corpus.inputs import list_inputs
from pipelines.stages.corpus.pieces import open_piece
from pipelines.stages.corpus.units import plan_units
from pipelines.storage import Storage

WORDS = [f"w{i}" for i in range(3000)]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def wiki_xml(pages: int = 300) -> bytes:
    rng = random.Random(0)
    head = '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">\n<siteinfo><sitename>Test</sitename>'
    head += '<namespaces><namespace key="0" case="first-letter" /></namespaces></siteinfo>\n'
    body = "".join(
        f"<page>\n<title>Page {i}</title>\n<ns>0</ns>\n<id>{i + 1}</id>\n"
        f"<revision><text>{_text(rng, 400 + 37 * (i % 11))}</text></revision>\n</page>\n"
        for i in range(pages)
    )
    return (head + body + "</mediawiki>\n").encode()


def jsonl(lines: int = 4000) -> bytes:
    rng = random.Random(1)
    return "".join(json.dumps({"text": f"record {i}: {_text(rng, 20 + i % 30)}"}) + "\n" for i in range(lines)).encode()


def read_pieces(path, fmt: str, split_bytes: int, uri: str | None = None):
    """(order key, title, text) of every record, reading each planned piece on its own; and
    the units' piece kinds and the decompressed bytes they handed out."""
    storage = Storage(StorageConfig())
    cfg = CorpusConfig(inputs=[{"uri": uri or str(path), "format": fmt}], split_bytes=split_bytes)
    files = list_inputs(cfg, storage, HashCache(path.parent / "hash-cache")).files
    plan = plan_units(cfg, files, storage)
    records, decompressed = [], 0
    for unit in plan.units:
        for piece in unit.pieces:
            stats = ReadStats()
            with open_piece(storage, piece) as opened:
                for doc in iter_raw_documents(opened.stream, piece.fmt, stats=stats, **opened.arguments):
                    records.append((opened.key(doc.offset), doc.title, doc.text))
                decompressed += opened.decoded() if opened.decoded else stats.decompressed_bytes
    return sorted(records), [(p.kind, u.streamed) for u in plan.units for p in u.pieces], decompressed


def whole(data: bytes, fmt: str):
    return [(d.title, d.text) for d in iter_raw_documents(_Bytes(data), fmt, name="x")]


class _Bytes:
    def __init__(self, data: bytes):
        self.data, self.position = data, 0

    def read(self, size: int = -1) -> bytes:
        out = self.data[self.position : None if size < 0 else self.position + size]
        self.position += len(out)
        return out


def gzip_chunks(
    tmp_path, path, content: bytes, fmt: str = "jsonl", chunk_bytes: int = 10_000, stats: ReadStats | None = None
):
    """Write `content` to `path` and read it as a corpus input, the one streamed unit's
    record chunks (raises what the reader raises)."""
    path.write_bytes(content)
    storage = Storage(StorageConfig())
    cfg = CorpusConfig(inputs=[{"uri": str(path), "format": fmt}], split_bytes=chunk_bytes)
    (unit,) = plan_units(cfg, list_inputs(cfg, storage, HashCache(tmp_path / "c")).files, storage).units
    assert unit.streamed
    with open_piece(storage, unit.pieces[0]) as opened:
        return list(record_chunks(opened.stream, fmt, chunk_bytes, name=path.name, stats=stats))


@pytest.mark.parametrize("fmt", ["wikipedia", "jsonl"])
def test_single_stream_bz2_in_block_ranges_gives_one_readers_documents(tmp_path, fmt):
    data = wiki_xml() if fmt == "wikipedia" else jsonl()
    path = tmp_path / f"input.{'xml' if fmt == 'wikipedia' else 'jsonl'}.bz2"
    path.write_bytes(bz2.compress(data, 1))  # 100 kB blocks: many blocks in a small file
    expected = whole(data, fmt) if fmt == "wikipedia" else [text for _, text in whole(data, fmt)]
    keys = None
    for split in (60_000, 23_456, 9_000):
        records, kinds, decompressed = read_pieces(path, fmt, split)
        assert (
            {kind for kind, _ in kinds} == {"blocks"} and not any(streamed for _, streamed in kinds) and len(kinds) > 3
        )
        assert [(title, text) if fmt == "wikipedia" else text for _, title, text in records] == expected
        # keys name the block a record starts in: the same whichever range read it
        keys = keys or [key for key, *_ in records]
        assert [key for key, *_ in records] == keys
        # every block handed out once, but for what finishes a range's last record (read
        # 64 kB at a time) and what the range's last read took past its blocks (64 kB)
        assert len(data) <= decompressed <= len(data) + (len(kinds) - 1) * 140_000
    # a file no larger than split_bytes is read whole, as before
    records, kinds, decompressed = read_pieces(path, fmt, path.stat().st_size)
    assert kinds == [("whole", False)] and decompressed == len(data)
    assert [(title, text) if fmt == "wikipedia" else text for _, title, text in records] == expected


def test_multistream_dump_without_its_index_is_read_in_block_ranges(tmp_path):
    """Many bzip2 streams back to back (a multistream dump whose index is missing, or
    pbzip2 output): the block finder crosses the stream headers."""
    import io

    from bertcore.text.multistream import split_dump, write_multistream

    data = wiki_xml()
    out, index = io.BytesIO(), io.BytesIO()
    write_multistream(*split_dump(data), out, index, pages_per_stream=7)
    path = tmp_path / "dump-multistream.xml.bz2"
    path.write_bytes(out.getvalue())
    records, kinds, _ = read_pieces(path, "wikipedia", 30_000)
    assert {kind for kind, _ in kinds} == {"blocks"} and len(kinds) > 3
    assert [(title, text) for _, title, text in records] == whole(data, "wikipedia")


def test_block_ranges_pause_where_the_next_range_begins(tmp_path):
    """Read up to the pause, ranges hand out the file's data exactly once, in order."""
    from bertcore.text.compressed import Bz2Blocks

    data = jsonl()
    path = tmp_path / "input.jsonl.bz2"
    path.write_bytes(bz2.compress(data, 1))
    size = path.stat().st_size
    for n in (1, 3, 7):
        pieces = []
        for i in range(n):
            start, stop = i * size // n, ((i + 1) * size // n if i + 1 < n else None)
            with open(path, "rb") as raw, Bz2Blocks(raw, start, stop, size) as blocks:
                pieces.append(b"".join(iter(lambda: blocks.read(1 << 16), b"")))
                assert blocks.paused == (stop is not None)
        assert b"".join(pieces) == data


def test_block_keys_are_file_bit_offsets_of_block_magic(tmp_path):
    data = jsonl()
    path = tmp_path / "input.jsonl.bz2"
    compressed = bz2.compress(data, 1)
    path.write_bytes(compressed)
    records, _, _ = read_pieces(path, "jsonl", 30_000)
    bits = sorted({key[0] for key, *_ in records})
    assert bits[0] == 32  # the first block's magic follows the 4-byte stream header
    number = int.from_bytes(compressed, "big")
    for bit in bits:  # a bzip2 block magic (0x314159265359) starts at each key's bit offset
        assert (number >> (len(compressed) * 8 - bit - 48)) & (2**48 - 1) == 0x314159265359


@pytest.mark.parametrize("fmt", ["wikipedia", "jsonl"])
def test_gzip_chunks_of_whole_records_give_one_readers_documents(tmp_path, fmt):
    data = wiki_xml() if fmt == "wikipedia" else jsonl()
    path = tmp_path / f"input.{'xml' if fmt == 'wikipedia' else 'jsonl'}.gz"
    stats, records = ReadStats(), []
    chunks = gzip_chunks(tmp_path, path, gzip.compress(data), fmt, 50_000, stats)
    assert len(chunks) > 5 and stats.decompressed_bytes == len(data) and b"".join(c.data for c in chunks) == data
    header = None
    for chunk in chunks:
        docs = list(
            iter_raw_documents(
                chunk.stream(), fmt, name=path.name, start=chunk.offset, first=chunk.offset == 0, header=header
            )
        )
        assert all(chunk.offset <= d.offset < chunk.offset + len(chunk.data) for d in docs)
        records += [(d.offset, d.title, d.text) for d in docs]
    full = list(iter_raw_documents(_Bytes(data), fmt, name=path.name))
    assert records == [(d.offset, d.title, d.text) for d in full]


def test_truncated_bz2_range_is_one_error_naming_the_offset(tmp_path):
    data = wiki_xml(1200)  # the driver reads the head (1 MiB) before the cut
    path = tmp_path / "cut.xml.bz2"
    compressed = bz2.compress(data, 1)
    path.write_bytes(compressed[: len(compressed) * 2 // 3])
    with pytest.raises(InputError) as caught:
        read_pieces(path, "wikipedia", 30_000)
    message = str(caught.value)
    assert "cut.xml.bz2" in message and "compressed byte" in message and "truncated or corrupt" in message
    assert "\n" not in message


def test_truncated_gzip_is_one_error_naming_the_offset(tmp_path):
    compressed = gzip.compress(jsonl())
    with pytest.raises(InputError) as caught:
        gzip_chunks(tmp_path, tmp_path / "cut.jsonl.gz", compressed[: len(compressed) // 2])
    message = str(caught.value)
    assert "cut.jsonl.gz" in message and "compressed byte" in message and "\n" not in message


def test_gzip_of_several_members_is_read_whole_and_a_cut_member_is_an_error(tmp_path):
    data = jsonl()
    half = len(data) // 2
    members = gzip.compress(data[:half]) + gzip.compress(data[half:])
    assert b"".join(c.data for c in gzip_chunks(tmp_path, tmp_path / "two.jsonl.gz", members)) == data
    with pytest.raises(InputError, match="cut.jsonl.gz: .*truncated or corrupt"):
        gzip_chunks(tmp_path, tmp_path / "cut.jsonl.gz", members[: len(members) - 500])


def test_a_gzip_with_a_damaged_byte_is_one_error(tmp_path):
    """A flipped byte in the deflate data: either the data cannot be decoded or the
    member's CRC-32 does not match; both end in one line naming the file."""
    compressed = bytearray(gzip.compress(jsonl()))
    compressed[len(compressed) // 2] ^= 0xFF
    with pytest.raises(InputError) as caught:
        gzip_chunks(tmp_path, tmp_path / "flipped.jsonl.gz", bytes(compressed))
    message = str(caught.value)
    assert "flipped.jsonl.gz" in message and "gzip data" in message and "\n" not in message


def test_bz2_block_ranges_and_gzip_read_from_s3(tmp_path, s3_bucket, monkeypatch):
    """The libraries read through the storage layer's file objects: the same records from
    s3:// (moto server on 127.0.0.1) as from local disk."""
    import boto3

    endpoint, bucket = s3_bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    data = wiki_xml()
    local = tmp_path / "dump.xml.bz2"
    local.write_bytes(bz2.compress(data, 1))
    client.upload_file(str(local), bucket, "raw/dump.xml.bz2")
    remote, kinds, _ = read_pieces(local, "wikipedia", 40_000, uri=f"s3://{bucket}/raw/dump.xml.bz2")
    assert {kind for kind, _ in kinds} == {"blocks"} and remote == read_pieces(local, "wikipedia", 40_000)[0]
    gz = tmp_path / "dump.xml.gz"
    gz.write_bytes(gzip.compress(data))
    client.upload_file(str(gz), bucket, "raw/dump.xml.gz")
    storage = Storage(StorageConfig())
    with storage.open(f"s3://{bucket}/raw/dump.xml.gz", "rb") as handle:
        from bertcore.text.compressed import open_gzip

        stream = open_gzip(handle)
        try:
            assert b"".join(iter(lambda: stream.read(1 << 16), b"")) == data
        finally:
            stream.close()
