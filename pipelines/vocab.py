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

import pyarrow.compute as pc
import ray

from bertcore.errors import ConfigError
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
from pipelines.ray_runtime import run_tasks
from pipelines.shards import read_batches
from pipelines.stage import Output, ShardInfo, Stage, StageDir, StageRun, Upstream
from pipelines.storage import Storage

log = logging.getLogger(__name__)

STATS_SENTENCES = 20_000
"""Validation sentences tokenized for the manifest statistics."""


@ray.remote(num_cpus=1, max_retries=3)
def sample_shard(storage: Storage, uri: str, probability: float, seed: int, key: str) -> list[str]:
    """The sentences of one shard kept with `probability` (keyed RNG, batch by batch)."""
    rng = keyed_numpy(seed, "vocab", key)
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
def train_and_save(sample_refs: list, alphabet_refs: list, validation: list[str], cfg: VocabConfig, stage: StageDir) -> tuple[list[ShardInfo], dict]:
    """Train on the sample (shard order), write the tokenizer files, compute statistics."""

    def sentences():
        for ref in sample_refs:
            yield from ray.get(ref)

    alphabet = AlphabetCounts()
    for ref in alphabet_refs:
        alphabet = alphabet.merge(ray.get(ref))
    tokenizer = train_wordpiece(sentences(), cfg, alphabet=alphabet)
    stats = tokenization_stats(tokenizer, validation)
    with tempfile.TemporaryDirectory() as tmp:
        names = save_tokenizer(tokenizer, cfg, tmp)
        stats["vocab_fingerprint"] = vocab_fingerprint(tmp)
        shards = []
        for name in names:
            local = os.path.join(tmp, name)
            rows = stats["vocab_size"] if name == "vocab.txt" else 0
            shards.append(stage.publish_copy(name, local, rows))
    return shards, stats


def run(r: StageRun) -> Output:
    cfg: VocabConfig = r.section
    corpus = r.inputs["corpus"]
    train = corpus.manifest.shards_under("train/")
    total = sum(s.extra.get("sentences", 0) for s in train)
    if total == 0:
        raise ConfigError(
            f"vocab: the corpus under {corpus.dir.uri} has no training sentences "
            f"(the corpus stage kept {corpus.manifest.stats.get('documents_kept', 0)} documents); check corpus.inputs and the corpus filters"
        )
    probability = min(1.0, cfg.max_sentences / total)
    log.info(
        "vocab: training a %d-entry WordPiece on %s of %d corpus sentences (%d train shards)",
        cfg.vocab_size, "all" if probability >= 1.0 else f"{probability:.1%}", total, len(train),
    )
    sample_refs = [sample_shard.remote(r.storage, corpus.path(s.path), probability, r.seed, s.path) for s in train]
    alphabet_refs = [shard_alphabet.remote(ref, cfg) for ref in sample_refs]
    validation = _validation_sentences(r.storage, corpus)
    shards, stats = run_tasks(
        lambda _: train_and_save.remote(sample_refs, alphabet_refs, validation, cfg, r.dir), [None], parallelism=1, desc="vocab: train"
    )[0]
    stats["sampled_sentences_probability"] = probability
    stats["corpus_train_sentences"] = total
    headline = {"vocabulary": stats["vocab_size"], "[UNK] rate": f"{stats['unk_rate']:.2%}", "pieces/word": round(stats["pieces_per_word"], 2)}
    return Output(shards=shards, stats=stats, headline=headline)


def _validation_sentences(storage: Storage, corpus: Upstream) -> list[str]:
    out: list[str] = []
    for shard in corpus.manifest.shards_under("validation/"):
        for batch in read_batches(storage, corpus.path(shard.path)):
            out.extend(pc.list_flatten(batch.column("sentences")).to_pylist())
            if len(out) >= STATS_SENTENCES:
                return out[:STATS_SENTENCES]
    return out


STAGE = Stage(
    "vocab", VocabConfig, run, reads=("corpus",), resumable=False,
    writes="WordPiece vocabulary: vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json",
)
