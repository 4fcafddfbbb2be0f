"""Pieces of the corpus stage that need no Ray: shard cutting for any document sizes, how
inputs are planned into work units, content identities and their cache, encodings,
multistream ranges, length distributions."""

from __future__ import annotations

import bz2
import gzip
import io
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertcore.config import StorageConfig
from bertcore.text.config import CorpusConfig
from bertcore.text.encoding import sniff
from bertcore.text.lengths import Lengths
from bertcore.text.multistream import Bz2Range, plan_ranges, stream_offsets
from pipelines.content_id import HashCache, content_id
from pipelines.stages.corpus.inputs import input_location_free, list_inputs
from pipelines.stages.corpus.plan import cut_shards
from pipelines.stages.corpus.units import plan_units
from pipelines.storage import Storage


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=60), st.integers(1, 50_000))
def test_cut_shards_covers_every_document_in_nonempty_contiguous_shards(sizes, shard_chars):
    chars = np.array(sizes, dtype=np.int64)
    shards = cut_shards(chars, shard_chars)
    if not sizes:
        assert shards == []
        return
    assert shards[0][0] == 0 and shards[-1][1] == len(sizes)
    assert all(start < end for start, end in shards)
    assert all(a[1] == b[0] for a, b in zip(shards, shards[1:]))
    assert len(shards) <= max(1, round(sum(sizes) / shard_chars))


def test_one_long_document_is_one_shard():
    assert cut_shards(np.array([5_000_000]), 1000) == [(0, 1)]
    assert cut_shards(np.array([10, 10, 10]), 1) == [(0, 1), (1, 2), (2, 3)]


