"""The examples stage on local Ray over the demo corpus: layout and types, Google's
statistics, worker-count independence, the loader over its output, and refusal of a
vocabulary that does not match the one recorded upstream."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from bertcore.errors import InputDataError
from bertcore.examples.layout import arrow_schema
from bertcore.train.loader import ExamplesLoader
from pipelines.runner import Pipeline
from pipelines.stages.examples import work as examples
from pipelines.storage import Storage


def read(path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return ipc.open_file(source).read_all()


def copy_upstream(cfg, root: Path):
    for stage in ("corpus", "vocab"):
        shutil.copytree(Path(cfg.run.root) / stage, root / stage)
    return cfg.model_copy(update={"run": cfg.run.model_copy(update={"root": str(root)})})


@pytest.fixture(scope="module")
def seq128(demo_pipeline):
    cfg, manifests = demo_pipeline
    stage_dir = Path(cfg.run.root) / "examples"
    shards = [s for s in manifests["examples"].shards if s.extra["phase"] == "seq128" and s.extra["split"] == "train"]
    return cfg, manifests["examples"], [(s, read(stage_dir / s.path)) for s in shards]


def test_layout_types_and_bins(seq128):
    cfg, manifest, shards = seq128
    schema = arrow_schema(cfg.vocab.vocab_size)
    assert schema.field("input_ids").type == pa.list_(pa.uint16())
    bins = cfg.examples.length_bins
    for info, table in shards:
        assert table.schema.equals(schema), info.path
        lengths = table.column("length").to_pylist()
        assert lengths == [len(x) for x in table.column("input_ids").to_pylist()]  # nothing padded
        upper = info.extra["bin"]
        lower = max([b for b in bins if b < upper], default=0)
        assert all(lower < n <= upper for n in lengths), info.path
    phases = {s.extra["phase"] for s in manifest.shards}
    assert phases == {"seq128", "seq512"}


def test_statistics_match_google_algorithm(seq128):
    cfg, manifest, shards = seq128
    ids = (Path(cfg.run.root) / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    cls, sep, mask, pad = ids.index("[CLS]"), ids.index("[SEP]"), ids.index("[MASK]"), ids.index("[PAD]")
    kinds = {"mask": 0, "kept": 0, "random": 0}
    for _, table in shards:
        for row in table.to_pylist():
            tokens, positions, originals = row["input_ids"], row["masked_positions"], row["masked_ids"]
            assert len(positions) == min(20, max(1, round(row["length"] * 0.15)))
            assert positions == sorted(positions)
            assert tokens[0] == cls and tokens[-1] == sep and tokens[row["segment_b_start"] - 1] == sep
            assert sep not in tokens[1 : row["segment_b_start"] - 1]  # segment A ends at the first [SEP]
            assert not {cls, sep, pad} & set(originals)
            for p, original in zip(positions, originals):
                assert 0 < p < row["length"] - 1
                kind = "mask" if tokens[p] == mask else "kept" if tokens[p] == original else "random"
                kinds[kind] += 1
    total = sum(kinds.values())
    assert total >= 10_000
    assert abs(kinds["mask"] / total - 0.8) < 0.01
    assert abs(kinds["kept"] / total - 0.1) < 0.01 and abs(kinds["random"] / total - 0.1) < 0.01
    stats = manifest.stats["phases"]["seq128"]["train"]
    shares = stats["shares"]
    assert stats["masked"] == total
    assert abs(shares["random_next"] - shares["random_next_expected"]) < 0.02
    assert abs(shares["short_target_documents"] - cfg.examples.short_seq_prob) < 0.05


def test_one_and_two_workers_give_identical_bytes(demo_pipeline, tmp_path):
    cfg, manifests = demo_pipeline
    single = copy_upstream(cfg, tmp_path)
    manifest, computed = Pipeline(single).run("examples", parallelism=1)
    assert computed
    assert [(s.path, s.sha256) for s in manifest.shards] == [(s.path, s.sha256) for s in manifests["examples"].shards]


def test_rerun_is_skipped(demo_pipeline):
    cfg, manifests = demo_pipeline
    manifest, computed = Pipeline(cfg).run("examples")
    assert not computed and manifest.fingerprint == manifests["examples"].fingerprint


def test_loader_over_stage_output(seq128):
    cfg, manifest, shards = seq128
    paths = [str(Path(cfg.run.root) / "examples" / info.path) for info, _ in shards]
    loader = ExamplesLoader(paths, batch_size=16, seed=cfg.run.seed, pad_id=0)
    batch = next(iter(loader))
    assert batch["input_ids"].shape[1] % 8 == 0 and batch["input_ids"].shape[0] == 16
    assert (batch["labels"] != -100).sum() > 0
    assert set(batch["next_sentence_label"].tolist()) <= {0, 1}


def test_mismatched_vocabulary_is_refused(demo_pipeline, tmp_path):
    cfg, _ = demo_pipeline
    other = copy_upstream(cfg, tmp_path)
    vocab_txt = tmp_path / "vocab" / "vocab.txt"
    lines = vocab_txt.read_text(encoding="utf-8").splitlines()
    lines[2000], lines[2001] = lines[2001], lines[2000]
    vocab_txt.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputDataError, match="different vocabularies"):
        Pipeline(other).run("examples")


def test_vocabulary_replaced_after_the_vocab_stage_is_refused(demo_pipeline, tmp_path):
    """Self-consistent files, but not the ones the vocab stage recorded."""
    from bertcore.vocab.tokenizer import VocabConfig, save_tokenizer, train_wordpiece

    cfg, _ = demo_pipeline
    other = copy_upstream(cfg, tmp_path)
    small = VocabConfig(vocab_size=300, min_frequency=1)
    sentences = ["A short text about rivers and towns.", "Another sentence about mountains."] * 20
    save_tokenizer(train_wordpiece(sentences, small), small, str(tmp_path / "vocab"))
    with pytest.raises(InputDataError, match="do not match the tokenizer the vocab stage recorded"):
        Pipeline(other).run("examples")


def test_token_store_reads_many_shards_without_holding_their_files(tmp_path):
    # A worker draws random documents from every token shard of its split; with thousands
    # of shards, an open file per shard would exhaust the process's descriptors.
    import os

    import numpy as np

    from bertcore.config import StorageConfig

    schema = pa.schema([("doc_id", pa.string()), ("segments", pa.list_(pa.list_(pa.uint16())))])
    uris, sizes = [], []
    for k in range(300):
        docs = [[[k, d, s] for s in range(d + 1)] for d in range(3)]  # doc d: d+1 segments
        path = tmp_path / f"part-{k:05d}.arrow"
        with ipc.new_file(str(path), schema) as writer:
            writer.write_table(
                pa.table({"doc_id": [f"{k}-{d}" for d in range(3)], "segments": docs}, schema=schema), max_chunksize=2
            )
        uris.append(str(path))
        sizes.append(3)
    index = examples.DocumentIndex(uris, np.concatenate([[0], np.cumsum(sizes)]))
    store = examples.TokenStore(index, Storage(StorageConfig()), "test")
    before = len(os.listdir("/proc/self/fd"))
    for number in range(index.num_documents):
        k, d = divmod(number, 3)
        assert list(store.get(number)) == [[k, d, s] for s in range(d + 1)]
    assert len(os.listdir("/proc/self/fd")) - before < 10


def test_tokens_per_sentence_are_reported(demo_pipeline):
    """The distribution of tokens per corpus sentence, counted while tokenizing: how much
    of the text sits in sentences longer than a sequence can hold."""
    _, manifests = demo_pipeline
    tokens = manifests["examples"].stats["sentence_tokens"]
    corpus_sentences = manifests["corpus"].stats["sentences"]
    assert 0.95 * corpus_sentences <= tokens["count"] <= corpus_sentences  # every non-empty sentence once
    assert 5 < tokens["p50"] <= tokens["p90"] <= tokens["p99"] <= tokens["max"]
    over = tokens["over_128"]
    assert 0 <= over["share"] <= over["share_of_length"] <= 1  # long sentences hold more than their share of tokens
