"""The examples stage library on the shipped English Wikipedia sample: statistical parity
with Google's create_pretraining_data, record layout, config validation, bad input."""

from __future__ import annotations

import bz2
import re
import xml.etree.ElementTree as ET
from collections import Counter

import mwparserfromhell
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from pydantic import ValidationError

from bertcore.examples.config import ExamplesConfig
from bertcore.examples.layout import (
    ExampleStats,
    arrow_schema,
    example_batches,
    examples_for_document,
    examples_for_shard,
    records_to_table,
)
from bertcore.examples.masking import VocabTables, num_to_predict
from bertcore.examples.pairs import FlatDocument, InMemoryDocs

SEED = 20240601


@pytest.fixture(scope="module")
def wiki(enwiki_dump):
    """(documents as token ids, VocabTables): the sample dump, split on '. ', tokenized by a
    2000-entry WordPiece trained here on the same text."""
    from tokenizers import BertWordPieceTokenizer

    pages = []
    with bz2.open(enwiki_dump) as f:
        for _, element in ET.iterparse(f):
            if element.tag.endswith("}text") and element.text:
                pages.append(element.text)
            elif element.tag.endswith("}page"):
                element.clear()
    documents = []
    for page in pages:
        text = re.sub(r"\s+", " ", mwparserfromhell.parse(page).strip_code())
        documents.append([s.strip() for s in text.split(". ") if s.strip()])
    tokenizer = BertWordPieceTokenizer(lowercase=True)
    special = ["[PAD]", *(f"[unused{i}]" for i in range(10)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    sentences = [s for doc in documents for s in doc]
    tokenizer.train_from_iterator(sentences, vocab_size=2000, special_tokens=special, show_progress=False)
    encoded = iter(tokenizer.encode_batch(sentences, add_special_tokens=False))
    docs = [[next(encoded).ids for _ in doc] for doc in documents]
    docs = [[s for s in doc if s] for doc in docs]
    docs = [doc for doc in docs if doc]
    tokens = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    return docs, VocabTables.from_tokens(tokens)


def shard(wiki, cfg, passes, phase=None, stats=None, seed=SEED):
    docs, vocab = wiki
    phase = phase or cfg.phases[0]
    return list(examples_for_shard(range(len(docs)), InMemoryDocs(docs), cfg, phase, seed, vocab, stats, passes))


def test_bert_examples_match_googles_statistics(wiki):
    docs, vocab = wiki
    sp = vocab.special
    cfg = ExamplesConfig(max_seq_length=128, max_predictions_per_seq=20)
    stats = ExampleStats()
    static = shard(wiki, cfg, range(4), stats=stats)
    # Pairs are drawn before masks from the same generator, so the unmasked (dynamic)
    # records are the originals of the static ones.
    plain = shard(wiki, cfg.model_copy(update={"masking": "dynamic"}), range(4))
    assert len(static) == len(plain) == stats.examples > 20_000

    kinds = Counter()
    mask_cfg = cfg.mask_config(cfg.phases[0], vocab)
    for record, original in zip(static, plain):
        ids, orig = record["input_ids"], original["input_ids"]
        n = record["length"]
        assert n == len(ids) == len(orig) <= 128
        assert orig[0] == sp.cls and orig[-1] == sp.sep
        seps = [i for i, t in enumerate(orig) if t == sp.sep]
        assert seps == [record["segment_b_start"] - 1, n - 1], "segment ids 0 through the first [SEP]"
        assert record["segment_b_start"] >= 2 and n - record["segment_b_start"] >= 2, "A and B non-empty"
        positions = record["masked_positions"]
        assert len(positions) == num_to_predict(n, mask_cfg)
        assert positions == sorted(set(positions))
        assert record["masked_ids"] == [orig[p] for p in positions]
        assert not {orig[p] for p in positions} & {sp.cls, sp.sep, sp.pad, sp.mask}
        assert all(ids[i] == orig[i] for i in set(range(n)) - set(positions))
        for p in positions:
            kinds["mask" if ids[p] == sp.mask else "same" if ids[p] == orig[p] else "random"] += 1
        assert record["next_sentence_label"] in (0, 1)

    masked = sum(kinds.values())
    assert masked == stats.masked >= 10_000
    summary = stats.to_dict()
    shares = summary["shares"]
    assert abs(kinds["mask"] / masked - 0.8) < 0.01
    # A random draw may hit the original id (1 in ~1985 here): "same" is kept + that.
    assert abs(kinds["same"] / masked - 0.1) < 0.01 and abs(kinds["random"] / masked - 0.1) < 0.01
    assert summary["masked_kinds"]["mask"] == kinds["mask"]
    assert abs(shares["random_next"] - shares["random_next_expected"]) < 0.02
    s = stats.single_segment_chunks / stats.examples
    labels = Counter(r["next_sentence_label"] for r in static)
    assert abs(labels[1] / len(static) - (0.5 * (1 - s) + s)) < 0.02
    assert stats.document_passes == 4 * len(docs)
    assert abs(stats.short_target_documents / stats.document_passes - 0.1) < 0.03
    # Short targets yield more (shorter) sequences per document, so their share of
    # examples is higher than of documents.
    assert shares["short_target_examples"] > shares["short_target_documents"]
    assert summary["length_histogram"] and sum(summary["length_histogram"].values()) == stats.examples


def test_whole_word_masking_on_wikipedia_masks_whole_words(wiki):
    docs, vocab = wiki
    cfg = ExamplesConfig(max_seq_length=128, max_predictions_per_seq=20, whole_word_mask=True)
    static = shard(wiki, cfg, [0])
    plain = shard(wiki, cfg.model_copy(update={"masking": "dynamic"}), [0])
    mask_cfg = cfg.mask_config(cfg.phases[0], vocab)
    cont = vocab.is_continuation
    filled = 0
    for record, original in zip(static, plain):
        orig = original["input_ids"]
        chosen = set(record["masked_positions"])
        quota = num_to_predict(record["length"], mask_cfg)
        assert len(chosen) <= quota
        filled += len(chosen) == quota
        for p in chosen:
            if cont[orig[p]] and p > 0 and orig[p - 1] not in (vocab.special.cls, vocab.special.sep):
                assert p - 1 in chosen, "a ## piece is masked with its word"
            if p + 1 < len(orig) and cont[orig[p + 1]]:
                assert p + 1 in chosen
    assert filled > 0.95 * len(static), "short words fill the quota almost always"


def test_output_depends_only_on_seed_document_and_pass(wiki):
    docs, vocab = wiki
    cfg = ExamplesConfig(max_seq_length=64)
    phase = cfg.phases[0]
    corpus = InMemoryDocs(docs)
    whole = list(examples_for_shard(range(40), corpus, cfg, phase, SEED, vocab, passes=[0, 1]))
    # Two workers with half the documents each, in any order, produce the same records.
    halves = [
        list(examples_for_shard(part, corpus, cfg, phase, SEED, vocab, passes=[p]))
        for p in (0, 1)
        for part in (range(20), range(20, 40))
    ]
    assert whole == [r for half in halves for r in half]
    single = examples_for_document(25, corpus, cfg, phase, SEED, 1, vocab)
    before = sum(len(examples_for_document(d, corpus, cfg, phase, SEED, 1, vocab)) for d in range(20, 25))
    assert single and single == halves[3][before : before + len(single)]
    assert examples_for_document(25, corpus, cfg, phase, SEED + 1, 1, vocab) != single
    assert examples_for_document(25, corpus, cfg, phase, SEED, 2, vocab) != single


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"whole_word_mask": True},
        {"span_masking": True},
        {"objective": "roberta"},
        {"objective": "roberta", "masking": "static"},
    ],
)
def test_block_boundaries_and_flat_documents_do_not_change_the_records(wiki, options):
    docs, vocab = wiki
    cfg = ExamplesConfig(max_seq_length=64, **options)
    phase = cfg.phases[0]
    lists = InMemoryDocs(docs[:30])
    reference = [
        r for b in example_batches(range(30), lists, cfg, phase, SEED, vocab, passes=[0, 1]) for r in b.to_pylist()
    ]
    small = list(example_batches(range(30), lists, cfg, phase, SEED, vocab, passes=[0, 1], block_rows=7))
    assert len(small) > 2 and [r for b in small for r in b.to_pylist()] == reference
    # The stage reads documents as FlatDocument views of its token shards.
    flat = FlatDocs(docs[:30])
    assert [
        r for b in example_batches(range(30), flat, cfg, phase, SEED, vocab, passes=[0, 1]) for r in b.to_pylist()
    ] == reference


