"""Examples stage: corpus documents -> NSP/SOP pairs or packed sentences, masked, in
length-binned Arrow shards per phase (`examples/<phase>/{train,validation}/`).

Ray shape, two steps:
1. one task per corpus shard tokenizes its documents' sentences with the vocab stage's
   tokenizer into `_tokens/<split>/part-NNNNN.arrow` (one row per document: its sentences
   as id lists) and returns each document's sentence count;
2. one task per (phase, split, corpus shard) builds that shard's examples. Random next
   sentences come from the shard's own documents and those of `random_next_shards` other
   shards of the split, drawn by a generator keyed by (seed, "examples", phase, split,
   shard) (`bertcore.examples.pairs.random_next_shards`, as Google's script draws from the
   files one process reads). The task copies those token shards (at most
   random_next_shards + 1, whatever the corpus size) into its own temporary folder, maps
   them, and removes them when it ends; on a local run root it maps them in place.

Every random draw is keyed by (seed, "examples", phase, global document number, pass)
inside `bertcore.examples.layout`, so the bytes do not depend on the number of workers.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import ray
from tokenizers import Tokenizer

from bertcore.errors import InputDataError
from bertcore.examples.arrow import arrow_array, list_array, numpy_dtype, numpy_view, offsets_of
from bertcore.examples.config import ExamplesConfig, PhaseConfig, length_bin
from bertcore.examples.layout import ExampleStats, arrow_schema, example_batches, id_type
from bertcore.examples.masking import VocabTables
from bertcore.examples.pairs import FlatDocument, random_next_shards
from bertcore.rng import keyed_random
from bertcore.text.lengths import Lengths
from bertcore.vocab.config import tokenizer_files
from bertcore.vocab.encode import encode_sentences
from bertcore.vocab.tokenizer import load_tokenizer, vocab_fingerprint, vocab_list
from pipelines.ray_runtime import run_tasks
from pipelines.shards import download_into, local_folder, read_batches, write_table
from pipelines.stage import Output, StageRun, Upstream, fingerprint
from pipelines.stage_dir import ShardInfo, StageDir
from pipelines.stages.examples import CODE_VERSION
from pipelines.storage import Storage

log = logging.getLogger(__name__)

SPLITS = ("train", "validation")
_TOKEN_LENGTH_CAP = 4096  # tokens per sentence counted exactly up to this
FLUSH_ROWS = 4096
"""Records buffered per length bin before they are written as one record batch (at least)."""


@dataclass(frozen=True)
class VocabSource:
    """Where workers find the vocabulary: the vocab stage's folder, cached locally per fingerprint."""

    uri: str
    key: str
    files: tuple[str, ...]
    """The vocabulary's files (WordPiece's or byte-level BPE's), as the vocab manifest lists them."""

    def local(self, storage: Storage) -> str:
        return local_folder(storage, self.uri, self.files, self.key)


# -- the documents random next sentences come from --------------------------------------------


