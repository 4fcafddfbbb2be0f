"""Large and unusual inputs through the corpus stage on a real local Ray (2 CPUs): every
input byte decompressed once whatever the number of tasks, the same shards however a file
is cut or read, and inputs the demo never uses (a multistream dump with its index, UTF-16,
Latin-1, tsv/csv, hidden files, a dump cut short, one long book)."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from bertcore.errors import InputDataError
from bertcore.text.multistream import split_dump, write_multistream
from pipelines.registry import parse_config
from pipelines.runner import Pipeline

DUMP_NAME = "enwiki-20990101-pages-articles-multistream.xml.bz2"
INDEX_NAME = "enwiki-20990101-pages-articles-multistream-index.txt.bz2"


def config(root, inputs, **corpus):
    return parse_config(
        {
            "run": {"root": str(root)},
            "corpus": {"inputs": inputs, "shard_chars": 300_000, "validation_fraction": 0.05, **corpus},
        }
    )


def run(root, inputs, parallelism=None, **corpus):
    manifest, computed = Pipeline(config(root, inputs, **corpus)).run("corpus", parallelism=parallelism)
    assert computed
    return manifest


def shards(manifest):
    return [(s.path, s.sha256) for s in manifest.shards]


def documents(root, manifest) -> list[dict]:
    rows = []
    for shard in manifest.shards:
        with pa.memory_map(str(Path(root) / "corpus" / shard.path)) as source:
            rows += ipc.open_file(source).read_all().to_pylist()
    return rows


@pytest.fixture(scope="module")
def enwiki_xml(enwiki_dump) -> bytes:
    return bz2.decompress(enwiki_dump.read_bytes())


@pytest.fixture(scope="module")
def multistream(enwiki_xml, tmp_path_factory):
    """The shipped dump rewritten as Wikimedia publishes big ones: 10 pages per bzip2
    stream, the index beside it. Returns (dump path, its XML, the header's length)."""
    header, pages, footer = split_dump(enwiki_xml)
    folder = tmp_path_factory.mktemp("multistream")
    index = io.BytesIO()
    with open(folder / DUMP_NAME, "wb") as out:
        write_multistream(header, pages, footer, out, index, pages_per_stream=10)
    (folder / INDEX_NAME).write_bytes(bz2.compress(index.getvalue()))
    xml = header + b"".join(page for _, _, page in pages) + footer
    return folder / DUMP_NAME, xml, len(header)


def test_multistream_dump_split_across_three_tasks_gives_the_same_shards(multistream, tmp_path, ray_cluster):
    dump, xml, header = multistream
    size = dump.stat().st_size
    inputs = [{"uri": str(dump)}]  # the index is found beside the dump
    one = run(tmp_path / "one", inputs, split_bytes=10 * size)
    three = run(tmp_path / "three", inputs, split_bytes=size // 3 + 1)
    assert (one.stats["work_units"], three.stats["work_units"]) == (1, 3)
    assert shards(three) == shards(one) and one.rows > 50
    # every byte decompressed once: the three ranges add up to the XML exactly; the driver
    # decompressed the header stream once more to plan them (and says so)
    read = three.stats["inputs"][str(dump)]
    assert read["decompressed_bytes"] == len(xml) == one.stats["inputs"][str(dump)]["decompressed_bytes"]
    assert read["planning_bytes"] == header
    assert size <= read["compressed_bytes_read"] <= size + 3 * 2**16  # a task reads at most one 64 KiB chunk ahead
    # the index beside the dump is not read as a document
    assert not any("index" in s["file"] for s in three.skipped)


def test_one_and_two_workers_and_a_single_stream_copy_give_the_same_shards(multistream, tmp_path, ray_cluster):
    dump, xml, _ = multistream
    size = dump.stat().st_size
    split = {"split_bytes": size // 4}
    two = run(tmp_path / "two", [{"uri": str(dump)}], parallelism=2, **split)
    one = run(tmp_path / "one", [{"uri": str(dump)}], parallelism=1, **split)
    assert shards(one) == shards(two)
    # the same XML in one bzip2 stream (same file name, no index): tasks decode the bzip2
    # blocks that start in their compressed byte ranges
    single = tmp_path / "single" / dump.name
    single.parent.mkdir()
    single.write_bytes(bz2.compress(xml, 1))  # 100 kB blocks
    blocks = run(tmp_path / "blocks", [{"uri": str(single)}], split_bytes=single.stat().st_size // 4)
    assert blocks.stats["streamed_units"] == 0 and blocks.stats["work_units"] == 5  # ceil(size / (size // 4))
    assert shards(blocks) == shards(two)
    # each block handed out once, plus what finishes each range's last page (64 KiB reads)
    longest_page = max(len(page) for _, _, page in split_dump(xml)[1])
    read = blocks.stats["inputs"][str(single)]["decompressed_bytes"]
    assert len(xml) <= read <= len(xml) + 4 * (longest_page + 2 * 2**16)


def test_plain_xml_and_text_read_in_byte_ranges(multistream, gensim_data, tmp_path, ray_cluster):
    _, xml, _ = multistream
    path = tmp_path / "dump.xml"
    path.write_bytes(xml)
    lee = gensim_data / "lee_background.cor"
    inputs = [{"uri": str(path)}, {"uri": str(lee), "format": "lines"}]
    whole = run(tmp_path / "whole", inputs, split_bytes=len(xml) + 1)
    ranges = run(tmp_path / "ranges", inputs, split_bytes=len(xml) // 5)
    assert ranges.stats["work_units"] == 5 + 2 and shards(ranges) == shards(whole)
    # ranges overlap only by the page that crosses each cut (read on in 64 KiB blocks)
    read = ranges.stats["inputs"][str(path)]
    longest_page = max(len(page) for _, _, page in split_dump(xml)[1])
    assert len(xml) <= read["decompressed_bytes"] <= len(xml) + 4 * (longest_page + 2**16)


def test_compressed_jsonl_is_read_once_and_cleaned_in_batches(gensim_data, tmp_path, ray_cluster):
    lines = (gensim_data / "lee_background.cor").read_text(encoding="utf-8").splitlines()
    body = "".join(json.dumps({"text": line, "id": f"n{i}"}) + "\n" for i, line in enumerate(lines) if line.strip())
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "news.jsonl").write_text(body, encoding="utf-8")
    (tmp_path / "b" / "news.jsonl.gz").write_bytes(gzip.compress(body.encode()))
    plain = run(
        tmp_path / "plain", [{"uri": str(tmp_path / "a" / "news.jsonl"), "title_column": "id"}], validation_fraction=0.0
    )
    gz = run(
        tmp_path / "gz",
        [{"uri": str(tmp_path / "b" / "news.jsonl.gz"), "title_column": "id"}],
        split_bytes=40_000,
        validation_fraction=0.0,
    )
    assert gz.stats["streamed_units"] == 1 and gz.stats["inputs"][str(tmp_path / "b" / "news.jsonl.gz")][
        "decompressed_bytes"
    ] == len(body.encode())
    assert [d["title"] for d in documents(tmp_path / "gz", gz)] == [
        d["title"] for d in documents(tmp_path / "plain", plain)
    ]
    assert [d["sentences"] for d in documents(tmp_path / "gz", gz)] == [
        d["sentences"] for d in documents(tmp_path / "plain", plain)
    ]


def test_dump_without_closing_tag_keeps_its_complete_pages(enwiki_xml, tmp_path, ray_cluster):
    cut = enwiki_xml.index(b"<title>Albedo</title>") + 5000  # inside the Albedo page
    path = tmp_path / "cut.xml"
    path.write_bytes(enwiki_xml[:cut])
    manifest = run(tmp_path / "run", [{"uri": str(path), "name": "wiki"}], min_chars=0)
    read = manifest.stats["inputs"][str(path)]
    page_start = enwiki_xml.rindex(b"<page>", 0, cut)
    assert (read["truncated_records"], read["truncated_bytes"]) == (1, cut - page_start)
    source = manifest.stats["per_source"]["wiki"]
    assert source["dropped"]["truncated"] == 1 and source["read"] == source["kept"] + sum(source["dropped"].values())
    titles = [d["title"] for d in documents(tmp_path / "run", manifest)]
    assert source["kept"] >= 2 and "Anarchism" in titles and "Albedo" not in titles
    assert manifest.skipped == []


def test_utf16_dump_reads_like_utf8(enwiki_xml, tmp_path, ray_cluster):
    head = enwiki_xml[: enwiki_xml.index(b"<page>", enwiki_xml.index(b"<title>Albedo</title>"))] + b"</mediawiki>\n"
    for folder, data in (("utf8", head), ("utf16", head.decode("utf-8").encode("utf-16"))):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "wiki.xml").write_bytes(data)
    utf8 = run(tmp_path / "r8", [{"uri": str(tmp_path / "utf8" / "wiki.xml")}])
    utf16 = run(tmp_path / "r16", [{"uri": str(tmp_path / "utf16" / "wiki.xml")}], split_bytes=100_000)
    assert utf16.stats["streamed_units"] == 1  # UTF-16 cannot be cut at byte offsets
    assert shards(utf16) == shards(utf8) and utf8.rows >= 2


def test_one_long_book_split_into_more_shards_than_documents(tmp_path, ray_cluster):
    text = "\n\n".join(
        f"Chapter {i}. The river rose again in the spring of that year, and the town moved uphill." * 30
        for i in range(40)
    )
    (tmp_path / "book.txt").write_text(text, encoding="utf-8")
    manifest = run(tmp_path / "run", [{"uri": str(tmp_path / "book.txt")}], shard_chars=10_000, validation_fraction=0.0)
    assert manifest.rows == 1 and [s.path for s in manifest.shards] == ["train/part-00000.arrow"]


def test_hidden_files_in_a_folder_are_listed_or_read(tmp_path, ray_cluster):
    folder = tmp_path / "texts"
    folder.mkdir()
    doc = "The harbour town grew around a small fishing fleet. Its first school opened in 1871. "
    for name in ("kept.txt", ".draft.txt", "_notes.txt"):
        (folder / name).write_text(doc * 5 + name, encoding="utf-8")
    default = run(tmp_path / "a", [{"uri": str(folder)}], min_chars=50)
    assert default.rows == 1
    reasons = {Path(s["file"]).name: s["reason"] for s in default.skipped}
    assert set(reasons) == {".draft.txt", "_notes.txt"} and "include_hidden" in reasons["_notes.txt"]
    everything = run(tmp_path / "b", [{"uri": str(folder), "include_hidden": True}], min_chars=50)
    assert everything.rows == 3 and everything.skipped == []


def test_tsv_and_csv_inputs_with_text_and_title_columns(tmp_path, ray_cluster):
    body = "The committee met on Tuesday. It approved the budget for the new library &amp; the park."
    (tmp_path / "a.tsv").write_text(
        "key\tbody\n" + "".join(f"t{i}\t{body} Item {i}.\n" for i in range(4)), encoding="utf-8"
    )
    csv_rows = "".join(f'c{i},"{body}\nA second line, quoted. Item {i}."\n' for i in range(3))
    (tmp_path / "b.csv").write_text("key,body\n" + csv_rows, encoding="utf-8")
    inputs = [{"uri": str(tmp_path / f), "text_column": "body", "title_column": "key"} for f in ("a.tsv", "b.csv")]
    manifest = run(tmp_path / "run", inputs, min_chars=20, validation_fraction=0.0)
    docs = documents(tmp_path / "run", manifest)
    assert [d["title"] for d in docs] == ["t0", "t1", "t2", "t3", "c0", "c1", "c2"]
    assert docs[0]["sentences"] == [
        "The committee met on Tuesday.",
        "It approved the budget for the new library & the park.",
        "Item 0.",
    ]
    assert docs[4]["sentences"][-1] == "A second line, quoted." or docs[4]["sentences"][-2] == "A second line, quoted."
    # a tsv larger than a task is read in ranges, each given the header's columns
    ranged = run(tmp_path / "ranged", inputs[:1], split_bytes=150, min_chars=20, validation_fraction=0.0)
    assert ranged.stats["work_units"] > 1 and [d["title"] for d in documents(tmp_path / "ranged", ranged)] == [
        "t0",
        "t1",
        "t2",
        "t3",
    ]
    # compressed and larger than a task: the tsv goes to the cleaning tasks in chunks of whole
    # lines (the later ones with the header's columns), the csv (quoted newlines) as parsed records
    for name in ("a.tsv", "b.csv"):
        (tmp_path / "gz").mkdir(exist_ok=True)
        (tmp_path / "gz" / f"{name}.gz").write_bytes(gzip.compress((tmp_path / name).read_bytes()))
    zipped = [{**spec, "uri": str(tmp_path / "gz" / f"{Path(spec['uri']).name}.gz")} for spec in inputs]
    streamed = run(tmp_path / "streamed", zipped, split_bytes=60, min_chars=20, validation_fraction=0.0)
    assert streamed.stats["streamed_units"] == 2
    assert [(d["title"], d["sentences"]) for d in documents(tmp_path / "streamed", streamed)] == [
        (d["title"], d["sentences"]) for d in docs
    ]


def test_latin1_book_needs_its_encoding(tmp_path, ray_cluster):
    text = "Le café était plein. Les élèves parlaient de l'été à venir et du théâtre de la ville. " * 5
    (tmp_path / "livre.txt").write_bytes(text.encode("latin-1"))
    with pytest.raises(InputDataError, match=r"livre.txt.*invalid UTF-8 at byte 6.*read as utf-8.*set `encoding`"):
        run(tmp_path / "a", [{"uri": str(tmp_path / "livre.txt"), "language": "fr"}])
    manifest = run(
        tmp_path / "b", [{"uri": str(tmp_path / "livre.txt"), "language": "fr", "encoding": "latin-1"}], min_chars=50
    )
    assert documents(tmp_path / "b", manifest)[0]["sentences"][0] == "Le café était plein."


def test_moving_the_inputs_keeps_the_fingerprint_and_a_changed_file_is_named(
    multistream, gensim_data, tmp_path, ray_cluster
):
    """Fingerprints hold what the inputs contain, not where they are: moving the data (or
    reinstalling the package that ships the demo data) leaves every stage complete."""
    first = tmp_path / "data-v1"
    first.mkdir()
    for source in (multistream[0], multistream[0].with_name(INDEX_NAME), gensim_data / "lee_background.cor"):
        shutil.copy(source, first / source.name)

    def inputs(folder):
        return [
            {"uri": str(folder / DUMP_NAME), "name": "wiki"},
            {"uri": str(folder / "lee_background.cor"), "format": "lines", "name": "news"},
        ]

    root = tmp_path / "run"
    manifest = run(root, inputs(first), split_bytes=500_000)
    moved = tmp_path / "elsewhere" / "data"
    moved.parent.mkdir()
    first.rename(moved)
    cfg = config(root, inputs(moved), split_bytes=500_000)
    status = {r["stage"]: r for r in Pipeline(cfg).status()}
    assert status["corpus"]["state"] == "complete" and status["corpus"]["expected_fingerprint"] == manifest.fingerprint
    assert not Pipeline(cfg).run("corpus")[1]

    with open(moved / "lee_background.cor", "a", encoding="utf-8") as handle:
        handle.write("One more story about the harbour town and its weekly market, told at length for the test.\n")
    changed = {r["stage"]: r for r in Pipeline(cfg).status()}["corpus"]
    assert changed["state"] == "stale"
    assert any("lee_background.cor" in reason for reason in changed["changed"]), changed["changed"]
    setting = {
        r["stage"]: r for r in Pipeline(config(root, inputs(moved), split_bytes=500_000, min_chars=300)).status()
    }["corpus"]
    assert "corpus.min_chars: 200 -> 300" in setting["changed"]