class FlatDocs:
    """RandomDocs returning FlatDocument views, as the stage's TokenStore does."""

    def __init__(self, docs):
        self.docs = [
            FlatDocument(
                np.asarray([t for s in d for t in s], dtype=np.uint16),
                np.concatenate([[0], np.cumsum([len(s) for s in d])]),
            )
            for d in docs
        ]

    @property
    def num_documents(self):
        return len(self.docs)

    def get(self, index):
        return self.docs[index]


def test_sop_examples_on_wikipedia(wiki):
    cfg = ExamplesConfig(objective="sop", max_seq_length=128)
    records = shard(wiki, cfg, [0])
    labels = Counter(r["next_sentence_label"] for r in records)
    assert set(labels) == {0, 1}
    assert abs(labels[1] / len(records) - 0.5) < 0.03


@pytest.mark.parametrize("doc_sentences", [False, True])
def test_roberta_examples_pack_sentences_without_nsp(wiki, doc_sentences):
    docs, vocab = wiki
    cfg = ExamplesConfig(objective="roberta", max_seq_length=128, doc_sentences=doc_sentences, masking="static")
    stats = ExampleStats()
    records = shard(wiki, cfg, [0], stats=stats)
    sp = vocab.special
    assert all(r["next_sentence_label"] == -1 and r["segment_b_start"] == r["length"] <= 128 for r in records)
    assert all(r["input_ids"][0] == sp.cls and r["input_ids"][-1] == sp.sep for r in records)
    inner_seps = sum(r["input_ids"][1:-1].count(sp.sep) for r in records)
    if doc_sentences:
        assert inner_seps == 0
    else:
        assert 0 < inner_seps < len(docs)
        assert stats.to_dict()["shares"]["mean_length"] > 95  # packed up to 126 with whole ~45-token sentences
    total = sum(len(s) for d in docs for s in d)
    assert stats.tokens - 2 * stats.examples - inner_seps == total, "every token is used once"
    dynamic = shard(wiki, cfg.model_copy(update={"masking": "dynamic"}), [0])
    assert all(r["masked_positions"] == [] == r["masked_ids"] for r in dynamic)


