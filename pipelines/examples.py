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

import contextlib
import functools
import logging
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import ray
from tokenizers import Tokenizer

from bertcore.config import PipelineConfig
from bertcore.errors import InputDataError
from bertcore.examples import (
    ExamplesConfig,
    ExampleStats,
    PhaseConfig,
    arrow_array,
    arrow_schema,
    example_batches,
    id_type,
    list_array,
    numpy_dtype,
    numpy_view,
    offsets_of,
)
from bertcore.masking import VocabTables
from bertcore.pairs import FlatDocument
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
"""Records buffered per length bin before they are written as one record batch (at least)."""


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
    """`RandomDocs` over the token shards of one split, memory-mapped and opened lazily; a
    document comes back as a `FlatDocument` over the mapped ids (nothing copied until read)."""

    def __init__(self, index: DocumentIndex, storage: Storage, cache_key: str):
        self.index = index
        self.storage = storage
        self.cache_key = cache_key
        self._shards: dict[int, tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]] = {}

    @property
    def num_documents(self) -> int:
        return self.index.num_documents

    def _arrays(self, shard: int) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        if shard not in self._shards:
            path = local_copy(self.storage, self.index.shard_uris[shard], self.cache_key)
            stat = os.stat(path)
            self._shards[shard] = _mapped_token_shard(path, stat.st_size, stat.st_mtime_ns)
        return self._shards[shard]

    def get(self, index: int) -> FlatDocument:
        shard, row = self.index.locate(index)
        starts, batches = self._arrays(shard)
        b = int(np.searchsorted(starts, row, side="right") - 1)
        ids, segment_bounds, document_bounds = batches[b]
        row -= int(starts[b])
        # tokenize_shard stores no empty segment
        return FlatDocument(ids, segment_bounds[document_bounds[row] : document_bounds[row + 1] + 1], nonempty_known=True)


@functools.lru_cache(maxsize=4096)
def _mapped_token_shard(path: str, size: int, mtime_ns: int) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """One token shard, memory-mapped: the first row of each record batch, and per batch
    (ids, segment bounds, document bounds) as numpy views of the map. Cached per worker
    process, so the tasks a worker runs one after another (which all draw random documents
    from every shard of their split) open each shard once; a cached shard costs address
    space, not memory. `size` and `mtime_ns` are part of the key: a shard written again
    (`--force`) is a new file at the same path, and must be mapped again."""
    starts, batches = [0], []
    # The views keep the mapping alive; the file itself is closed here (not left to garbage
    # collection), so a worker can hold thousands of shards without holding their descriptors.
    with pa.memory_map(path) as source:
        reader = ipc.open_file(source)
        for i in range(reader.num_record_batches):
            documents = reader.get_batch(i).column("segments")
            segments = documents.values
            batches.append((numpy_view(segments.values), numpy_view(segments.offsets), numpy_view(documents.offsets)))
            starts.append(starts[-1] + len(documents))
    return np.asarray(starts), batches


@functools.lru_cache(maxsize=4)
def _vocabulary(directory: str) -> tuple[Tokenizer, VocabTables]:
    """The tokenizer and its masking tables, loaded once per worker process and vocabulary
    (the directory is a per-fingerprint cache, or the vocab stage's own local directory)."""
    tokenizer = load_tokenizer(directory)
    return tokenizer, VocabTables.from_tokens(vocab_list(tokenizer))


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Tokenize on this thread only: a task holds one CPU, and the tokenizer's own thread
    pool would compete with the other tasks on the node (and leave cores idle while its
    threads wait on each other)."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def _tokenize(tokenizer: Tokenizer, batch: pa.RecordBatch, ids_type: pa.DataType) -> pa.Array:
    """A batch's documents as list<list<id>>: each document's non-empty sentences' ids."""
    documents = batch.column("sentences")
    sentences = documents.flatten().to_pylist()
    sentence_bounds = numpy_view(documents.offsets)
    sentence_bounds = sentence_bounds - sentence_bounds[0]
    # encode_batch_fast skips the character offsets, which nothing here needs (~15% less CPU)
    ids = [e.ids for e in tokenizer.encode_batch_fast(sentences, add_special_tokens=False)]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    values = np.fromiter(chain.from_iterable(ids), dtype=numpy_dtype(ids_type), count=int(lengths.sum()))
    kept = lengths > 0  # Google drops lines that tokenize to nothing; so do we, here
    segment_bounds = offsets_of(lengths[kept])
    document_bounds = offsets_of(kept)[sentence_bounds]  # kept sentences before each bound
    segments = list_array(segment_bounds, values, ids_type)
    return pa.ListArray.from_arrays(arrow_array(document_bounds, pa.int32()), segments)


# -- Ray tasks ----------------------------------------------------------------------------------


@ray.remote(num_cpus=1, max_retries=3)
def tokenize_shard(corpus_uri: str, relative: str, vocab_key: str, storage: Storage, root: str, fp: str) -> int:
    """Tokenize one corpus shard's documents; returns the number of documents."""
    stage = StageDir(storage, root, STAGE)
    done = stage.finished(relative, fp)
    if done is not None:
        return done.rows
    tokenizer, _ = _vocabulary(local_vocab_dir(storage, StageDir(storage, root, "vocab"), vocab_key))
    ids_type = id_type(tokenizer.get_vocab_size())
    schema = pa.schema([("doc_id", pa.string()), ("segments", pa.list_(pa.list_(ids_type)))])
    with _one_thread():
        tables = [
            pa.table({"doc_id": batch.column("doc_id"), "segments": _tokenize(tokenizer, batch, ids_type)}, schema=schema)
            for batch in read_batches(storage, corpus_uri)
        ]
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

    _, tables = _vocabulary(local_vocab_dir(storage, StageDir(storage, root, "vocab"), vocab_key))
    schema = arrow_schema(tables.vocab_size)
    docs = TokenStore(index, storage, vocab_key)
    own = range(int(index.starts[shard_number]), int(index.starts[shard_number + 1]))
    bounds = np.asarray(cfg.length_bins)
    stats = ExampleStats()

    with tempfile.TemporaryDirectory(prefix="bertpipe-examples-") as tmp:
        writers: dict[int, tuple[ipc.RecordBatchFileWriter, pa.OSFile]] = {}
        buffers: dict[int, list[pa.RecordBatch]] = defaultdict(list)
        counts: dict[int, int] = defaultdict(int)

        def flush(bin_: int) -> None:
            if bin_ not in writers:
                sink = pa.OSFile(os.path.join(tmp, f"{bin_}.arrow"), "wb")
                writers[bin_] = (ipc.new_file(sink, schema), sink)
            writers[bin_][0].write_table(pa.Table.from_batches(buffers[bin_], schema=schema).combine_chunks())
            buffers[bin_].clear()

        for batch in example_batches(list(own), docs, cfg, phase, seed, tables, stats):
            bins = bounds[np.searchsorted(bounds, numpy_view(batch.column("length")))]
            for bin_ in np.unique(bins).tolist():
                part = batch.take(arrow_array(np.flatnonzero(bins == bin_), pa.int64()))
                buffers[bin_].append(part)
                counts[bin_] += part.num_rows
                if sum(b.num_rows for b in buffers[bin_]) >= FLUSH_ROWS:
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
    if (done := stage.reuse_or_reset(fp, force=force)) is not None:
        return done, False

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