def test_plan_groups_small_files_and_cuts_large_ones(tmp_path):
    for i in range(5):
        (tmp_path / f"small-{i}.txt").write_text("A short note about the weather. " * 10, encoding="utf-8")
    (tmp_path / "big.jsonl").write_text(
        "".join(f'{{"text": "line {i} of a larger file"}}\n' for i in range(2000)), encoding="utf-8"
    )
    (tmp_path / "big.jsonl.gz").write_bytes(gzip.compress((tmp_path / "big.jsonl").read_bytes()))
    storage = Storage(StorageConfig())
    cfg = CorpusConfig(
        inputs=[str(tmp_path / "small-*.txt"), str(tmp_path / "big.jsonl"), str(tmp_path / "big.jsonl.gz")],
        split_bytes=1000,
    )
    listing = list_inputs(cfg, storage, HashCache(tmp_path / "cache"))
    plan = plan_units(cfg, listing.files, storage)
    kinds = [(len(u.pieces), u.pieces[0].kind, u.streamed) for u in plan.units]
    assert kinds[0] == (3, "whole", False) and kinds[1] == (2, "whole", False)  # 5 x 320 bytes in units of <= 1000
    ranges = [u.pieces[0] for u in plan.units if u.pieces[0].kind == "range"]
    size = (tmp_path / "big.jsonl").stat().st_size
    assert len(ranges) == -(-size // 1000) and ranges[0].start == 0 and ranges[-1].end is None
    assert all(a.end == b.start for a, b in zip(ranges, ranges[1:]))
    assert kinds[-1] == (1, "whole", True)  # the .gz is read by one task and cleaned in batches


def test_identity_is_content_not_location(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "doc.txt").write_text("Some text.", encoding="utf-8")
    storage = Storage(StorageConfig())
    cache = HashCache(tmp_path / "cache")
    first = list_inputs(CorpusConfig(inputs=[str(tmp_path / "a")]), storage, cache).identity
    (tmp_path / "a").rename(tmp_path / "b")
    moved = list_inputs(
        CorpusConfig(
            inputs=[str(tmp_path / "b")],
        ),
        storage,
        cache,
    ).identity
    assert (
        first["inputs[0]"]["files"]
        == moved["inputs[0]"]["files"]
        == {"doc.txt": {"size": 10, "content": content_id(storage, str(tmp_path / "b" / "doc.txt"), cache=cache)}}
    )
    config = CorpusConfig(inputs=[{"uri": str(tmp_path / "b"), "index": str(tmp_path / "x")}]).model_dump(mode="json")
    assert (
        "uri" not in input_location_free(config)["inputs"][0]
        and "index" not in input_location_free(config)["inputs"][0]
    )


def test_hash_cache_hashes_a_file_once_and_touching_keeps_the_identity(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(100_000))
    cache = HashCache(tmp_path / "cache")
    digest = cache.local(str(path))
    assert digest.startswith("xxh3:") and cache.local(str(path)) == digest
    import sqlite3

    with sqlite3.connect(cache.path) as db:
        assert db.execute("SELECT COUNT(*) FROM hashes").fetchone()[0] == 1
    os.utime(path, (1, 1))  # touched: hashed again, same content, same identity
    assert cache.local(str(path)) == digest
    path.write_bytes(os.urandom(100_000))
    assert cache.local(str(path)) != digest


def test_encoding_from_byte_order_marks_and_settings():
    assert sniff("<mediawiki>".encode("utf-16")).name == "utf-16-le"
    assert sniff(b"\xef\xbb\xbfabc").bom == 3 and sniff(b"\xef\xbb\xbfabc").is_utf8
    assert sniff("<x>".encode("utf-16-be")).name == "utf-16-be"  # XML without a mark
    assert sniff(b"plain", "latin-1").why == "set on the input"
    assert sniff("abc".encode("utf-16"), "utf-16").bom == 2
    try:
        sniff("abc".encode("utf-16"), "utf-8")
    except ValueError as exc:
        assert "utf-16-le byte-order mark" in str(exc) and "encoding: utf-8" in str(exc)
    else:
        raise AssertionError("a UTF-16 mark with encoding: utf-8 must be an error")


def test_multistream_ranges_and_a_wrong_index():
    streams = [bz2.compress(b"<mediawiki><siteinfo></siteinfo>")] + [
        bz2.compress(f"<page>{i}</page>".encode()) for i in range(6)
    ]
    offsets = list(np.cumsum([0] + [len(s) for s in streams])[1:-1])
    data = b"".join(streams)
    assert stream_offsets([f"{o}:{i}:T{i}".encode() for i, o in enumerate(offsets)]) == offsets
    ranges = plan_ranges(offsets, 2 * len(streams[1]))
    assert ranges[0][0] == 0 and ranges[-1][1] is None and len(ranges) == 4
    reader = Bz2Range(io.BytesIO(data[offsets[2] :]), offsets[2], offsets[4])
    out = b"".join(iter(reader.read, b""))
    assert out == b"<page>2</page><page>3</page>" and reader.paused and reader.key(14) == (offsets[3], 0)
    wrong = Bz2Range(io.BytesIO(data), 0, offsets[0] + 3)
    try:
        b"".join(iter(wrong.read, b""))
    except ValueError as exc:
        assert "index does not belong to this dump" in str(exc)
    else:
        raise AssertionError("an offset inside a stream must be refused")


def test_length_distribution_merges_and_summarises():
    a, b = Lengths(100), Lengths(100)
    a.add([1, 2, 3, 4])
    b.add([10, 200])
    merged = Lengths.from_json(a.to_json()).merge(b)
    summary = merged.summary(over=(5,))
    assert summary["count"] == 6 and summary["max"] == 200 and summary["p50"] == 3
    assert summary["over_5"] == {"share": round(2 / 6, 5), "share_of_length": round(210 / 220, 5)}


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz", ".zst"])
def test_every_compression_is_read_through_a_counted_stream(tmp_path, suffix):
    import lzma

    import zstandard

    from bertcore.text.records import ReadStats, iter_raw_documents
    from pipelines.stages.corpus.pieces import open_piece

    body = "".join(f'{{"text": "Record number {i} of a compressed file."}}\n' for i in range(500)).encode()
    compress = {
        ".gz": gzip.compress,
        ".bz2": bz2.compress,
        ".xz": lzma.compress,
        ".zst": zstandard.ZstdCompressor().compress,
    }[suffix]
    path = tmp_path / f"records.jsonl{suffix}"
    path.write_bytes(compress(body))
    storage = Storage(StorageConfig())
    cfg = CorpusConfig(inputs=[str(path)])
    (unit,) = plan_units(cfg, list_inputs(cfg, storage, HashCache(tmp_path / "cache")).files, storage).units
    stats = ReadStats()
    with open_piece(storage, unit.pieces[0]) as opened:
        docs = list(iter_raw_documents(opened.stream, unit.pieces[0].fmt, stats=stats, **opened.arguments))
        compressed = opened.compressed_bytes
    assert [d.text for d in docs][-1] == "Record number 499 of a compressed file."
    assert stats.decompressed_bytes == len(body)
    assert compressed == path.stat().st_size


def test_stable_fractions_are_stable_fraction_in_one_call():
    from bertcore.rng import stable_fraction, stable_fractions

    ids = [f"{i:024x}" for i in range(500)] + ["", "é", "doc\x1fid"]
    assert stable_fractions(("split",), ids).tolist() == [stable_fraction("split", d) for d in ids]
