"""Examples stage library: the shard record layout, and documents -> training records
(pairs or packed sentences, then static masking). The `examples:` section is in
bertcore/examples/config.py.

Record (one per training sequence, nothing padded; the layout of every examples shard):
    input_ids           list<uint16>  [CLS] A [SEP] B [SEP] (int32 when vocab > 65,535);
                                      RoBERTa's vocabulary: <s> A </s></s> B </s>
    segment_b_start     uint16        index of B's first token (== length without B)
    masked_positions    list<uint16>  sorted; empty with dynamic masking
    masked_ids          list<uint16>  original ids there; empty with dynamic masking
    next_sentence_label int8          0 = B follows A, 1 = B random (sop: swapped); -1 no NSP
    length              uint16        len(input_ids)

Randomness: one `random.Random` per (seed, "examples", phase, document, pass) drives the
pairs and then the masks of that document, so the output does not depend on how documents
are spread over workers. RoBERTa FULL-SENTENCES packs across the documents of one shard;
its generator is keyed by the shard's first document instead. Random B segments come from
the `RandomDocs` the caller gives (the stage: the shard's own documents and those of a
keyed sample of other shards, `bertcore.examples.pairs.random_next_shards`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from bertcore.examples.arrow import arrow_array, list_array, numpy_dtype, offsets_of
from bertcore.examples.config import UINT16_MAX, ExamplesConfig, PhaseConfig
from bertcore.examples.masking import (
    KEPT,
    MASKED,
    RANDOM,
    MaskConfig,
    MaskDraws,
    MaskedExample,
    MaskedSequences,
    VocabTables,
    mask_sequences,
    mask_tokens,
)
from bertcore.examples.pairs import Pair, RandomDocs, build_pairs, pack_sentences
from bertcore.rng import keyed_random


def id_type(vocab_size: int) -> pa.DataType:
    return pa.uint16() if vocab_size <= UINT16_MAX else pa.int32()


def arrow_schema(vocab_size: int) -> pa.Schema:
    ids = id_type(vocab_size)
    return pa.schema(
        [
            pa.field("input_ids", pa.list_(ids), nullable=False),
            pa.field("segment_b_start", pa.uint16(), nullable=False),
            pa.field("masked_positions", pa.list_(pa.uint16()), nullable=False),
            pa.field("masked_ids", pa.list_(ids), nullable=False),
            pa.field("next_sentence_label", pa.int8(), nullable=False),
            pa.field("length", pa.uint16(), nullable=False),
        ]
    )


def records_to_table(records: Sequence[dict], vocab_size: int) -> pa.Table:
    """Records (as from examples_for_document) -> an Arrow table with `arrow_schema`."""
    schema = arrow_schema(vocab_size)
    columns = [pa.array([r[f.name] for r in records], type=f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _value_counts(values: np.ndarray) -> dict[int, int]:
    return dict(zip(*(a.tolist() for a in np.unique(values, return_counts=True))))


@dataclass
class ExampleStats:
    """Counts over produced records; mergeable across workers (`merge`, `from_dict`)."""

    document_passes: int = 0
    short_target_documents: int = 0
    examples: int = 0
    tokens: int = 0
    length_histogram: Counter = field(default_factory=Counter)
    masked: int = 0
    masked_kinds: Counter = field(default_factory=Counter)
    nsp_labels: Counter = field(default_factory=Counter)
    truncated: int = 0
    single_segment_chunks: int = 0
    short_target_examples: int = 0
    same_document_negatives: int = 0

    def add_document(self, short_target: bool) -> None:
        self.document_passes += 1
        self.short_target_documents += int(short_target)

    def add_pair(self, pair: Pair) -> None:
        self.truncated += int(pair.truncated)
        self.single_segment_chunks += int(pair.single_segment_chunk)
        self.short_target_examples += int(pair.target_was_short)
        self.same_document_negatives += int(pair.same_document_negative)

    def add_sequences(self, lengths: np.ndarray, labels: np.ndarray, kinds: np.ndarray) -> None:
        """Sequences of a block: their lengths, NSP labels and the kinds of their masks."""
        self.examples += len(lengths)
        self.tokens += int(lengths.sum())
        self.length_histogram.update(_value_counts(lengths))
        self.nsp_labels.update(_value_counts(labels))
        self.masked += len(kinds)
        self.masked_kinds.update(_value_counts(kinds))

    def merge(self, other: ExampleStats) -> ExampleStats:
        out = ExampleStats()
        for name in self.__dataclass_fields__:
            a, b = getattr(self, name), getattr(other, name)
            setattr(out, name, a + b if not isinstance(a, Counter) else Counter(a) + Counter(b))
        return out

    def _share(self, part: int, whole: int) -> float | None:
        return part / whole if whole else None

    def to_dict(self) -> dict:
        """Counts plus shares (JSON-ready; Counter keys become strings)."""
        s = self._share(self.single_segment_chunks, self.examples)
        nsp = self.nsp_labels[0] + self.nsp_labels[1]
        return {
            "document_passes": self.document_passes,
            "short_target_documents": self.short_target_documents,
            "examples": self.examples,
            "tokens": self.tokens,
            "length_histogram": {str(k): v for k, v in sorted(self.length_histogram.items())},
            "masked": self.masked,
            "masked_kinds": {
                "mask": self.masked_kinds[MASKED],
                "kept": self.masked_kinds[KEPT],
                "random": self.masked_kinds[RANDOM],
            },
            "nsp_labels": {str(k): v for k, v in sorted(self.nsp_labels.items())},
            "truncated": self.truncated,
            "single_segment_chunks": self.single_segment_chunks,
            "short_target_examples": self.short_target_examples,
            "same_document_negatives": self.same_document_negatives,
            "shares": {
                "short_target_documents": self._share(self.short_target_documents, self.document_passes),
                "short_target_examples": self._share(self.short_target_examples, self.examples),
                "truncated": self._share(self.truncated, self.examples),
                "single_segment_chunks": s,
                "random_next": self._share(self.nsp_labels[1], nsp),
                # What Google's algorithm implies: forced for one-segment chunks, else p=0.5.
                "random_next_expected": None if s is None or not nsp else s + 0.5 * (1 - s),
                "masked_per_token": self._share(self.masked, self.tokens),
                "mask": self._share(self.masked_kinds[MASKED], self.masked),
                "kept": self._share(self.masked_kinds[KEPT], self.masked),
                "random": self._share(self.masked_kinds[RANDOM], self.masked),
                "mean_length": self._share(self.tokens, self.examples),
            },
        }

    @classmethod
    def from_dict(cls, data: dict) -> ExampleStats:
        kinds = data.get("masked_kinds", {})
        return cls(
            document_passes=data["document_passes"],
            short_target_documents=data["short_target_documents"],
            examples=data["examples"],
            tokens=data["tokens"],
            length_histogram=Counter({int(k): v for k, v in data["length_histogram"].items()}),
            masked=data["masked"],
            masked_kinds=Counter(
                {MASKED: kinds.get("mask", 0), KEPT: kinds.get("kept", 0), RANDOM: kinds.get("random", 0)}
            ),
            nsp_labels=Counter({int(k): v for k, v in data["nsp_labels"].items()}),
            truncated=data["truncated"],
            single_segment_chunks=data["single_segment_chunks"],
            short_target_examples=data["short_target_examples"],
            same_document_negatives=data["same_document_negatives"],
        )


# -- documents -> record batches ------------------------------------------------------------------

BLOCK_TOKENS = 4096 * 128
"""Sequences masked together and written as one record batch: this many tokens' worth of
the phase's longest sequence (4,096 at 128 tokens, 1,024 at 512), which bounds the padded
(rows x max_seq_length) arrays of `mask_sequences` to a few MB each."""


class _Block:
    """Sequences in the order they are made, turned into one Arrow record batch at a time.

    Static masking (not spans) is drawn per document with numpy (`MaskDraws`, one generator
    per document and pass, seeded from that document's `random.Random` after its pairs) and
    applied to the whole block at once (`mask_sequences`); SpanBERT spans are masked per
    sequence as they arrive; dynamic masking stores the sequences unmasked.
    """

    def __init__(self, vocab: VocabTables, mask: MaskConfig | None, stats: ExampleStats | None):
        self.vocab = vocab
        self.mask = mask
        self.stats = stats
        self.schema = arrow_schema(vocab.vocab_size)
        self._clear()

    def _clear(self) -> None:
        self.tokens: list[int] = []  # every sequence, back to back
        self.lengths: list[int] = []
        self.b_starts: list[int] = []
        self.labels: list[int] = []
        self.draws: list[MaskDraws] = []
        self.span_masks: list[MaskedExample] = []

    def __len__(self) -> int:
        return len(self.lengths)

    def add(self, tokens: list[int], segment_b_start: int, label: int, rng: random.Random) -> None:
        self.tokens.extend(tokens)
        self._added(len(tokens), segment_b_start, label, rng)

    def add_pair(self, tokens_a: list[int], tokens_b: list[int], label: int, rng: random.Random) -> None:
        """Add [CLS] A [SEP] B [SEP] (RoBERTa's layout: <s> A </s></s> B </s>)."""
        special, tokens = self.vocab.special, self.tokens
        between = special.separators
        tokens.append(special.cls)
        tokens.extend(tokens_a)
        tokens.extend([special.sep] * between)
        tokens.extend(tokens_b)
        tokens.append(special.sep)
        self._added(len(tokens_a) + len(tokens_b) + 2 + between, len(tokens_a) + 1 + between, label, rng)

    def _added(self, length: int, segment_b_start: int, label: int, rng: random.Random) -> None:
        self.lengths.append(length)
        self.b_starts.append(segment_b_start)
        self.labels.append(label)
        if self.mask is not None and self.mask.span:
            tokens = self.tokens[-length:]
            is_continuation = self.vocab.is_continuation[np.asarray(tokens, dtype=np.int64)].tolist()
            self.span_masks.append(mask_tokens(tokens, is_continuation, rng, self.mask))

    def draw_masks(self, rng: random.Random, sequences: int) -> None:
        """Draw the masks of the last `sequences` sequences added (one document's)."""
        if self.mask is None or self.mask.span or not sequences:
            return
        tokens = sum(self.lengths[-sequences:])
        generator = np.random.default_rng(rng.getrandbits(64))
        self.draws.append(MaskDraws.draw(generator, tokens, self.vocab))

    def take(self) -> pa.RecordBatch:
        """The sequences added so far as a record batch (then forgotten)."""
        lengths = np.array(self.lengths, dtype=np.int64)
        offsets = offsets_of(lengths)
        ids = np.array(self.tokens, dtype=np.int64)
        if self.mask is None:
            masked = MaskedSequences(ids, np.zeros(len(lengths), dtype=np.int64), *(np.zeros(0, dtype=np.int64),) * 3)
        elif self.mask.span:
            masked = MaskedSequences(
                np.fromiter(chain.from_iterable(m.input_ids for m in self.span_masks), dtype=np.int64, count=len(ids)),
                np.fromiter((len(m.masked_positions) for m in self.span_masks), dtype=np.int64, count=len(lengths)),
                *(
                    np.asarray(list(chain.from_iterable(getattr(m, name) for m in self.span_masks)), dtype=np.int64)
                    for name in ("masked_positions", "masked_ids", "kinds")
                ),
            )
        else:
            masked = mask_sequences(ids, offsets, MaskDraws.concatenate(self.draws), self.mask)
        labels = np.asarray(self.labels, dtype=np.int8)
        if self.stats is not None:
            self.stats.add_sequences(lengths, labels, masked.kinds)
        mask_offsets = offsets_of(masked.counts)
        id_type_ = self.schema.field("input_ids").type.value_type
        if len(ids) and int(ids.max()) > np.iinfo(numpy_dtype(id_type_)).max:
            raise ValueError(f"token id {int(ids.max())} does not fit the shard's {id_type_} ids")
        columns = [
            list_array(offsets, masked.input_ids, id_type_),
            arrow_array(np.asarray(self.b_starts), pa.uint16()),
            list_array(mask_offsets, masked.positions, pa.uint16()),
            list_array(mask_offsets, masked.masked_ids, id_type_),
            arrow_array(labels, pa.int8()),
            arrow_array(lengths, pa.uint16()),
        ]
        self._clear()
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def _document_sequences(
    doc_index: int,
    docs: RandomDocs,
    cfg: ExamplesConfig,
    phase: PhaseConfig,
    rng: random.Random,
    block: _Block,
) -> None:
    """Add one document's pairs for one pass (objectives bert and sop) to `block`."""
    pairs = build_pairs(
        docs.get(doc_index), rng, cfg.pair_config(phase, block.vocab.special.separators), docs, doc_index
    )
    if block.stats is not None and pairs:
        block.stats.add_document(pairs[0].target_was_short)
    for pair in pairs:
        block.add_pair(pair.tokens_a, pair.tokens_b, int(pair.is_random_next), rng)
        if block.stats is not None:
            block.stats.add_pair(pair)
    block.draw_masks(rng, len(pairs))


def _packed_sequences(
    docs_iter, rng: random.Random, cfg: ExamplesConfig, phase: PhaseConfig, block: _Block
) -> Iterator[None]:
    """Add packed sequences to `block`, yielding after each (the caller flushes full blocks)."""
    special = block.vocab.special
    for body in pack_sentences(docs_iter, rng, cfg.pair_config(phase), special.sep):
        block.add([special.cls, *body, special.sep], len(body) + 2, -1, rng)
        block.draw_masks(rng, 1)
        yield


def example_batches(
    doc_indices: Sequence[int],
    docs: RandomDocs,
    cfg: ExamplesConfig,
    phase: PhaseConfig,
    seed: int,
    vocab: VocabTables,
    stats: ExampleStats | None = None,
    passes: Sequence[int] | None = None,
    block_rows: int | None = None,
    doc_keys: Sequence[str | int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Records of one corpus shard as `arrow_schema` record batches of about `block_rows`
    (default: BLOCK_TOKENS // max_seq_length), ordered by (pass, document order, pair order).

    `doc_indices` are the shard's documents as indices into `docs` (which random B segments
    are drawn from); `passes` defaults to range(cfg.dupe_factor); `doc_keys` key each
    document's generator (default: its index; the stage passes the global document numbers
    of its split, so the keys do not depend on which documents `docs` holds). The batch
    boundaries do not change the records.
    """
    mask = cfg.mask_config(phase, vocab) if cfg.masking == "static" else None
    block = _Block(vocab, mask, stats)
    if block_rows is None:
        block_rows = max(64, BLOCK_TOKENS // phase.max_seq_length)
    keys = doc_indices if doc_keys is None else doc_keys
    for pass_index in range(cfg.dupe_factor) if passes is None else passes:
        if cfg.objective == "roberta" and not cfg.doc_sentences:
            if not doc_indices:
                continue
            rng = keyed_random(seed, "examples", phase.name, "pack", keys[0], pass_index)
            for _ in _packed_sequences((docs.get(i) for i in doc_indices), rng, cfg, phase, block):
                if len(block) >= block_rows:
                    yield block.take()
            continue
        for key, doc_index in zip(keys, doc_indices):
            rng = keyed_random(seed, "examples", phase.name, key, pass_index)
            if cfg.objective == "roberta":
                for _ in _packed_sequences([docs.get(doc_index)], rng, cfg, phase, block):
                    pass
            else:
                _document_sequences(doc_index, docs, cfg, phase, rng, block)
            if len(block) >= block_rows:
                yield block.take()
    if len(block):
        yield block.take()


def examples_for_document(
    doc_index: int,
    docs: RandomDocs,
    cfg: ExamplesConfig,
    phase: PhaseConfig,
    seed: int,
    pass_index: int,
    vocab: VocabTables,
    stats: ExampleStats | None = None,
    doc_key: str | int | None = None,
) -> list[dict]:
    """Records (dicts) of one document for one pass (objectives bert, sop, and roberta with
    doc_sentences). `docs` holds the documents random B segments come from; `doc_key` keys
    the generator (default: doc_index), e.g. the corpus doc_id.
    """
    if cfg.objective == "roberta" and not cfg.doc_sentences:
        raise ValueError("FULL-SENTENCES packs across documents: use examples_for_shard")
    keys = None if doc_key is None else [doc_key]
    batches = example_batches([doc_index], docs, cfg, phase, seed, vocab, stats, [pass_index], doc_keys=keys)
    return [record for batch in batches for record in batch.to_pylist()]


def examples_for_shard(*args: Any, **kwargs: Any) -> Iterator[dict]:
    """`example_batches(...)` (same arguments) as records (dicts), for tests and small corpora."""
    for batch in example_batches(*args, **kwargs):
        yield from batch.to_pylist()
