"""Vocabulary stage: train a WordPiece (BERT) or byte-level BPE (RoBERTa, vocab.model:
byte_level_bpe) vocabulary on sentences sampled from the corpus, or adopt an existing one
(vocab.source: pretrained).

Ray shape: one task per train shard streams its record batches and keeps each sentence
with probability p = min(1, max_sentences / corpus sentences), drawn from an RNG keyed by
(seed, "vocab", shard), so the sample is uniform over the corpus and does not depend on
the number of workers; one task on one node trains on the sample in shard order (WordPiece
first chooses its alphabet from character counts made per shard). The files a
`transformers` tokenizer needs are written to the stage directory. With
vocab.pre_tokenizer kiwi or mecab, the sample is split into Korean morphemes where it is
counted and trained on, and the files record the split (bertcore/vocab/morphemes.py).

Adopting: the vocabulary files (vocab.pretrained, or pretrain.init_from's folder) are
outside the run root, so their content identity is part of the fingerprint (`identify`);
one task reads and checks them (bertcore.vocab.adopt), writes the same files as training
would, entry for entry, and measures how well they fit the corpus.
"""

from __future__ import annotations

import logging
import os
import tempfile

import pyarrow.compute as pc
import ray
from tokenizers import Tokenizer

from bertcore.errors import ConfigError
from bertcore.rng import keyed_numpy
from bertcore.vocab import morphemes
from bertcore.vocab.adopt import read_bpe_vocabulary, read_vocabulary
from bertcore.vocab.bpe import save_bpe, train_byte_level_bpe
from bertcore.vocab.config import ADOPTED_OPTIONS, MERGES_FILE, VOCAB_JSON
from bertcore.vocab.tokenizer import (
    CONFIG_FILE,
    VOCAB_FILE,
    AlphabetCounts,
    VocabConfig,
    count_alphabet,
    load_tokenizer,
    save_tokenizer,
    tokenization_stats,
    train_wordpiece,
    vocab_fingerprint,
)
from pipelines.external import ExternalFolder
from pipelines.ray_runtime import run_tasks
from pipelines.shards import read_batches
from pipelines.stage import Output, StageRun, Upstream
from pipelines.stage_dir import ShardInfo, StageDir
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
def train_and_save(
    sample_refs: list, alphabet_refs: list, validation: list[str], cfg: VocabConfig, stage: StageDir
) -> tuple[list[ShardInfo], dict]:
    """Train on the sample (shard order), write the tokenizer files, compute statistics."""

    def sentences():
        for ref in sample_refs:
            yield from ray.get(ref)

    if cfg.byte_level:
        return _publish(train_byte_level_bpe(sentences(), cfg), cfg, validation, stage)
    alphabet = AlphabetCounts()
    for ref in alphabet_refs:
        alphabet = alphabet.merge(ray.get(ref))
    tokenizer = train_wordpiece(sentences(), cfg, alphabet=alphabet)
    return _publish(tokenizer, cfg, validation, stage)


@ray.remote(num_cpus=1, max_retries=1)
def adopt_and_save(
    source: ExternalFolder, validation: list[str], cfg: VocabConfig, stage: StageDir
) -> tuple[list[ShardInfo], dict]:
    """Read and check the adopted vocabulary, write its tokenizer files, compute statistics."""
    local = source.local(stage.storage)
    paths = {name: os.path.join(local, name) for name in source.files}
    if cfg.byte_level:
        tokenizer = read_bpe_vocabulary(
            vocab_json=paths.get(VOCAB_JSON),
            merges_txt=paths.get(MERGES_FILE),
            tokenizer_json=next(
                (p for n, p in paths.items() if n not in (CONFIG_FILE, VOCAB_JSON) and n.endswith(".json")), None
            ),
        )
        shards, stats = _publish(tokenizer, cfg, validation, stage)
        stats["adopted"] = {"from": source.uri, "files": source.files, "options": {}}
        return shards, stats
    adopted = read_vocabulary(
        vocab_txt=next((p for n, p in paths.items() if n != CONFIG_FILE and not n.endswith(".json")), None),
        tokenizer_json=next((p for n, p in paths.items() if n != CONFIG_FILE and n.endswith(".json")), None),
        tokenizer_config=paths.get(CONFIG_FILE),
    )
    effective = adopted.config(cfg)
    shards, stats = _publish(adopted.tokenizer(cfg), effective, validation, stage)
    options = {key: getattr(effective, key) for key in ADOPTED_OPTIONS} | {
        "strip_accents": effective.strip_accents_effective
    }
    stats["adopted"] = {"from": source.uri, "files": source.files, "options": options}
    return shards, stats