@dataclass
class DocumentIndex:
    """Document number -> (token shard, row), for token shards of one split. Small: two ints per shard."""

    shard_uris: list[str]
    starts: np.ndarray  # (S+1,) first document number of each shard, then the total

    @property
    def num_documents(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        shard = int(np.searchsorted(self.starts, index, side="right") - 1)
        return shard, index - int(self.starts[shard])

    def documents(self, shard: int) -> range:
        """The numbers of a shard's documents."""
        return range(int(self.starts[shard]), int(self.starts[shard + 1]))

    def subset(self, shards: list[int]) -> DocumentIndex:
        """The documents of `shards` (in that order), numbered from 0."""
        sizes = np.diff(self.starts)[shards]
        return DocumentIndex([self.shard_uris[s] for s in shards], np.concatenate([[0], np.cumsum(sizes)]))

    @functools.cached_property
    def start_list(self) -> list[int]:
        return self.starts.tolist()


class TokenStore:
    """`RandomDocs` over the token shards of an index, memory-mapped and opened lazily (a
    shard never drawn from is never copied); a document comes back as a `FlatDocument` over
    the mapped ids (nothing copied until read). Remote shards are copied into `folder`, a
    temporary folder of the task's; `close` drops the maps, so the copies' disk space goes
    when the folder does."""

    def __init__(self, index: DocumentIndex, storage: Storage, folder: str):
        self.index = index
        self.storage = storage
        self.folder = folder
        self._shards: dict[int, tuple[list[int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]]] = {}

    @property
    def num_documents(self) -> int:
        return self.index.num_documents

    def _arrays(self, shard: int) -> tuple[list[int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        if shard not in self._shards:
            self._shards[shard] = _mapped_token_shard(
                download_into(self.storage, self.index.shard_uris[shard], self.folder)
            )
        return self._shards[shard]

    def get(self, index: int) -> FlatDocument:
        # bisect on lists: a numpy call per lookup costs more than the lookup (called per random B)
        shards = self.index.start_list
        shard = bisect.bisect_right(shards, index) - 1
        row = index - shards[shard]
        starts, batches = self._arrays(shard)
        b = bisect.bisect_right(starts, row) - 1
        ids, segment_bounds, document_bounds = batches[b]
        row -= starts[b]
        # tokenize_shard stores no empty segment
        return FlatDocument(
            ids, segment_bounds[document_bounds[row] : document_bounds[row + 1] + 1], nonempty_known=True
        )

    def close(self) -> None:
        self._shards.clear()


def _mapped_token_shard(path: str) -> tuple[list[int], list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """One token shard, memory-mapped: the first row of each record batch, and per batch
    (ids, segment bounds, document bounds) as numpy views of the map. A mapped shard costs
    address space, not memory."""
    starts, batches = [0], []
    # The views keep the mapping alive; the file itself is closed here (not left to garbage
    # collection), so a task can hold many shards without holding their descriptors.
    with pa.memory_map(path) as source:
        reader = ipc.open_file(source)
        for i in range(reader.num_record_batches):
            documents = reader.get_batch(i).column("segments")
            segments = documents.values
            batches.append((numpy_view(segments.values), numpy_view(segments.offsets), numpy_view(documents.offsets)))
            starts.append(starts[-1] + len(documents))
    return starts, batches


@functools.lru_cache(maxsize=4)
def _vocabulary(directory: str) -> tuple[Tokenizer, VocabTables]:
    """The tokenizer and its masking tables, loaded once per worker process and vocabulary
    (the directory is a per-fingerprint cache, or the vocab stage's own local directory).
    The tokenizer splits text as the vocabulary's files record (Korean morphemes when the
    vocab stage split them, each continuation morpheme a `##` piece, so whole-word masking
    masks whole eojeols: bertcore/vocab/morphemes.py)."""
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


def _tokenize(tokenizer: Tokenizer, batch: pa.RecordBatch, ids_type: pa.DataType, lengths_seen: Lengths) -> pa.Array:
    """A batch's documents as list<list<id>>: each document's non-empty sentences' ids
    (their token counts are added to `lengths_seen`)."""
    documents = batch.column("sentences")
    sentences = documents.flatten().to_pylist()
    sentence_bounds = numpy_view(documents.offsets)
    sentence_bounds = sentence_bounds - sentence_bounds[0]
    # a document at a time, without character offsets, which nothing here needs
    ids, lengths = encode_sentences(tokenizer, sentences, sentence_bounds)
    values = ids.astype(numpy_dtype(ids_type))
    kept = lengths > 0  # Google drops lines that tokenize to nothing; so do we, here
    lengths_seen.add(lengths[kept])
    segment_bounds = offsets_of(lengths[kept])
    document_bounds = offsets_of(kept)[sentence_bounds]  # kept sentences before each bound
    segments = list_array(segment_bounds, values, ids_type)
    return pa.ListArray.from_arrays(arrow_array(document_bounds, pa.int32()), segments)


# -- Ray tasks ----------------------------------------------------------------------------------


@ray.remote(num_cpus=1, max_retries=3)
def tokenize_shard(corpus_uri: str, relative: str, vocab: VocabSource, stage: StageDir, fp: str) -> tuple[int, dict]:
    """Tokenize one corpus shard's documents; returns the number of documents and the
    distribution of tokens per sentence (Lengths as JSON)."""
    done = stage.done(relative, fp)
    if done is not None and done.result is not None:
        return done.shards[0].rows, done.result
    tokenizer, tables = _vocabulary(vocab.local(stage.storage))
    ids_type = id_type(tables.vocab_size)
    schema = pa.schema([("doc_id", pa.string()), ("segments", pa.list_(pa.list_(ids_type)))])
    lengths = Lengths(_TOKEN_LENGTH_CAP)
    with _one_thread():
        parts = [
            pa.table(
                {"doc_id": batch.column("doc_id"), "segments": _tokenize(tokenizer, batch, ids_type, lengths)},
                schema=schema,
            )
            for batch in read_batches(stage.storage, corpus_uri)
        ]
    table = pa.concat_tables(parts) if parts else schema.empty_table()
    shard = stage.publish(relative, lambda path: write_table(path, table), rows=table.num_rows)
    stage.complete(relative, fp, [shard], lengths.to_json())
    return shard.rows, lengths.to_json()


@ray.remote(num_cpus=1, max_retries=3)
def build_shard(
    phase: PhaseConfig,
    split: str,
    shard_number: int,
    index: DocumentIndex,
    cfg: ExamplesConfig,
    seed: int,
    vocab: VocabSource,
    stage: StageDir,
    fp: str,
) -> tuple[list[ShardInfo], dict]:
    """Examples of one corpus shard for one phase, one file per length bin."""
    unit = f"build/{phase.name}/{split}/{shard_number:05d}"
    done = stage.done(unit, fp)
    if done is not None:
        return done.shards, done.result

    storage = stage.storage
    _, tables = _vocabulary(vocab.local(storage))
    schema = arrow_schema(tables.vocab_size)
    drawn = random_next_shards(
        shard_number,
        len(index.shard_uris),
        cfg.random_next_shards,
        keyed_random(seed, "examples", phase.name, split, shard_number),
    )
    near = index.subset(drawn)
    own = near.documents(drawn.index(shard_number))  # numbered in `near`; keyed by their numbers in the split
    stats = ExampleStats()

    with (
        tempfile.TemporaryDirectory(prefix="bertpipe-examples-") as tmp,
        contextlib.closing(TokenStore(near, storage, os.path.join(tmp, "tokens"))) as docs,
    ):
        writers: dict[int, tuple[ipc.RecordBatchFileWriter, pa.OSFile]] = {}
        buffers: dict[int, list[pa.RecordBatch]] = defaultdict(list)
        counts: dict[int, int] = defaultdict(int)

        def flush(bin_: int) -> None:
            if bin_ not in writers:
                sink = pa.OSFile(os.path.join(tmp, f"{bin_}.arrow"), "wb")
                writers[bin_] = (ipc.new_file(sink, schema), sink)
            writers[bin_][0].write_table(pa.Table.from_batches(buffers[bin_], schema=schema).combine_chunks())
            buffers[bin_].clear()

        keys = list(index.documents(shard_number))
        for batch in example_batches(list(own), docs, cfg, phase, seed, tables, stats, doc_keys=keys):
            bins = length_bin(numpy_view(batch.column("length")), cfg.length_bins)
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

        shards = [
            stage.publish_copy(
                f"{phase.name}/{split}/part-{shard_number:05d}-len{bin_:03d}.arrow",
                os.path.join(tmp, f"{bin_}.arrow"),
                rows=counts[bin_],
                extra={"phase": phase.name, "split": split, "bin": bin_},
            )
            for bin_ in sorted(writers)
        ]
    return shards, stage.complete(unit, fp, shards, stats.to_dict()).result


# -- the stage ----------------------------------------------------------------------------------


def run(r: StageRun) -> Output:
    cfg: ExamplesConfig = r.section
    corpus, vocab_stage = r.inputs["corpus"], r.inputs["vocab"]
    vocab = VocabSource(
        vocab_stage.dir.uri,
        vocab_stage.fingerprint,
        tuple(tokenizer_files(s.path for s in vocab_stage.manifest.shards)),
    )
    actual = _checked_vocab_fingerprint(r.storage, vocab_stage, vocab)

    # step 1: tokens, keyed by corpus and vocab only: a rerun of an unfinished stage reuses them even after a masking
    # setting changed (a finished stage's `_tokens/` is scratch, removed with its manifest written: pipelines/stage.py)
    t0 = time.perf_counter()
    indexes, token_lengths = _tokenize_corpus(r, corpus, vocab)
    t_tokens = time.perf_counter() - t0

    # step 2: examples per (phase, split, corpus shard)
    t0 = time.perf_counter()
    tasks = [
        (phase, split, n) for phase in cfg.phases for split in SPLITS for n in range(len(indexes[split].shard_uris))
    ]
    log.info(
        "examples: %s, %s masking, phases %s, dupe_factor %d: %d build tasks",
        cfg.objective,
        cfg.masking,
        ", ".join(p.name for p in cfg.phases),
        cfg.dupe_factor,
        len(tasks),
    )
    results = run_tasks(
        lambda t: build_shard.remote(t[0], t[1], t[2], indexes[t[1]], cfg, r.seed, vocab, r.dir, r.fingerprint),
        tasks,
        parallelism=r.parallelism,
        desc="examples: build",
        rows=lambda result: sum(s.rows for s in result[0]),
    )
    t_build = time.perf_counter() - t0

    shards: list[ShardInfo] = []
    merged: dict[str, dict[str, ExampleStats]] = defaultdict(lambda: defaultdict(ExampleStats))
    for (phase, split, _), (task_shards, task_stats) in zip(tasks, results):
        shards.extend(task_shards)
        merged[phase.name][split] = merged[phase.name][split].merge(ExampleStats.from_dict(task_stats))
    _remove_leftovers(r.dir, {s.path for s in shards})
    stats = {
        "masking": cfg.masking,
        "objective": cfg.objective,
        "vocab_size": _vocabulary(vocab.local(r.storage))[1].vocab_size,
        "vocab_fingerprint": actual,
        "documents": {split: indexes[split].num_documents for split in SPLITS},
        # tokens per (non-empty) corpus sentence: how much of the text long sentences hold,
        # which sequence lengths truncate
        "sentence_tokens": token_lengths.summary(over=(64, 128, 256, 512)),
        "phases": {name: {split: s.to_dict() for split, s in by_split.items()} for name, by_split in merged.items()},
    }
    timings = {"tokenize_s": round(t_tokens, 3), "build_s": round(t_build, 3)}
    headline = {"examples": sum(s.rows for s in shards)}
    for phase in cfg.phases:
        headline[phase.name] = sum(s.rows for s in shards if s.path.startswith(f"{phase.name}/"))
    return Output(shards=shards, stats=stats, timings=timings, headline=headline)


def _checked_vocab_fingerprint(storage: Storage, stage: Upstream, vocab: VocabSource) -> str:
    """The vocabulary files' fingerprint, which must be what the vocab stage recorded."""
    recorded = stage.manifest.stats.get("vocab_fingerprint")
    actual = vocab_fingerprint(vocab.local(storage))
    if recorded != actual:
        raise InputDataError(
            f"{stage.dir.uri}: the vocabulary files (fingerprint {actual}) do not match the tokenizer the vocab stage "
            f"recorded ({recorded}); re-run the vocab stage (`bertpipe run --from vocab --force`)"
        )
    return actual


def _tokenize_corpus(r: StageRun, corpus: Upstream, vocab: VocabSource) -> tuple[dict[str, DocumentIndex], Lengths]:
    """Token shards of every corpus shard (`_tokens/`), the document index of each split,
    and the tokens per sentence over the whole corpus."""
    tokens_fp = fingerprint("examples-tokens", CODE_VERSION, {}, {"corpus": corpus.fingerprint, "vocab": vocab.key})
    jobs = [(s.path, f"_tokens/{s.path}") for s in corpus.manifest.shards]
    shard_bytes = {s.path: s.bytes for s in corpus.manifest.shards}
    results = run_tasks(
        lambda job: tokenize_shard.remote(corpus.path(job[0]), job[1], vocab, r.dir, tokens_fp),
        jobs,
        parallelism=r.parallelism,
        desc="examples: tokenize",
        sizes=[shard_bytes[path] for path, _ in jobs],
        rows=lambda result: result[0],
    )
    counts = [n for n, _ in results]
    lengths = Lengths(_TOKEN_LENGTH_CAP)
    for _, seen in results:
        lengths.merge(Lengths.from_json(seen))
    indexes = {}
    for split in SPLITS:
        uris = [r.dir.path(tok) for (path, tok), _ in zip(jobs, counts) if path.startswith(split + "/")]
        sizes = [n for (path, _), n in zip(jobs, counts) if path.startswith(split + "/")]
        indexes[split] = DocumentIndex(uris, np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]))
    return indexes, lengths


def _remove_leftovers(stage: StageDir, keep: set[str]) -> None:
    """Delete example shards an earlier run with other settings left behind."""
    phases = [p for p in stage.storage.listdir(stage.uri) if not p.startswith(("_", "."))]
    stage.remove_except([f"{phase}/{split}" for phase in phases for split in SPLITS], keep)
