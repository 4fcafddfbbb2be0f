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