def _publish(
    tokenizer: Tokenizer, cfg: VocabConfig, validation: list[str], stage: StageDir
) -> tuple[list[ShardInfo], dict]:
    """Write the tokenizer files as the stage's shards; statistics on the validation
    sentences, tokenized as the files say (a morpheme split as recorded), as later stages will."""
    with tempfile.TemporaryDirectory() as tmp:
        names = save_bpe(tokenizer, tmp) if cfg.byte_level else save_tokenizer(tokenizer, cfg, tmp)
        stats = tokenization_stats(load_tokenizer(tmp), validation)
        stats.update(morphemes.recorded(tmp))
        stats["vocab_fingerprint"] = vocab_fingerprint(tmp)
        shards = []
        for name in names:
            rows = stats["vocab_size"] if name in (VOCAB_FILE, VOCAB_JSON) else 0
            shards.append(stage.publish_copy(name, os.path.join(tmp, name), rows))
    return shards, stats


def run(r: StageRun) -> Output:
    cfg: VocabConfig = r.section
    corpus = r.inputs["corpus"]
    morphemes.require(cfg.pre_tokenizer)  # a missing analyser: one line now, not a failed task later
    if cfg.source == "pretrained":
        validation = _validation_sentences(r.storage, corpus)
        shards, stats = run_tasks(
            lambda _: adopt_and_save.remote(r.external, validation, cfg, r.dir),
            [None],
            parallelism=1,
            desc="vocab: adopt",
        )[0]
        return Output(
            shards=shards,
            stats=stats,
            headline=_headline(stats, adopted=True),
            inputs={"pretrained": r.external.identity},
        )
    train = corpus.manifest.shards_under("train/")
    total = sum(s.extra.get("sentences", 0) for s in train)
    if total == 0:
        raise ConfigError(
            f"vocab: the corpus under {corpus.dir.uri} has no training sentences "
            f"(the corpus stage kept {corpus.manifest.stats.get('documents_kept', 0)} documents); check "
            "corpus.inputs and the corpus filters"
        )
    probability = min(1.0, cfg.max_sentences / total)
    log.info(
        "vocab: training a %d-entry %s on %s of %d corpus sentences (%d train shards)%s",
        cfg.vocab_size,
        "byte-level BPE" if cfg.byte_level else "WordPiece",
        "all" if probability >= 1.0 else f"{probability:.1%}",
        total,
        len(train),
        ""
        if cfg.pre_tokenizer == "whitespace"
        else f", split into {cfg.pre_tokenizer} morphemes ({morphemes.analyzer_versions(cfg.pre_tokenizer)})",
    )
    sample_refs = [sample_shard.remote(r.storage, corpus.path(s.path), probability, r.seed, s.path) for s in train]
    alphabet_refs = [] if cfg.byte_level else [shard_alphabet.remote(ref, cfg) for ref in sample_refs]
    validation = _validation_sentences(r.storage, corpus)
    shards, stats = run_tasks(
        lambda _: train_and_save.remote(sample_refs, alphabet_refs, validation, cfg, r.dir),
        [None],
        parallelism=1,
        desc="vocab: train",
    )[0]
    stats["sampled_sentences_probability"] = probability
    stats["corpus_train_sentences"] = total
    return Output(shards=shards, stats=stats, headline=_headline(stats))


def _headline(stats: dict, adopted: bool = False) -> dict:
    """vocabulary 8,000 · [UNK] rate 0.02% · pieces/word 1.31 (on the corpus's validation
    sentences) · and with a morpheme split, `split kiwi morphemes`"""
    size = f"{stats['vocab_size']:,} (adopted)" if adopted else stats["vocab_size"]
    headline = {
        "vocabulary": size,
        "[UNK] rate": f"{stats['unk_rate']:.2%}",
        "pieces/word": round(stats["pieces_per_word"], 2),
    }
    if morphemes.PRE_TOKENIZER_KEY in stats:
        headline["split"] = f"{stats[morphemes.PRE_TOKENIZER_KEY]} morphemes"
    return headline


def _validation_sentences(storage: Storage, corpus: Upstream) -> list[str]:
    out: list[str] = []
    for shard in corpus.manifest.shards_under("validation/"):
        for batch in read_batches(storage, corpus.path(shard.path)):
            out.extend(pc.list_flatten(batch.column("sentences")).to_pylist())
            if len(out) >= STATS_SENTENCES:
                return out[:STATS_SENTENCES]
    return out
