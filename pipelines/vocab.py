"""Vocabulary stage: train a WordPiece vocabulary on sentences sampled from the corpus.

Ray shape: one task per train shard streams its record batches and keeps each sentence
with probability p = min(1, max_sentences / corpus sentences), drawn from an RNG keyed by
(seed, "vocab", shard), so the sample is uniform over the corpus and does not depend on
the number of workers; one task on one node trains on the sample in shard order. The
files a `transformers` tokenizer needs are written to the stage directory.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import ray

from bertcore.config import PipelineConfig
from bertcore.errors import BertpipeError, ConfigError
from bertcore.rng import keyed_numpy
from bertcore.tokenizer import (
    AlphabetCounts,
    VocabConfig,
    count_alphabet,
    save_tokenizer,
    tokenization_stats,
    train_wordpiece,
    vocab_fingerprint,
)
from pipelines import corpus
from pipelines.ray_runtime import run_tasks
from pipelines.stage import Manifest, ShardInfo, StageDir, fingerprint
from pipelines.storage import Storage

log = logging.getLogger(__name__)

STAGE = "vocab"
CODE_VERSION = "1"
STATS_SENTENCES = 20_000
"""Validation sentences tokenized for the manifest statistics."""


class UpstreamMissing(BertpipeError):
    """The stage this one reads is not complete."""


def read_batches(storage: Storage, uri: str):
    """Record batches of one Arrow shard, memory-mapped when local (never read whole)."""
    local = storage.local_path(uri)
    if local is not None:
        with pa.memory_map(local) as source:
            reader = ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
    else:
        with storage.open(uri, "rb") as handle:
            reader = ipc.open_file(handle)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def upstream_manifest(cfg: PipelineConfig, storage: Storage, stage: str) -> Manifest:
    manifest = StageDir(storage, cfg.run.root, stage).manifest()
    if manifest is None:
        raise UpstreamMissing(f"the {stage} stage has no output under {cfg.run.root}/{stage}: run `bertpipe run --only {stage}` (or the whole flow) first")
    return manifest


@ray.remote(num_cpus=1, max_retries=3)
def sample_shard(storage: Storage, uri: str, probability: float, seed: int, key: str) -> list[str]:
    """The sentences of one shard kept with `probability` (keyed RNG, batch by batch)."""
    rng = keyed_numpy(seed, STAGE, key)
    kept: list[str] = []
    for batch in read_batches(storage, uri):
        sentences = pc.list_flatten(batch.column("sentences")).to_pylist()
        if probability >= 1.0:
            kept.extend(sentences)
        else:
            mask = rng.random(len(sentences)) < probability
            kept.extend(s for s, keep in zip(sentences, mask) if keep)
    return kept


@ray.remote(num_cpus=1, max_retries=3)
def shard_alphabet(sample: list[str], cfg: VocabConfig) -> AlphabetCounts:
    """Character counts of one shard's sample (the alphabet is chosen from the merged counts)."""
    return count_alphabet(sample, cfg)


@ray.remote(num_cpus=1, max_retries=1)
def train_and_save(
    sample_refs: list, alphabet_refs: list, validation: list[str], cfg: VocabConfig, storage: Storage, root: str, fp: str
) -> tuple[list[ShardInfo], dict]:
    """Train on the sample (shard order), write the tokenizer files, compute statistics."""

    def sentences():
        for ref in sample_refs:
            yield from ray.get(ref)

    alphabet = AlphabetCounts()
    for ref in alphabet_refs:
        alphabet = alphabet.merge(ray.get(ref))
    tokenizer = train_wordpiece(sentences(), cfg, alphabet=alphabet)
    stats = tokenization_stats(tokenizer, validation)
    stage = StageDir(storage, root, STAGE)
    shards = []
    with tempfile.TemporaryDirectory() as tmp:
        names = save_tokenizer(tokenizer, cfg, tmp)
        stats["vocab_fingerprint"] = vocab_fingerprint(tmp)
        for name in names:
            local = os.path.join(tmp, name)
            rows = sum(1 for _ in open(local, encoding="utf-8")) if name == "vocab.txt" else 0

            def copy(path: str, local=local) -> None:
                with open(local, "rb") as src, open(path, "wb") as dst:
                    dst.write(src.read())

            shards.append(stage.write_shard(name, fp, copy, rows=rows))
    return shards, stats


def expected_fingerprint(cfg: PipelineConfig, storage: Storage) -> str:
    return _fingerprint(cfg, corpus.expected_fingerprint(cfg, storage))


def _fingerprint(cfg: PipelineConfig, corpus_fp: str) -> str:
    section = cfg.vocab.model_dump(mode="json")
    return fingerprint(STAGE, CODE_VERSION, section, {"corpus": corpus_fp, "seed": cfg.run.seed})


def run(cfg: PipelineConfig, storage: Storage, *, force: bool = False, parallelism: int | None = None) -> tuple[Manifest, bool]:
    started = time.perf_counter()
    source = upstream_manifest(cfg, storage, "corpus")
    fp = _fingerprint(cfg, source.fingerprint)
    stage = StageDir(storage, cfg.run.root, STAGE)
    if (done := stage.reuse_or_reset(fp, force=force, keep_progress=False)) is not None:
        return done, False

    corpus_dir = StageDir(storage, cfg.run.root, "corpus")
    train = [s for s in source.shards if s.path.startswith("train/")]
    total = sum(s.extra.get("sentences", 0) for s in train)
    if total == 0:
        raise ConfigError(
            f"vocab: the corpus under {corpus_dir.uri} has no training sentences "
            f"(the corpus stage kept {source.stats.get('documents_kept', 0)} documents); check corpus.inputs and the corpus filters"
        )
    probability = min(1.0, cfg.vocab.max_sentences / total)
    sample_refs = [
        sample_shard.remote(storage, corpus_dir.path(s.path), probability, cfg.run.seed, s.path) for s in train
    ]
    alphabet_refs = [shard_alphabet.remote(ref, cfg.vocab) for ref in sample_refs]
    validation = _validation_sentences(storage, corpus_dir, source)
    shards, stats = run_tasks(
        lambda _: train_and_save.remote(sample_refs, alphabet_refs, validation, cfg.vocab, storage, cfg.run.root, fp),
        [None],
        parallelism=1,
        desc="vocab: train",
    )[0]
    stats["sampled_sentences_probability"] = probability
    stats["corpus_train_sentences"] = total
    manifest = Manifest(
        stage=STAGE,
        code_version=CODE_VERSION,
        fingerprint=fp,
        inputs={"corpus": source.fingerprint},
        config=cfg.vocab.model_dump(mode="json"),
        shards=shards,
        stats=stats,
        timings={"total_s": round(time.perf_counter() - started, 3)},
    )
    stage.write_manifest(manifest, cfg)
    return manifest, True


def _validation_sentences(storage: Storage, corpus_dir: StageDir, source: Manifest) -> list[str]:
    out: list[str] = []
    for shard in (s for s in source.shards if s.path.startswith("validation/")):
        for batch in read_batches(storage, corpus_dir.path(shard.path)):
            out.extend(pc.list_flatten(batch.column("sentences")).to_pylist())
            if len(out) >= STATS_SENTENCES:
                return out[:STATS_SENTENCES]
    return out
