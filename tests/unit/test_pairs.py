"""Pair building (NSP/SOP) and sentence packing: the rules of Google's
create_pretraining_data and of RoBERTa, checked as properties on generated documents."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertcore.examples.pairs import (
    FlatDocument,
    InMemoryDocs,
    PairConfig,
    build_pairs,
    pack_sentences,
    random_next_shards,
    trim_counts,
    truncate_seq_pair,
)

SEP = -1  # any id no document uses


def numbered_corpus(shape: list[list[int]]) -> list[list[list[int]]]:
    """Documents whose tokens are their global positions, so every token says where it came from."""
    counter = iter(range(10**9))
    return [[[next(counter) for _ in range(n)] for n in doc] for doc in shape]


def flat(doc):
    return [t for segment in doc for t in segment]


# ---------------------------------------------------------------- truncate_seq_pair


@settings(max_examples=300, deadline=None)
@given(
    a=st.lists(st.integers(0, 50), max_size=40),
    b=st.lists(st.integers(0, 50), max_size=40),
    max_num_tokens=st.integers(0, 60),
    seed=st.integers(0, 2**32),
)
def test_truncate_seq_pair_only_trims_the_longer_side_to_fit(a, b, max_num_tokens, seed):
    a_in, b_in = list(a), list(b)
    a2, b2 = truncate_seq_pair(a, b, max_num_tokens, random.Random(seed))
    assert (a, b) == (a_in, b_in), "inputs must not be modified"
    # Fits, and removes no more than needed.
    assert len(a2) + len(b2) == min(len(a) + len(b), max_num_tokens)
    # Only trims: each side is a contiguous piece of the original.
    assert any(a[i : i + len(a2)] == a2 for i in range(len(a) - len(a2) + 1))
    assert any(b[i : i + len(b2)] == b2 for i in range(len(b) - len(b2) + 1))
    # The longer side is trimmed (B on a tie), so trimmed sides end up balanced.
    if len(a2) < len(a):
        assert len(a2) >= len(b2)
    if len(b2) < len(b):
        assert len(b2) >= len(a2) - 1
    # Never empties a side while the other could still give tokens.
    if a and b and max_num_tokens >= 2:
        assert a2 and b2


def test_truncate_seq_pair_trims_front_and_back_equally_often():
    starts = []
    for seed in range(400):
        a2, _ = truncate_seq_pair(list(range(100)), [], 50, random.Random(seed))
        starts.append(a2[0])
    # 50 trims, each from the front with p=0.5: the kept window starts at 25 on average.
    mean = sum(starts) / len(starts)
    assert 23 < mean < 27
    assert min(starts) > 0 and max(starts) < 50  # neither always-front nor always-back


def test_truncate_seq_pair_is_seeded():
    a, b = list(range(30)), list(range(100, 140))
    assert truncate_seq_pair(a, b, 20, random.Random(7)) == truncate_seq_pair(a, b, 20, random.Random(7))


# ---------------------------------------------------------------- build_pairs (bert)

doc_shapes = st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=12), min_size=2, max_size=6)


@settings(max_examples=150, deadline=None)
@given(shape=doc_shapes, seed=st.integers(0, 2**32))
def test_walk_uses_every_segment_once_and_rewinds_after_random_b(shape, seed):
    # Large max_seq_length and always-short targets: chunks end at random targets and no
    # pair is ever truncated, so the document can be reassembled from the pairs.
    docs = numbered_corpus(shape)
    cfg = PairConfig(max_seq_length=200, short_seq_prob=1.0)
    for index, doc in enumerate(docs):
        pairs = build_pairs(doc, random.Random(seed), cfg, InMemoryDocs(docs), index)
        assert not any(p.truncated for p in pairs)
        walked = []
        own = set(flat(doc))
        for p in pairs:
            assert p.tokens_a and p.tokens_b
            assert set(p.tokens_a) <= own
            walked += p.tokens_a
            if p.is_random_next:
                # B comes from another document; the chunk's rest was put back.
                assert not set(p.tokens_b) & own
            else:
                assert p.tokens_b[0] == p.tokens_a[-1] + 1, "B must continue A"
                walked += p.tokens_b
        assert walked == flat(doc)


@settings(max_examples=100, deadline=None)
@given(shape=doc_shapes, seed=st.integers(0, 2**32), max_seq_length=st.integers(5, 40))
def test_pairs_fit_and_segments_are_whole_unless_truncated(shape, seed, max_seq_length):
    docs = numbered_corpus(shape)
    cfg = PairConfig(max_seq_length=max_seq_length)
    starts = {s[0] for d in docs for s in d}
    ends = {s[-1] for d in docs for s in d}
    for index, doc in enumerate(docs):
        for p in build_pairs(doc, random.Random(seed), cfg, InMemoryDocs(docs), index):
            assert len(p.tokens_a) + len(p.tokens_b) <= max_seq_length - 3
            if p.truncated:
                # Truncation removes the excess and no more, never a whole side.
                assert len(p.tokens_a) + len(p.tokens_b) == max_seq_length - 3
                assert p.tokens_a and p.tokens_b
            assert p.tokens_a == list(range(p.tokens_a[0], p.tokens_a[-1] + 1)), "A is contiguous text"
            if not p.truncated:
                assert p.tokens_a[0] in starts and p.tokens_a[-1] in ends
                assert p.tokens_b[0] in starts


def test_random_b_rate_matches_the_algorithm_and_avoids_the_document():
    rng = random.Random(0)
    docs = numbered_corpus([[rng.randint(3, 30) for _ in range(rng.randint(1, 20))] for _ in range(60)])
    cfg = PairConfig(max_seq_length=64)
    labels, singles, sources = [], 0, Counter()
    owner = {t: i for i, d in enumerate(docs) for t in flat(d)}
    for seed in range(20):
        for index, doc in enumerate(docs):
            for p in build_pairs(doc, random.Random(seed * 1000 + index), cfg, InMemoryDocs(docs), index):
                labels.append(p.is_random_next)
                singles += p.single_segment_chunk
                if p.single_segment_chunk:
                    assert p.is_random_next
                if p.is_random_next:
                    source = owner[p.tokens_b[0]]
                    assert source != index
                    sources[source] += 1
    s = singles / len(labels)
    assert abs(sum(labels) / len(labels) - (s + 0.5 * (1 - s))) < 0.02
    assert len(sources) == len(docs), "every other document is a possible source of B"


def test_random_next_shards_are_the_own_shard_and_a_keyed_sample_of_the_others():
    for own in (0, 7, 19):
        drawn = [random_next_shards(own, 20, 4, random.Random(key)) for key in range(1000)]
        for picked in drawn:
            assert own in picked and len(picked) == 5 and picked == sorted(set(picked)) and picked[0] >= 0
            assert picked[-1] < 20
        others = Counter(s for picked in drawn for s in picked if s != own)
        assert len(others) == 19 and max(others.values()) < 1.35 * min(others.values())  # each other shard alike
    assert random_next_shards(7, 20, 4, random.Random(5)) == random_next_shards(7, 20, 4, random.Random(5))
    assert (
        random_next_shards(2, 5, 4, random.Random(0)) == random_next_shards(2, 5, 9, random.Random(1)) == list(range(5))
    )
    assert random_next_shards(3, 8, 0, random.Random(0)) == [3]
    with pytest.raises(ValueError, match="shard 8 is not among 8 shards"):
        random_next_shards(8, 8, 2, random.Random(0))


def test_random_b_from_a_sample_of_shards_keeps_the_rate_and_the_other_document_rule():
    """Google draws a random B among the documents its one process reads: here a shard's
    own documents and those of 3 of the 11 other shards. The share of random-next pairs is
    still what the algorithm implies, B never comes from the current document, and only
    from the shards drawn."""
    rng = random.Random(1)
    corpus = numbered_corpus([[rng.randint(3, 30) for _ in range(rng.randint(1, 12))] for _ in range(12 * 15)])
    shards = [corpus[k * 15 : (k + 1) * 15] for k in range(12)]
    owner = {t: (k, i) for k, docs in enumerate(shards) for i, d in enumerate(docs) for t in flat(d)}
    cfg = PairConfig(max_seq_length=64)
    labels, singles = [], 0
    for own in range(12):
        picked = random_next_shards(own, 12, 3, random.Random(own))
        near = [(k, i) for k in picked for i in range(len(shards[k]))]
        docs = InMemoryDocs([shards[k][i] for k, i in near])
        for seed in range(4):
            for index, (k, i) in enumerate(near):
                if k != own:
                    continue
                for p in build_pairs(shards[k][i], random.Random(seed * 1000 + index), cfg, docs, index):
                    labels.append(p.is_random_next)
                    singles += p.single_segment_chunk
                    if p.is_random_next:
                        source = owner[p.tokens_b[0]]
                        assert source != (k, i) and source[0] in picked
    s = singles / len(labels)
    assert len(labels) > 2000 and abs(sum(labels) / len(labels) - (s + 0.5 * (1 - s))) < 0.025


def test_one_sentence_documents_always_get_a_random_b():
    docs = numbered_corpus([[7], [4], [9], [5]])
    for index, doc in enumerate(docs):
        (pair,) = build_pairs(doc, random.Random(index), PairConfig(max_seq_length=32), InMemoryDocs(docs), index)
        assert pair.single_segment_chunk and pair.is_random_next
        assert pair.tokens_a == doc[0]
        assert not set(pair.tokens_b) & set(doc[0])


def test_one_document_corpus_takes_b_from_itself_and_says_so():
    docs = numbered_corpus([[5, 5, 5]])
    pairs = build_pairs(docs[0], random.Random(3), PairConfig(max_seq_length=8), InMemoryDocs(docs), 0)
    random_pairs = [p for p in pairs if p.is_random_next]
    assert random_pairs and all(p.same_document_negative for p in random_pairs)


def test_sentence_longer_than_the_sequence_is_truncated_to_fit():
    docs = numbered_corpus([[500], [3, 4], [2]])
    pairs = build_pairs(docs[0], random.Random(1), PairConfig(max_seq_length=32), InMemoryDocs(docs), 0)
    assert len(pairs) == 1
    (p,) = pairs
    assert p.truncated and len(p.tokens_a) + len(p.tokens_b) == 29
    assert p.tokens_a and p.tokens_b


def test_empty_documents_and_empty_segments_yield_nothing():
    docs = [[], [[], []], [[1, 2, 3]]]
    cfg = PairConfig(max_seq_length=16)
    assert build_pairs(docs[0], random.Random(0), cfg, InMemoryDocs(docs), 0) == []
    assert build_pairs(docs[1], random.Random(0), cfg, InMemoryDocs(docs), 1) == []
    # Empty documents are never the source of a random B.
    (pair,) = build_pairs(docs[2], random.Random(0), cfg, InMemoryDocs(docs), 2)
    assert pair.same_document_negative and pair.tokens_b


def test_short_targets_follow_short_seq_prob():
    docs = numbered_corpus([[10] * 20 for _ in range(5)])
    short = [
        build_pairs(
            docs[i % 5], random.Random(i), PairConfig(max_seq_length=128, short_seq_prob=0.1), InMemoryDocs(docs), i % 5
        )[0].target_was_short
        for i in range(3000)
    ]
    assert abs(sum(short) / len(short) - 0.1) < 0.02


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="max_seq_length"):
        PairConfig(max_seq_length=4)
    with pytest.raises(ValueError, match="doc_sentences"):
        PairConfig(max_seq_length=64, doc_sentences=True)
    with pytest.raises(ValueError, match="pack_sentences"):
        build_pairs([[1]], random.Random(0), PairConfig(max_seq_length=64, objective="roberta"), InMemoryDocs([[[1]]]))


# ---------------------------------------------------------------- sop


@settings(max_examples=100, deadline=None)
@given(shape=doc_shapes, seed=st.integers(0, 2**32))
def test_sop_pairs_are_consecutive_text_of_the_same_document(shape, seed):
    docs = numbered_corpus(shape)
    cfg = PairConfig(max_seq_length=200, short_seq_prob=1.0, objective="sop")
    for index, doc in enumerate(docs):
        own = set(flat(doc))
        pairs = build_pairs(doc, random.Random(seed), cfg, InMemoryDocs(docs), index)
        walked = []
        for p in pairs:
            assert set(p.tokens_a) | set(p.tokens_b) <= own
            first, second = (p.tokens_b, p.tokens_a) if p.is_random_next else (p.tokens_a, p.tokens_b)
            assert second[0] == first[-1] + 1, "label 0 = in order, 1 = swapped"
            walked += first + second
        # Nothing is put back in sop; only a one-token chunk cannot be split into a pair.
        skipped = [s for s in doc if len(s) == 1]
        assert len(walked) >= len(flat(doc)) - len(skipped)


def test_sop_labels_are_balanced():
    docs = numbered_corpus([[8] * 30 for _ in range(10)])
    labels = [
        p.is_random_next
        for i in range(400)
        for p in build_pairs(
            docs[i % 10], random.Random(i), PairConfig(max_seq_length=64, objective="sop"), InMemoryDocs(docs), i % 10
        )
    ]
    assert abs(sum(labels) / len(labels) - 0.5) < 0.03


# ---------------------------------------------------------------- roberta packing


@settings(max_examples=150, deadline=None)
@given(shape=st.lists(st.lists(st.integers(1, 20), max_size=8), max_size=6), max_seq_length=st.integers(3, 40))
def test_full_sentences_pack_everything_in_order_with_sep_between_documents(shape, max_seq_length):
    docs = numbered_corpus(shape)
    cfg = PairConfig(max_seq_length=max_seq_length, short_seq_prob=0.0, objective="roberta")
    sequences = list(pack_sentences(docs, random.Random(0), cfg, SEP))
    assert all(1 <= len(s) <= max_seq_length - 2 for s in sequences)
    assert [t for s in sequences for t in s if t != SEP] == [t for d in docs for t in flat(d)]
    owner = {t: i for i, d in enumerate(docs) for t in flat(d)}
    starts = {s[0] for d in docs for s in d}
    for s in sequences:
        assert s[0] != SEP and s[-1] != SEP
        for i in range(1, len(s)):
            if s[i] == SEP:
                assert owner[s[i - 1]] != owner[s[i + 1]], "[SEP] only between documents"
            elif s[i - 1] != SEP:
                assert owner[s[i - 1]] == owner[s[i]], "documents are separated by [SEP]"
    # A sequence starts at a sentence start unless a sentence was longer than the limit.
    cut = {t for d in docs for seg in d if len(seg) > max_seq_length - 2 for t in seg}
    assert all(s[0] in starts or s[0] in cut for s in sequences)
    # Greedy filling: the next sequence's first sentence would not have fit.
    for s, nxt in zip(sequences, sequences[1:]):
        first = next((seg for d in docs for seg in d if seg[0] == nxt[0]), None)
        if first is not None and nxt[0] not in cut:
            extra = 1 if owner[s[-1]] != owner[nxt[0]] else 0
            assert len(s) + extra + len(first) > max_seq_length - 2


def test_doc_sentences_never_cross_a_document():
    docs = numbered_corpus([[3, 4, 5], [6], [2, 2, 2, 2, 2, 2]])
    cfg = PairConfig(max_seq_length=12, short_seq_prob=0.0, objective="roberta", doc_sentences=True)
    sequences = list(pack_sentences(docs, random.Random(0), cfg, SEP))
    owner = {t: i for i, d in enumerate(docs) for t in flat(d)}
    assert all(SEP not in s and len({owner[t] for t in s}) == 1 for s in sequences)
    assert [t for s in sequences for t in s] == [t for d in docs for t in flat(d)]
    # doc 0: 3+4 fit in 10, 5 does not; doc 1 alone; doc 2: 5 sentences of 2 then 1.
    assert [len(s) for s in sequences] == [7, 5, 6, 10, 2]


def test_packing_with_short_targets_makes_some_shorter_sequences():
    docs = numbered_corpus([[5] * 400])
    cfg = PairConfig(max_seq_length=102, short_seq_prob=0.5, objective="roberta")
    lengths = [len(s) for s in pack_sentences(docs, random.Random(0), cfg, SEP)]
    assert sum(n <= 50 for n in lengths) > 0.15 * len(lengths)
    assert max(lengths) == 100


def test_random_b_can_come_from_a_callable():
    other = [[900, 901, 902], [903, 904]]
    doc = [[1, 2, 3]]
    (pair,) = build_pairs(doc, random.Random(0), PairConfig(max_seq_length=16), lambda rng: other)
    assert pair.is_random_next and set(pair.tokens_b) <= {900, 901, 902, 903, 904}
    with pytest.raises(ValueError, match="empty document"):
        build_pairs(doc, random.Random(0), PairConfig(max_seq_length=16), lambda rng: [[]])


@settings(max_examples=300, deadline=None)
@given(len_a=st.integers(1, 80), len_b=st.integers(1, 80), max_num_tokens=st.integers(2, 120))
def test_trim_counts_match_googles_step_by_step_loop(len_a, len_b, max_num_tokens):
    a, b = len_a, len_b
    while a + b > max_num_tokens:
        if a > b:
            a -= 1
        else:
            b -= 1
    assert trim_counts(len_a, len_b, max_num_tokens) == (len_a - a, len_b - b)


def as_flat(doc):
    return FlatDocument(
        np.asarray(flat(doc), dtype=np.int64), np.concatenate([[0], np.cumsum([len(s) for s in doc])]).astype(np.int64)
    )


@settings(max_examples=100, deadline=None)
@given(
    shape=st.lists(st.lists(st.integers(0, 5), max_size=12), min_size=2, max_size=6),
    seed=st.integers(0, 2**32),
    max_seq_length=st.integers(5, 60),
    objective=st.sampled_from(["bert", "sop"]),
)
def test_flat_documents_give_the_same_pairs_as_lists(shape, seed, max_seq_length, objective):
    # Empty segments (length 0) included: both forms drop them the same way.
    docs = numbered_corpus(shape)
    flat_docs = [as_flat(d) for d in docs]

    class Flat:
        num_documents = len(docs)

        def get(self, index):
            return flat_docs[index]

    cfg = PairConfig(max_seq_length=max_seq_length, objective=objective)
    for index, doc in enumerate(docs):
        expected = build_pairs(doc, random.Random(seed), cfg, InMemoryDocs(docs), index)
        assert build_pairs(flat_docs[index], random.Random(seed), cfg, Flat(), index) == expected


def test_flat_document_reads_like_a_list_of_segments():
    doc = [[1, 2], [], [3], [4, 5, 6]]
    view = as_flat(doc)
    assert len(view) == 4 and list(view) == doc and view[-1] == [4, 5, 6] and list(view[1:3]) == [[], [3]]
    assert list(view.nonempty()) == [[1, 2], [3], [4, 5, 6]]
    assert view.nonempty().flat() == ([1, 2, 3, 4, 5, 6], [0, 2, 3, 6])
    with pytest.raises(IndexError):
        view[4]
