"""The examples stage on local Ray over the demo corpus: layout and types, Google's
statistics, worker-count independence, the loader over its output, refusal of a
vocabulary that does not match the one recorded upstream; and on an s3:// root, what a
build task reads (its own token shard and a bounded sample of the others) and what the
finished stage leaves in the store."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from bertcore.errors import InputDataError
from bertcore.examples.layout import arrow_schema
from bertcore.train.loader import ExamplesLoader
from pipelines.registry import load_config
from pipelines.runner import Pipeline
from pipelines.stages.examples import work as examples
from pipelines.storage import Storage
from store_use import s3_requests, scratch_left

DEMO_RECIPE = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


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
    # A task draws random documents from examples.random_next_shards + 1 token shards, as
    # many as a recipe asks; with thousands, an open file per shard would exhaust the
    # process's descriptors.
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


def test_finished_stages_leave_no_scratch(demo_pipeline):
    """What the corpus and examples stages leave beside their shards and manifests (the
    unit markers of their output shards) is at most 5% of their output: their work files,
    dedup indexes and token shards are gone."""
    cfg, manifests = demo_pipeline
    storage = Storage(cfg.storage)
    for stage in ("corpus", "examples"):
        output, other = scratch_left(storage, str(Path(cfg.run.root) / stage), manifests[stage])
        assert set(other) <= {"_progress"} and sum(other.values()) <= 0.05 * output, (stage, output, other)


@pytest.fixture(scope="module")
def on_s3(demo_pipeline, s3_server):
    """The examples stage (seq128, one build task at a time) on an s3:// root holding copies
    of the demo's corpus and vocab stages, with every request the store answered:
    (config, manifest, requests, "/bucket/prefix/")."""
    import tempfile
    import uuid

    import boto3

    cfg, _ = demo_pipeline
    bucket, prefix = "bp-examples-on-s3", f"{uuid.uuid4().hex[:8]}/run"  # no cache of an earlier session has it
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    for stage in ("corpus", "vocab"):
        folder = Path(cfg.run.root) / stage
        for path in folder.rglob("*"):
            if path.is_file() and not path.relative_to(folder).parts[0].startswith("_progress"):
                client.upload_file(str(path), bucket, f"{prefix}/{stage}/{path.relative_to(folder)}")
    s3 = load_config(
        DEMO_RECIPE,
        [
            f"run.root=s3://{bucket}/{prefix}",
            f"storage.endpoint_url={s3_server}",
            "examples.dupe_factor=1",
            "examples.phases=[{name: seq128, max_seq_length: 128, max_predictions_per_seq: 20}]",
        ],
    )
    with s3_requests() as requests:
        manifest, computed = Pipeline(s3).run("examples", parallelism=1)
    assert computed
    return s3, manifest, list(requests), f"/{bucket}/{prefix}/", tempfile.gettempdir()


def test_a_build_task_reads_its_own_token_shard_and_a_bounded_sample_of_the_others(on_s3):
    """A build task copies the token shards it draws random next sentences from: its own
    and at most examples.random_next_shards others, not the whole split."""
    cfg, _, requests, base, _ = on_s3
    tokens = f"{base}examples/_tokens/train/"
    sizes = {r.path: r.length for r in requests if r.method == "PUT" and r.path.startswith(tokens)}
    bound = cfg.examples.random_next_shards + 1
    assert len(sizes) > bound  # a split of more shards than a task may read
    read, tasks = set(), []
    for r in requests:  # one build task at a time: each ends with its unit marker
        if r.method == "GET" and r.path.startswith(tokens):
            read.add(r.path)
        elif r.method == "PUT" and "/examples/_progress/build__seq128__train__" in r.path:
            number = int(r.path.rsplit("__", 1)[1].removesuffix(".json"))
            tasks.append((number, read))
            read = set()
    assert len(tasks) == len(sizes)
    largest = sum(sorted(sizes.values())[-bound:])
    for number, shards in tasks:
        assert f"{tokens}part-{number:05d}.arrow" in shards and len(shards) <= bound, (number, sorted(shards))
        assert sum(sizes[path] for path in shards) <= largest


def test_token_shards_a_task_copies_are_gone_when_it_ends(on_s3):
    cfg, _, _, base, tmp = on_s3
    # where they went: bertpipe-cache/<vocab>/bucket/prefix/..., or the task's own folder
    left = list(Path(tmp).glob(f"bertpipe-*/**{base}examples/_tokens"))
    assert not left, left


def test_finished_examples_on_s3_leave_no_scratch(on_s3):
    cfg, manifest, _, _, _ = on_s3
    output, other = scratch_left(Storage(cfg.storage), f"{cfg.run.root}/examples", manifest)
    assert set(other) <= {"_progress"} and sum(other.values()) <= 0.05 * output, (output, other)