def test_roberta_vocabulary_lays_out_its_own_special_tokens():
    # a byte-level BPE vocabulary: <s> A </s></s> B </s> for pairs, <s> ... </s> packed
    tokens = [
        "<s>",
        "<pad>",
        "</s>",
        "<unk>",
        "<mask>",
        *(f"\u0120w{i}" for i in range(40)),
        *(f"p{i}" for i in range(20)),
    ]
    vocab = VocabTables.from_tokens(tokens)
    rng = np.random.default_rng(0)
    docs = [
        [rng.integers(5, len(tokens), rng.integers(3, 20)).tolist() for _ in range(rng.integers(2, 8))]
        for _ in range(40)
    ]
    pairs = list(
        examples_for_shard(
            range(40),
            InMemoryDocs(docs),
            ExamplesConfig(max_seq_length=32, masking="dynamic"),
            ExamplesConfig(max_seq_length=32).phases[0],
            SEED,
            vocab,
            None,
            [0],
        )
    )
    assert pairs and all(r["length"] <= 32 for r in pairs)
    for r in pairs:
        ids, b = r["input_ids"], r["segment_b_start"]
        assert ids[0] == 0 and ids[b - 2 : b] == [2, 2] and ids[-1] == 2 and 0 not in ids[1:] and ids.count(2) == 3
        a, b_tokens = ids[1 : b - 2], ids[b:-1]
        assert a and b_tokens and min(a + b_tokens) >= 5  # A and B both hold document tokens, no special among them
    longest = max(r["length"] for r in pairs)
    assert longest == 32  # the four specials fit beside A and B: max_num_tokens is 32 - 4
    packed = list(
        examples_for_shard(
            range(40),
            InMemoryDocs(docs),
            ExamplesConfig(objective="roberta", max_seq_length=32),
            ExamplesConfig(objective="roberta", max_seq_length=32).phases[0],
            SEED,
            vocab,
            None,
            [0],
        )
    )
    assert all(
        r["input_ids"][0] == 0 and r["input_ids"][-1] == 2 and r["segment_b_start"] == r["length"] for r in packed
    )
    static = ExamplesConfig(objective="roberta", max_seq_length=32, masking="static", whole_word_mask=True)
    masked = list(examples_for_shard(range(40), InMemoryDocs(docs), static, static.phases[0], SEED, vocab, None, [0]))
    assert any(4 in r["input_ids"] for r in masked) and not any(
        2 in r["masked_ids"] or 0 in r["masked_ids"] for r in masked
    )


