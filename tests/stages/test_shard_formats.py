"""The shards are Arrow IPC files (Feather v2): the ways docs/shards.md names to open them
with other tools read the same records bertpipe wrote."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from pipelines.shards import read_table
from pipelines.storage import Storage


@pytest.fixture(scope="module")
def shards(demo_pipeline):
    cfg, manifests = demo_pipeline
    root = Path(cfg.run.root)
    corpus = [str(root / "corpus" / s.path) for s in manifests["corpus"].shards_under("train/")]
    examples = [str(root / "examples" / s.path) for s in manifests["examples"].shards_under("seq128/train/") if s.rows]
    storage = Storage(cfg.storage)
    expected = {
        "corpus": pa.concat_tables(read_table(storage, p) for p in corpus),
        "examples": pa.concat_tables(read_table(storage, p) for p in examples),
    }
    return {"corpus": corpus, "examples": examples}, expected


@pytest.mark.parametrize("stage", ["corpus", "examples"])
def test_hugging_face_datasets_loads_them_with_the_arrow_builder(shards, stage, tmp_path):
    import datasets

    paths, expected = shards
    loaded = datasets.load_dataset("arrow", data_files={"train": paths[stage]}, split="train", cache_dir=str(tmp_path))
    assert loaded.num_rows == expected[stage].num_rows
    # the same records in the same order (datasets drops the schema's not-null flags)
    assert loaded.data.table.select(expected[stage].column_names).to_pydict() == expected[stage].to_pydict()


@pytest.mark.parametrize("stage", ["corpus", "examples"])
def test_pyarrow_dataset_scans_a_folder_of_them(shards, stage):
    paths, expected = shards
    folder = Path(paths[stage][0]).parent  # e.g. examples/seq128/train/
    dataset = ds.dataset(str(folder), format="arrow")
    assert dataset.count_rows() == expected[stage].num_rows
    assert dataset.to_table().equals(expected[stage])  # schema included


def test_pyarrow_reads_one_memory_mapped_with_random_access_to_its_batches(shards):
    paths, expected = shards
    with pa.memory_map(paths["examples"][0]) as source:
        reader = pa.ipc.open_file(source)
        last = reader.get_batch(reader.num_record_batches - 1)  # straight to the last batch, via the footer
        assert last.num_rows > 0 and last.schema == expected["examples"].schema


def test_polars_reads_and_scans_them(shards):
    import polars

    paths, expected = shards
    frame = polars.read_ipc(paths["corpus"][0])
    assert frame["doc_id"].to_list() == pa.ipc.open_file(paths["corpus"][0]).read_all().column("doc_id").to_pylist()
    lengths = polars.scan_ipc(paths["examples"]).select(polars.col("length").sum()).collect().item()
    assert lengths == pc.sum(expected["examples"].column("length")).as_py()


def test_take_rows_gives_take_s_rows_and_reads_only_their_batches(tmp_path, s3_bucket):
    """take_rows equals Table.take for rows in any order (locally and on S3), and keeps
    in memory only the batches that hold them, not the joined columns of the whole file."""
    import boto3
    import numpy as np

    from bertcore.config import StorageConfig
    from pipelines.shards import take_rows, write_table

    n = 20_000
    text = [f"sentence {i} " * 40 for i in range(n)]  # about 9 MB of text in 20 batches
    table = pa.table({"id": pa.array(range(n), pa.int64()), "text": pa.array(text)})
    path = tmp_path / "work.arrow"
    write_table(str(path), table, max_chunksize=1000)
    rng = np.random.default_rng(0)
    cases = [[], [5], list(range(1500, 2600)), rng.choice(n, 300, replace=False).tolist(), [19_999, 0, 7, 7]]
    local = Storage(StorageConfig())
    endpoint, bucket = s3_bucket
    remote = Storage(StorageConfig(endpoint_url=endpoint))
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").upload_file(str(path), bucket, "work.arrow")
    for storage, uri in ((local, str(path)), (remote, f"s3://{bucket}/work.arrow")):
        for rows in cases:
            got = take_rows(storage, uri, rows, ["text", "id"])
            assert got.column_names == ["text", "id"] and got.equals(
                table.select(["text", "id"]).take(pa.array(rows, pa.int64()))
            )
    pool = pa.default_memory_pool()
    before = pool.max_memory()
    take_rows(local, str(path), list(range(1500, 1600)), ["text"])
    assert pool.max_memory() - before < 2_000_000  # one batch's rows, not the file's 9 MB
    with pytest.raises(IndexError, match="asked of 20000"):
        take_rows(local, str(path), [n])
