"""Examples stage: corpus documents -> NSP/SOP pairs or packed sentences, masked, in
length-binned Arrow shards per phase (`examples/<phase>/{train,validation}/`).

Ray shape, two steps:
1. one task per corpus shard tokenizes its documents' sentences with the vocab stage's
   tokenizer into `_tokens/<split>/part-NNNNN.arrow` (one row per document: its sentences
   as id lists) and returns each document's sentence count;
2. one task per (phase, split, corpus shard) builds that shard's examples. Random next
   sentences come from the whole split, not the worker's shard: workers get a compact
   corpus-wide index (for each global document number: token shard and row) and read a
   chosen document's sentences from the memory-mapped token shard, so a worker's memory
   is bounded by its own shard plus the index.

Every random draw is keyed by (seed, "examples", phase, global document number, pass)
inside `bertcore.examples`, so the bytes do not depend on the number of workers.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import ray

from bertcore.config import PipelineConfig
from bertcore.errors import InputDataError
from bertcore.examples import ExamplesConfig, ExampleStats, PhaseConfig, arrow_schema, examples_for_shard, id_type
from bertcore.masking import VocabTables
from bertcore.tokenizer import load_tokenizer, vocab_fingerprint, vocab_list
from pipelines import corpus, vocab
from pipelines.ray_runtime import run_tasks
from pipelines.stage import Manifest, ShardInfo, StageDir, fingerprint
from pipelines.storage import Storage
from pipelines.vocab import read_batches, upstream_manifest

log = logging.getLogger(__name__)

STAGE = "examples"
CODE_VERSION = "1"
SPLITS = ("train", "validation")
FLUSH_ROWS = 4096
"""Records buffered per length bin before they are written as one record batch."""


# -- local copies of what workers read -----------------------------------------------------------


def local_copy(storage: Storage, uri: str, cache_key: str) -> str:
    """A local path for `uri`: itself when local, else a per-run cached download."""
    local = storage.local_path(uri)
    if local is not None:
        return local
    cache = os.path.join(tempfile.gettempdir(), "bertpipe-cache", cache_key)
    target = os.path.join(cache, uri.split("://", 1)[-1])
    if not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = f"{target}.{os.getpid()}.part"
        fs, path = storage.fs(uri)
        fs.get_file(path, tmp)
        os.replace(tmp, target)
    return target


def local_vocab_dir(storage: Storage, vocab_dir: StageDir, cache_key: str) -> str:
    names = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    paths = [local_copy(storage, vocab_dir.path(name), cache_key) for name in names]
    return os.path.dirname(paths[0])


# -- corpus-wide document access ----------------------------------------------------------------


@dataclass
class DocumentIndex:
    """Global document number -> (token shard, row), for one split. Small: two ints per shard."""

    shard_uris: list[str]
    starts: np.ndarray  # (S+1,) first global number of each shard, then the total

    @property
    def num_documents(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        shard = int(np.searchsorted(self.starts, index, side="right") - 1)
        return shard, index - int(self.starts[shard])


class TokenStore:
    """`RandomDocs` over the token shards of one split, memory-mapped and opened lazily."""

    def __init__(self, index: DocumentIndex, storage: Storage, cache_key: str):
        self.index = index
        self.storage = storage
        self.cache_key = cache_key
        self._tables: dict[int, pa.ChunkedArray] = {}

    @property
    def num_documents(self) -> int:
        return self.index.num_documents

    def _segments(self, shard: int) -> pa.ChunkedArray:
        if shard not in self._tables:
            path = local_copy(self.storage, self.index.shard_uris[shard], self.cache_key)
            self._tables[shard] = ipc.open_file(pa.memory_map(path)).read_all().column("segments")
        return self._tables[shard]

    def get(self, index: int) -> list[list[int]]:
        shard, row = self.index.locate(index)
        return self._segments(shard)[row].as_py()


# -- Ray tasks ----------------------------------------------------------------------------------


@ray.remote(num_cpus=1, max_retries=3)
def tokenize_shard(corpus_uri: str, relative: str, vocab_key: str, storage: Storage, root: str, fp: str) -> int:
    """Tokenize one corpus shard's documents; returns the number of documents."""
    stage = StageDir(storage, root, STAGE)
    done = stage.finished(relative, fp)
    if done is not None:
        return done.rows
    tokenizer = load_tokenizer(local_vocab_dir(storage, StageDir(storage, root, "vocab"), vocab_key))
    ids_type = id_type(tokenizer.get_vocab_size())
    schema = pa.schema([("doc_id", pa.string()), ("segments", pa.list_(pa.list_(ids_type)))])
    tables = []
    for batch in read_batches(storage, corpus_uri):
        docs = batch.column("sentences").to_pylist()
        flat = [s for doc in docs for s in doc]
        encoded = tokenizer.encode_batch(flat, add_special_tokens=False)
        segments, at = [], 0
        for doc in docs:
            segments.append([e.ids for e in encoded[at : at + len(doc)]])
            at += len(doc)
        tables.append(pa.table({"doc_id": batch.column("doc_id"), "segments": pa.array(segments, schema.field("segments").type)}, schema=schema))
    table = pa.concat_tables(tables) if tables else schema.empty_table()

    def write(path: str) -> None:
        with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, schema) as writer:
            writer.write_table(table, max_chunksize=1024)

    return stage.write_shard(relative, fp, write, rows=table.num_rows).rows