def test_records_round_trip_through_an_arrow_shard(wiki, tmp_path):
    docs, vocab = wiki
    cfg = ExamplesConfig(max_seq_length=128)
    records = list(examples_for_shard(range(10), InMemoryDocs(docs), cfg, cfg.phases[0], SEED, vocab, passes=[0]))
    table = records_to_table(records, vocab.vocab_size)
    assert table.schema.field("input_ids").type == pa.list_(pa.uint16())
    assert table.schema.field("next_sentence_label").type == pa.int8()
    path = tmp_path / "part-00000.arrow"
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    back = ipc.open_file(pa.memory_map(str(path))).read_all()
    assert back.to_pylist() == records
    assert arrow_schema(70_000).field("input_ids").type == pa.list_(pa.int32())
    assert arrow_schema(70_000).field("masked_ids").type == pa.list_(pa.int32())
    with pytest.raises(pa.ArrowInvalid):
        records_to_table([dict(records[0], input_ids=[70_000])], vocab.vocab_size)


def test_stats_merge_across_workers_and_round_trip(wiki):
    docs, vocab = wiki
    cfg = ExamplesConfig(max_seq_length=128)
    corpus, phase = InMemoryDocs(docs), cfg.phases[0]
    whole, a, b = ExampleStats(), ExampleStats(), ExampleStats()
    list(examples_for_shard(range(30), corpus, cfg, phase, SEED, vocab, whole, passes=[0]))
    list(examples_for_shard(range(12), corpus, cfg, phase, SEED, vocab, a, passes=[0]))
    list(examples_for_shard(range(12, 30), corpus, cfg, phase, SEED, vocab, b, passes=[0]))
    assert a.merge(b).to_dict() == whole.to_dict()
    assert ExampleStats.from_dict(whole.to_dict()).to_dict() == whole.to_dict()


# ---------------------------------------------------------------- config


def error_locs(**kw) -> list[tuple]:
    with pytest.raises(ValidationError) as info:
        ExamplesConfig(**kw)
    return [e["loc"] for e in info.value.errors()]


def test_config_defaults_follow_the_objective_and_round_trip():
    bert = ExamplesConfig()
    assert [(p.name, p.max_seq_length, p.max_predictions_per_seq) for p in bert.phases] == [
        ("seq128", 128, 20),
        ("seq512", 512, 80),
    ]
    assert bert.max_seq_length == 512 and bert.short_seq_prob == 0.1 and bert.masking == "static"
    roberta = ExamplesConfig(objective="roberta")
    assert (roberta.short_seq_prob, roberta.masking, roberta.dupe_factor) == (0.0, "dynamic", 1)
    one = ExamplesConfig(max_seq_length=256)
    assert [(p.name, p.max_seq_length, p.max_predictions_per_seq) for p in one.phases] == [("seq256", 256, 39)]
    for cfg in (bert, roberta, one):
        assert ExamplesConfig.model_validate(cfg.model_dump()) == cfg
    assert bert.length_bin(100) == 128 and bert.length_bin(128) == 128 and bert.length_bin(5) == 32


def test_config_errors_name_the_key():
    assert error_locs(doc_sentences=True) == [("doc_sentences",)]
    assert error_locs(max_seq_length=1024) == [("length_bins",)]
    assert error_locs(
        max_seq_length=256, phases=[{"name": "a", "max_seq_length": 128, "max_predictions_per_seq": 20}]
    ) == [("phases",)]
    assert error_locs(
        max_predictions_per_seq=30, phases=[{"name": "a", "max_seq_length": 128, "max_predictions_per_seq": 20}]
    ) == [("phases",)]
    assert error_locs(phases=[{"name": "../x", "max_seq_length": 128, "max_predictions_per_seq": 20}]) == [
        ("phases", 0, "name")
    ]
    assert error_locs(max_seq_length=4) == [("phases",)]
    assert error_locs(masking="sometimes") == [("masking",)]
    assert error_locs(objective="electra") == [("objective",)]
    assert error_locs(dupe_factr=3) == [("dupe_factr",)]


# ---------------------------------------------------------------- bad input


def test_bad_input_documents(wiki):
    _, vocab = wiki
    cfg = ExamplesConfig(max_seq_length=32)
    phase = cfg.phases[0]
    assert list(examples_for_shard([], InMemoryDocs([]), cfg, phase, SEED, vocab)) == []
    one_sentence = [[[20 + i, 30 + i, 40 + i]] for i in range(8)]
    records = list(examples_for_shard(range(8), InMemoryDocs(one_sentence), cfg, phase, SEED, vocab, passes=[0]))
    assert len(records) == 8 and all(r["next_sentence_label"] == 1 for r in records)
    long = [[list(range(100, 400))], [[50, 51], [52]], [[], []]]
    stats = ExampleStats()
    records = list(examples_for_shard(range(3), InMemoryDocs(long), cfg, phase, SEED, vocab, stats, passes=[0]))
    assert records and all(r["length"] <= 32 for r in records)
    assert stats.truncated >= 1 and stats.document_passes == 2  # the empty document yields nothing
