"""Bad input never disappears silently: a clear error naming the file (and offset where
known), or with `corpus.on_error: skip` a `skipped` entry in the manifest while the rest
is processed and the counts still add up."""

from __future__ import annotations

import pytest

from bertcore.errors import InputDataError
from pipelines.registry import parse_config
from pipelines.runner import Pipeline

GOOD_DOC = (
    "The harbour town grew around a small fishing fleet in the nineteenth century. "
    "Its first school opened in 1871 and its railway station followed a decade later. "
    "Today the old warehouses hold a museum, two cafés and a busy weekly market."
)


def make_config(root, inputs, on_error="raise"):
    return parse_config(
        {
            "run": {"root": str(root)},
            "corpus": {"inputs": inputs, "on_error": on_error, "min_chars": 100, "validation_fraction": 0.0},
        }
    )


@pytest.fixture
def good_file(tmp_path):
    path = tmp_path / "good.txt"
    path.write_text("\n".join(f"{GOOD_DOC} Story number {i}." for i in range(5)) + "\n", encoding="utf-8")
    return {"uri": str(path), "format": "lines", "name": "good"}


def truncated_bz2(tmp_path, enwiki_dump):
    data = enwiki_dump.read_bytes()
    path = tmp_path / "cut.xml.bz2"
    path.write_bytes(data[: len(data) // 2])
    return path, "wikipedia"


def corrupt_bz2(tmp_path, enwiki_dump):
    data = bytearray(enwiki_dump.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 64):
        data[i] ^= 0x5A
    path = tmp_path / "corrupt.xml.bz2"
    path.write_bytes(bytes(data))
    return path, "wikipedia"


def malformed_xml(tmp_path, _):
    path = tmp_path / "broken.xml"
    path.write_text(
        (
            "<mediawiki><siteinfo><sitename>W</sitename></siteinfo><page><title>A</title><ns>0</ns><id>1</id>"
            "<revision><text>Some text.</text></page></mediawiki>"
        ),
        encoding="utf-8",
    )
    return path, "wikipedia"


def not_utf8(tmp_path, _):
    path = tmp_path / "latin1.txt"
    path.write_bytes(("Caf\u00e9 society was " * 30).encode("latin-1"))
    return path, "book"


def empty_file(tmp_path, _):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    return path, "book"


BAD_FILES = [truncated_bz2, corrupt_bz2, malformed_xml, not_utf8, empty_file]


@pytest.mark.parametrize("make_bad", BAD_FILES, ids=lambda f: f.__name__)
def test_bad_file_raises_naming_the_file(make_bad, tmp_path, enwiki_dump, good_file, ray_cluster):
    bad, fmt = make_bad(tmp_path, enwiki_dump)
    cfg = make_config(tmp_path / "run", [good_file, {"uri": str(bad), "format": fmt}])
    with pytest.raises(InputDataError) as info:
        Pipeline(cfg).run("corpus")
    message = str(info.value)
    assert str(bad) in message and "\n" not in message
    assert (tmp_path / "run" / "corpus" / "_manifest.json").exists() is False


@pytest.mark.parametrize("make_bad", BAD_FILES, ids=lambda f: f.__name__)
def test_bad_file_skipped_and_listed(make_bad, tmp_path, enwiki_dump, good_file, ray_cluster):
    bad, fmt = make_bad(tmp_path, enwiki_dump)
    cfg = make_config(tmp_path / "run", [good_file, {"uri": str(bad), "format": fmt}], on_error="skip")
    manifest, _ = Pipeline(cfg).run("corpus")
    assert [s["file"] for s in manifest.skipped] == [str(bad)]
    assert manifest.skipped[0]["reason"]
    stats = manifest.stats
    assert stats["per_source"]["good"]["kept"] == 5 == manifest.rows
    assert stats["documents_read"] == stats["documents_kept"] + sum(stats["dropped"].values())


def test_byte_offset_reported_for_non_utf8(tmp_path, good_file, ray_cluster):
    path = tmp_path / "mixed.txt"
    data = b"A fine first paragraph of text.\n\nThen a bad byte \xff here."
    path.write_bytes(data)
    cfg = make_config(tmp_path / "run", [{"uri": str(path), "format": "book"}])
    bad_at = data.index(b"\xff")
    with pytest.raises(InputDataError, match=f"byte {bad_at}\\b"):
        Pipeline(cfg).run("corpus")


def test_fifty_megabyte_line_is_counted_not_lost(tmp_path, good_file, ray_cluster):
    huge = tmp_path / "huge.txt"
    with open(huge, "w", encoding="utf-8") as handle:
        handle.write(GOOD_DOC + "\n")
        handle.write("word " * 10_000_000)  # 50 MB, no newline
    cfg = make_config(tmp_path / "run", [good_file, {"uri": str(huge), "format": "lines", "name": "huge"}])
    cfg.corpus.max_doc_chars = 1_000_000
    manifest, _ = Pipeline(cfg).run("corpus")
    huge_stats = manifest.stats["per_source"]["huge"]
    assert huge_stats == {**huge_stats, "read": 2, "kept": 1, "dropped": {"too_long": 1}}


def test_missing_path(tmp_path, good_file, ray_cluster):
    missing = str(tmp_path / "nope" / "*.jsonl")
    cfg = make_config(tmp_path / "run", [good_file, missing])
    with pytest.raises(InputDataError, match=r"corpus.inputs\[1\].*nope"):
        Pipeline(cfg).run("corpus")
    cfg = make_config(tmp_path / "run", [good_file, missing], on_error="skip")
    manifest, _ = Pipeline(cfg).run("corpus")
    assert manifest.skipped[0]["file"] == missing and manifest.rows == 5


def test_missing_bucket(tmp_path, good_file, s3_server, monkeypatch, ray_cluster):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    cfg = make_config(tmp_path / "run", [good_file, "s3://no-such-bucket-here/raw/*.txt"])
    with pytest.raises(InputDataError, match="no-such-bucket-here"):
        Pipeline(cfg).run("corpus")


def test_truncated_bz2_offset_named(tmp_path, enwiki_dump, ray_cluster):
    bad, fmt = truncated_bz2(tmp_path, enwiki_dump)
    cfg = make_config(tmp_path / "run", [{"uri": str(bad), "format": fmt}])
    with pytest.raises(InputDataError, match=r"byte \d+"):
        Pipeline(cfg).run("corpus")