@ray.remote(num_cpus=1, max_retries=3)
def build_shard(
    phase: PhaseConfig,
    split: str,
    shard_number: int,
    index: DocumentIndex,
    cfg: ExamplesConfig,
    seed: int,
    vocab_key: str,
    storage: Storage,
    root: str,
    fp: str,
) -> tuple[list[ShardInfo], dict]:
    """Examples of one corpus shard for one phase, one file per length bin."""
    stage = StageDir(storage, root, STAGE)
    task_marker = stage.path(f"_progress/task__{phase.name}__{split}__{shard_number:05d}.json")
    if storage.exists(task_marker):
        data = storage.read_json(task_marker)
        if data["fingerprint"] == fp:
            shards = [stage.finished(path, fp) for path in data["shards"]]
            if all(s is not None for s in shards):
                return shards, data["stats"]

    tokens = vocab_list(load_tokenizer(local_vocab_dir(storage, StageDir(storage, root, "vocab"), vocab_key)))
    tables = VocabTables.from_tokens(tokens)
    schema = arrow_schema(len(tokens))
    docs = TokenStore(index, storage, vocab_key)
    own = range(int(index.starts[shard_number]), int(index.starts[shard_number + 1]))
    stats = ExampleStats()

    with tempfile.TemporaryDirectory(prefix="bertpipe-examples-") as tmp:
        writers: dict[int, tuple[ipc.RecordBatchFileWriter, pa.OSFile]] = {}
        buffers: dict[int, list[dict]] = defaultdict(list)
        counts: dict[int, int] = defaultdict(int)

        def flush(bin_: int) -> None:
            if bin_ not in writers:
                sink = pa.OSFile(os.path.join(tmp, f"{bin_}.arrow"), "wb")
                writers[bin_] = (ipc.new_file(sink, schema), sink)
            writers[bin_][0].write_batch(pa.RecordBatch.from_pylist(buffers[bin_], schema=schema))
            buffers[bin_].clear()

        for record in examples_for_shard(list(own), docs, cfg, phase, seed, tables, stats):
            bin_ = cfg.length_bin(record["length"])
            buffers[bin_].append(record)
            counts[bin_] += 1
            if len(buffers[bin_]) >= FLUSH_ROWS:
                flush(bin_)
        for bin_ in sorted(buffers):
            if buffers[bin_]:
                flush(bin_)
        for writer, sink in writers.values():
            writer.close()
            sink.close()

        shards = []
        for bin_ in sorted(writers):
            relative = f"{phase.name}/{split}/part-{shard_number:05d}-len{bin_:03d}.arrow"
            local = os.path.join(tmp, f"{bin_}.arrow")
            shards.append(
                stage.write_shard(
                    relative, fp, lambda path, local=local: shutil.copyfile(local, path), rows=counts[bin_],
                    extra={"phase": phase.name, "split": split, "bin": bin_},
                )
            )
    stats_dict = stats.to_dict()
    storage.write_json(task_marker, {"fingerprint": fp, "shards": [s.path for s in shards], "stats": stats_dict})
    return shards, stats_dict


# -- the stage ----------------------------------------------------------------------------------


def expected_fingerprint(cfg: PipelineConfig, storage: Storage) -> str:
    return _fingerprint(cfg, corpus.expected_fingerprint(cfg, storage), vocab.expected_fingerprint(cfg, storage))


def _fingerprint(cfg: PipelineConfig, corpus_fp: str, vocab_fp: str) -> str:
    section = cfg.examples.model_dump(mode="json")
    return fingerprint(STAGE, CODE_VERSION, section, {"corpus": corpus_fp, "vocab": vocab_fp, "seed": cfg.run.seed})


def run(cfg: PipelineConfig, storage: Storage, *, force: bool = False, parallelism: int | None = None) -> tuple[Manifest, bool]:
    started = time.perf_counter()
    corpus_manifest = upstream_manifest(cfg, storage, "corpus")
    vocab_manifest = upstream_manifest(cfg, storage, "vocab")
    fp = _fingerprint(cfg, corpus_manifest.fingerprint, vocab_manifest.fingerprint)
    stage = StageDir(storage, cfg.run.root, STAGE)
    if not force and stage.state(fp) == "complete":
        return stage.manifest(), False
    if force:
        stage.invalidate()
    else:
        storage.remove(stage.path("_manifest.json"))

    vocab_dir = StageDir(storage, cfg.run.root, "vocab")
    vocab_key = vocab_manifest.fingerprint
    local_vocab = local_vocab_dir(storage, vocab_dir, vocab_key)
    recorded = vocab_manifest.stats.get("vocab_fingerprint")
    actual = vocab_fingerprint(local_vocab)
    if recorded != actual:
        raise InputDataError(
            f"{vocab_dir.uri}: the vocabulary files (fingerprint {actual}) do not match the tokenizer the vocab stage "
            f"recorded ({recorded}); re-run the vocab stage (`bertpipe run --from vocab --force`)"
        )

    # step 1: tokens, keyed by corpus and vocab only (changing masking settings reuses them)
    tokens_fp = fingerprint("examples-tokens", CODE_VERSION, {}, {"corpus": corpus_manifest.fingerprint, "vocab": vocab_manifest.fingerprint})
    corpus_dir = StageDir(storage, cfg.run.root, "corpus")
    jobs = [(s.path, f"_tokens/{s.path}") for s in corpus_manifest.shards]
    t0 = time.perf_counter()
    counts = run_tasks(
        lambda job: tokenize_shard.remote(corpus_dir.path(job[0]), job[1], vocab_key, storage, cfg.run.root, tokens_fp),
        jobs,
        parallelism=parallelism,
        desc="examples: tokenize",
    )
    t_tokens = time.perf_counter() - t0
    indexes = {}
    for split in SPLITS:
        uris = [stage.path(tok) for (path, tok), _ in zip(jobs, counts) if path.startswith(split + "/")]
        sizes = [n for (path, _), n in zip(jobs, counts) if path.startswith(split + "/")]
        indexes[split] = DocumentIndex(uris, np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]))

    # step 2: examples per (phase, split, corpus shard)
    t0 = time.perf_counter()
    tasks = [
        (phase, split, number)
        for phase in cfg.examples.phases
        for split in SPLITS
        for number in range(len(indexes[split].shard_uris))
    ]
    results = run_tasks(
        lambda t: build_shard.remote(t[0], t[1], t[2], indexes[t[1]], cfg.examples, cfg.run.seed, vocab_key, storage, cfg.run.root, fp),
        tasks,
        parallelism=parallelism,
        desc="examples: build",
    )
    t_build = time.perf_counter() - t0

    shards: list[ShardInfo] = []
    merged: dict[str, dict[str, ExampleStats]] = defaultdict(lambda: defaultdict(ExampleStats))
    for (phase, split, _), (task_shards, task_stats) in zip(tasks, results):
        shards.extend(task_shards)
        merged[phase.name][split] = merged[phase.name][split].merge(ExampleStats.from_dict(task_stats))
    _remove_leftovers(stage, cfg.examples, {s.path for s in shards})
    stats = {
        "masking": cfg.examples.masking,
        "objective": cfg.examples.objective,
        "vocab_size": len(vocab_list(load_tokenizer(local_vocab))),
        "vocab_fingerprint": actual,
        "documents": {split: indexes[split].num_documents for split in SPLITS},
        "phases": {name: {split: s.to_dict() for split, s in by_split.items()} for name, by_split in merged.items()},
    }
    manifest = Manifest(
        stage=STAGE,
        code_version=CODE_VERSION,
        fingerprint=fp,
        inputs={"corpus": corpus_manifest.fingerprint, "vocab": vocab_manifest.fingerprint},
        config=cfg.examples.model_dump(mode="json"),
        shards=shards,
        stats=stats,
        timings={"tokenize_s": round(t_tokens, 3), "build_s": round(t_build, 3), "total_s": round(time.perf_counter() - started, 3)},
    )
    stage.write_manifest(manifest, cfg)
    return manifest, True


def _remove_leftovers(stage: StageDir, cfg: ExamplesConfig, keep: set[str]) -> None:
    """Delete example shards an earlier run with other settings left behind."""
    for phase in stage.storage.listdir(stage.uri):
        if phase.startswith(("_", ".")):
            continue
        for split in SPLITS:
            for name in stage.storage.listdir(stage.path(f"{phase}/{split}")):
                if f"{phase}/{split}/{name}" not in keep:
                    stage.storage.remove(stage.path(f"{phase}/{split}/{name}"))
