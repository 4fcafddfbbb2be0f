"""Masked-LM rules: Google's quota, whole words, 80/10/10, specials; static (`mask_tokens`)
and dynamic (`mask_batch`) agree."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertcore.examples.masking import (
    KEPT,
    MASKED,
    RANDOM,
    MaskConfig,
    MaskDraws,
    VocabTables,
    greedy_words,
    mask_batch,
    mask_sequences,
    mask_tokens,
    num_to_predict,
)

torch.set_num_threads(1)

WORDS = [f"w{i}" for i in range(40)]
PIECES = [f"##p{i}" for i in range(20)]
TOKENS = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *PIECES]
VOCAB = VocabTables.from_tokens(TOKENS)
PAD, UNK, CLS, SEP, MASK = (TOKENS.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"))
WORD_IDS = [TOKENS.index(w) for w in WORDS]
PIECE_IDS = [TOKENS.index(p) for p in PIECES]
SPECIAL = {PAD, CLS, SEP, MASK}


def cfg(**kw) -> MaskConfig:
    return MaskConfig(vocab=VOCAB, **kw)


def words_of(tokens):
    """Whole words as lists of positions (a `##` piece continues the word before it)."""
    words = []
    for i, t in enumerate(tokens):
        if t in SPECIAL:
            continue
        if VOCAB.is_continuation[t] and words and words[-1][-1] == i - 1:
            words[-1].append(i)
        else:
            words.append([i])
    return words


@st.composite
def sequences(draw, max_segment=60):
    """[CLS] A [SEP] B [SEP] with words of 1-4 pieces (and the odd [UNK])."""

    def segment():
        out = []
        for _ in range(draw(st.integers(1, max_segment // 3))):
            out.append(draw(st.sampled_from(WORD_IDS + [UNK])))
            out += draw(st.lists(st.sampled_from(PIECE_IDS), max_size=3))
        return out

    return [CLS, *segment(), SEP, *segment(), SEP]


def continuation(tokens):
    return VOCAB.is_continuation[np.asarray(tokens)].tolist()


def check_masked_example(tokens, example, config):
    positions = example.masked_positions
    assert positions == sorted(set(positions))
    assert len(example.input_ids) == len(tokens)
    assert example.masked_ids == [tokens[p] for p in positions]
    assert not {tokens[p] for p in positions} & SPECIAL, "specials are never masked"
    changed = {i for i, (x, y) in enumerate(zip(tokens, example.input_ids)) if x != y}
    assert changed <= set(positions)
    replacements = set(VOCAB.replacement_ids.tolist())
    for p, kind in zip(positions, example.kinds):
        if kind == MASKED:
            assert example.input_ids[p] == MASK
        elif kind == KEPT:
            assert example.input_ids[p] == tokens[p]
        else:
            assert example.input_ids[p] in replacements
    quota = num_to_predict(len(tokens), config)
    if config.whole_word_mask or config.span:
        assert len(positions) <= quota
        chosen = set(positions)
        for word in words_of(tokens):
            assert set(word) <= chosen or not set(word) & chosen, "whole words only"
    else:
        assert len(positions) == quota


def test_quota_formula_counts_specials_and_rounds_half_to_even():
    c = cfg(masked_lm_prob=0.15, max_predictions_per_seq=20)
    assert num_to_predict(3, c) == 1  # max(1, round(0.45))
    assert num_to_predict(10, c) == 2  # round(1.5) -> 2
    assert num_to_predict(30, c) == 4  # round(4.5) -> 4 (half to even, as Python and Google)
    assert num_to_predict(50, c) == 8  # round(7.5) -> 8
    assert num_to_predict(128, c) == 19
    assert num_to_predict(512, c) == 20  # capped


@settings(max_examples=200, deadline=None)
@given(
    tokens=sequences(),
    seed=st.integers(0, 2**32),
    wwm=st.booleans(),
    span=st.booleans(),
    prob=st.sampled_from([0.15, 0.3, 0.5]),
    max_pred=st.integers(1, 40),
)
def test_mask_tokens_invariants(tokens, seed, wwm, span, prob, max_pred):
    config = cfg(masked_lm_prob=prob, max_predictions_per_seq=max_pred, whole_word_mask=wwm, span=span)
    example = mask_tokens(tokens, continuation(tokens), random.Random(seed), config)
    check_masked_example(tokens, example, config)


def test_whole_word_masking_fills_the_quota_with_words_that_fit():
    # Words of 3 pieces and one single-piece word: with quota 2 only the short word fits
    # (a whole word that would overflow is skipped, the walk goes on).
    tokens = [CLS] + [WORD_IDS[0], PIECE_IDS[0], PIECE_IDS[1]] * 4 + [WORD_IDS[1]] + [SEP, WORD_IDS[2], SEP]
    config = cfg(masked_lm_prob=0.1, max_predictions_per_seq=1, whole_word_mask=True)
    for seed in range(50):
        example = mask_tokens(tokens, continuation(tokens), random.Random(seed), config)
        assert example.masked_ids in ([WORD_IDS[1]], [WORD_IDS[2]])


def test_replacement_kinds_are_80_10_10_and_never_special():
    rng = random.Random(0)
    config = cfg(masked_lm_prob=0.15, max_predictions_per_seq=80)
    kinds, random_ids = Counter(), Counter()
    for _ in range(400):
        tokens = (
            [CLS]
            + [rng.choice(WORD_IDS) for _ in range(250)]
            + [SEP]
            + [rng.choice(WORD_IDS) for _ in range(250)]
            + [SEP]
        )
        example = mask_tokens(tokens, continuation(tokens), rng, config)
        kinds.update(example.kinds)
        random_ids.update(example.input_ids[p] for p, k in zip(example.masked_positions, example.kinds) if k == RANDOM)
    total = sum(kinds.values())
    assert total >= 30_000
    assert abs(kinds[MASKED] / total - 0.8) < 0.01
    assert abs(kinds[KEPT] / total - 0.1) < 0.01
    assert abs(kinds[RANDOM] / total - 0.1) < 0.01
    unused = {TOKENS.index("[unused0]"), TOKENS.index("[unused1]")}
    assert not set(random_ids) & (SPECIAL | unused | {UNK})
    assert len(random_ids) == len(VOCAB.replacement_ids), "every ordinary token can be drawn"


def test_span_lengths_follow_the_truncated_geometric():
    config = cfg(span=True)
    rng = random.Random(0)
    draws = [config.draw_span_words(rng) for _ in range(40_000)]
    assert min(draws) == 1 and max(draws) == 10
    assert abs(sum(draws) / len(draws) - 3.8) < 0.05  # SpanBERT's mean
    assert abs(draws.count(1) / len(draws) - 0.2 / (1 - 0.8**10)) < 0.01


def test_span_masking_makes_contiguous_runs_with_one_kind_per_span():
    rng = random.Random(1)
    config = cfg(span=True, masked_lm_prob=0.15, max_predictions_per_seq=76)
    runs = []
    for _ in range(200):
        tokens = [CLS] + [rng.choice(WORD_IDS) for _ in range(508)] + [SEP, rng.choice(WORD_IDS), SEP]
        example = mask_tokens(tokens, continuation(tokens), rng, config)
        check_masked_example(tokens, example, config)
        assert len(example.masked_positions) == 76
        p = example.masked_positions
        runs.append(1 + sum(1 for x, y in zip(p, p[1:]) if y != x + 1))
    # 76 tokens in spans of mean 3.8 words: about 20 runs (fewer where spans touch), far
    # fewer than the 76 runs of token-level masking.
    assert 14 < sum(runs) / len(runs) < 22


def _walk(lengths: list[int], quota: int) -> list[bool]:
    """Google's loop, one word at a time."""
    taken, room = [], quota
    for length in lengths:
        taken.append(length <= room)
        room -= length if taken[-1] else 0
    return taken


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 6), max_size=40), min_size=1, max_size=12),
    st.integers(1, 30),
    st.integers(0, 2**31),
)
def test_greedy_words_takes_what_googles_walk_takes(rows, quota, seed):
    rng = np.random.default_rng(seed)
    W = max(1, max(map(len, rows)))
    lengths = np.full((len(rows), W), 99, dtype=np.int64)  # past a row's words: anything
    for b, row in enumerate(rows):
        lengths[b, : len(row)] = row
    quotas = rng.integers(1, quota + 1, len(rows))
    take = greedy_words(lengths, np.array([len(r) for r in rows]), quotas)
    for b, row in enumerate(rows):
        assert take[b, : len(row)].tolist() == _walk(row, int(quotas[b])) and not take[b, len(row) :].any()


def test_invalid_mask_config_is_refused():
    with pytest.raises(ValueError, match="masked_lm_prob"):
        cfg(masked_lm_prob=0.0)
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        VocabTables.from_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])


# ---------------------------------------------------------------- mask_batch


def pad_batch(rows):
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), PAD, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
    special = torch.isin(ids, torch.tensor(sorted(SPECIAL)))
    cont = torch.from_numpy(VOCAB.is_continuation)[ids] & ~special
    return ids, special, cont


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(sequences(), min_size=1, max_size=6),
    seed=st.integers(0, 2**62),
    wwm=st.booleans(),
    span=st.booleans(),
    max_pred=st.integers(1, 30),
)
def test_mask_batch_follows_the_same_rules_per_row(rows, seed, wwm, span, max_pred):
    config = cfg(max_predictions_per_seq=max_pred, whole_word_mask=wwm, span=span)
    ids, special, cont = pad_batch(rows)
    out, labels = mask_batch(ids, special, cont, torch.Generator().manual_seed(seed), config)
    for b, row in enumerate(rows):
        n = len(row)
        positions = torch.nonzero(labels[b] != -100).flatten().tolist()
        assert all(p < n for p in positions), "padding is never masked"
        assert (out[b, n:] == PAD).all()
        new = out[b, :n].tolist()
        kinds = [MASKED if new[p] == MASK else KEPT if new[p] == row[p] else RANDOM for p in positions]
        # A random replacement can equal the original; then it reads as KEPT, which is fine here.
        example = type("E", (), {})()
        example.input_ids, example.masked_positions, example.kinds = new, positions, kinds
        example.masked_ids = labels[b, positions].tolist()
        check_masked_example(row, example, config)


def test_mask_batch_is_reproducible_and_seed_dependent():
    rng = random.Random(5)
    rows = [[CLS] + [rng.choice(WORD_IDS + PIECE_IDS) for _ in range(100)] + [SEP] for _ in range(8)]
    ids, special, cont = pad_batch(rows)
    config = cfg(whole_word_mask=True)
    first = mask_batch(ids, special, cont, torch.Generator().manual_seed(1), config)
    again = mask_batch(ids, special, cont, torch.Generator().manual_seed(1), config)
    other = mask_batch(ids, special, cont, torch.Generator().manual_seed(2), config)
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not torch.equal(first[1], other[1])


def test_mask_batch_kinds_are_80_10_10():
    rng = random.Random(6)
    rows = [[CLS] + [rng.choice(WORD_IDS) for _ in range(254)] + [SEP] for _ in range(600)]
    ids, special, cont = pad_batch(rows)
    out, labels = mask_batch(ids, special, cont, torch.Generator().manual_seed(0), cfg(max_predictions_per_seq=40))
    selected = labels != -100
    total = int(selected.sum())
    assert total == 600 * 38  # round(256 * 0.15) = 38 per row
    masked = int((out[selected] == MASK).sum())
    kept = int((out[selected] == ids[selected]).sum())
    assert abs(masked / total - 0.8) < 0.01
    # Kept includes random draws that hit the original id (1 in 40 here).
    assert abs(kept / total - (0.1 + 0.1 / len(VOCAB.replacement_ids))) < 0.01


# Words of different lengths compete for a small quota: the per-position masking rate
# exposes any difference between two greedy whole-word walks.
COMPETING = [
    CLS,
    WORD_IDS[0],
    PIECE_IDS[0],
    PIECE_IDS[1],
    WORD_IDS[1],
    WORD_IDS[2],
    PIECE_IDS[2],
    SEP,
    WORD_IDS[3],
    PIECE_IDS[3],
    PIECE_IDS[4],
    PIECE_IDS[5],
    WORD_IDS[4],
    SEP,
]


def one_by_one_counts(tokens, config, n):
    """How often `mask_tokens` masks each position in n draws."""
    counts = np.zeros(len(tokens))
    rng = random.Random(0)
    for _ in range(n):
        for p in mask_tokens(tokens, continuation(tokens), rng, config).masked_positions:
            counts[p] += 1
    return counts


def test_static_and_dynamic_masking_pick_positions_with_the_same_probabilities():
    tokens = COMPETING
    config = cfg(masked_lm_prob=0.25, whole_word_mask=True)  # quota round(14 * 0.25) = 4 (half to even)
    n = 4000
    static = one_by_one_counts(tokens, config, n)
    ids, special, cont = pad_batch([tokens] * n)
    _, labels = mask_batch(ids, special, cont, torch.Generator().manual_seed(0), config)
    dynamic = (labels != -100).sum(0).numpy()
    assert np.abs(static / n - dynamic / n).max() < 0.04
    assert static[0] == static[7] == static[-1] == 0


# ---------------------------------------------------------------- mask_sequences (static, vectorised)


def mask_flat(rows, config, seed):
    ids = np.asarray([t for r in rows for t in r], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    draws = MaskDraws.draw(np.random.default_rng(seed), len(ids), VOCAB)
    return mask_sequences(ids, offsets, draws, config), offsets


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(sequences(), min_size=1, max_size=6),
    seed=st.integers(0, 2**62),
    wwm=st.booleans(),
    max_pred=st.integers(1, 30),
    prob=st.sampled_from([0.05, 0.15, 0.5]),
)
def test_mask_sequences_follows_the_same_rules_per_sequence(rows, seed, wwm, max_pred, prob):
    config = cfg(max_predictions_per_seq=max_pred, whole_word_mask=wwm, masked_lm_prob=prob)
    masked, offsets = mask_flat(rows, config, seed)
    assert len(masked.input_ids) == offsets[-1] and len(masked.counts) == len(rows)
    at = 0
    for b, row in enumerate(rows):
        n = int(masked.counts[b])
        example = type("E", (), {})()
        example.input_ids = masked.input_ids[offsets[b] : offsets[b + 1]].tolist()
        example.masked_positions = masked.positions[at : at + n].tolist()
        example.masked_ids = masked.masked_ids[at : at + n].tolist()
        example.kinds = masked.kinds[at : at + n].tolist()
        at += n
        check_masked_example(row, example, config)
        if wwm:
            # Greedy: once the walk is over, no unmasked whole word would still fit.
            room = num_to_predict(len(row), config) - n
            chosen = set(example.masked_positions)
            assert all(len(w) > room for w in words_of(row) if not set(w) & chosen)
    assert at == len(masked.positions)


def test_mask_sequences_kinds_are_80_10_10_and_seeded():
    rng = random.Random(6)
    rows = [[CLS] + [rng.choice(WORD_IDS) for _ in range(254)] + [SEP] for _ in range(600)]
    config = cfg(max_predictions_per_seq=40)
    masked, _ = mask_flat(rows, config, 0)
    assert masked.counts.tolist() == [38] * 600
    share = np.bincount(masked.kinds, minlength=3) / len(masked.kinds)
    assert abs(share[MASKED] - 0.8) < 0.01 and abs(share[KEPT] - 0.1) < 0.01 and abs(share[RANDOM] - 0.1) < 0.01
    again, _ = mask_flat(rows, config, 0)
    other, _ = mask_flat(rows, config, 1)
    assert np.array_equal(masked.input_ids, again.input_ids) and np.array_equal(masked.positions, again.positions)
    assert not np.array_equal(masked.positions, other.positions)


def test_mask_sequences_and_mask_tokens_pick_positions_with_the_same_probabilities():
    tokens = COMPETING
    for wwm in (False, True):
        config = cfg(masked_lm_prob=0.25, whole_word_mask=wwm)
        n = 4000
        one_by_one = one_by_one_counts(tokens, config, n)
        masked, _ = mask_flat([tokens] * n, config, 0)
        at_once = np.bincount(masked.positions, minlength=len(tokens))
        assert np.abs(one_by_one / n - at_once / n).max() < 0.04
        assert at_once[0] == at_once[7] == at_once[-1] == 0


def test_mask_sequences_refuses_spans_and_takes_empty_input():
    with pytest.raises(ValueError, match="per sequence"):
        mask_flat([[CLS, WORD_IDS[0], SEP]], cfg(span=True), 0)
    masked = mask_sequences(
        np.zeros(0, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        MaskDraws.draw(np.random.default_rng(0), 0, VOCAB),
        cfg(),
    )
    assert len(masked.input_ids) == len(masked.counts) == len(masked.positions) == 0


# --- RoBERTa's byte-level BPE vocabulary: `Ġ` marks a word start ---------------------------

BPE_TOKENS = [
    "<s>",
    "<pad>",
    "</s>",
    "<unk>",
    "<mask>",
    *(f"Ġw{i}" for i in range(30)),
    *(f"p{i}" for i in range(20)),
    ".",
    ",",
]
BPE_VOCAB = VocabTables.from_tokens(BPE_TOKENS)
BOS, BPE_PAD, EOS, BPE_MASK = (BPE_TOKENS.index(t) for t in ("<s>", "<pad>", "</s>", "<mask>"))
STARTS = [i for i, t in enumerate(BPE_TOKENS) if t.startswith("Ġ")]
REST = [i for i, t in enumerate(BPE_TOKENS) if t[0] in "p.,"]


def bpe_words(tokens):
    """Whole words as lists of positions: a `Ġ` piece starts one, any other piece continues
    the word before it; a special token ends it."""
    words, open_word = [], False
    for i, t in enumerate(tokens):
        if t in (BOS, EOS, BPE_PAD, BPE_MASK):
            open_word = False
            continue
        if open_word and not BPE_TOKENS[t].startswith("Ġ"):
            words[-1].append(i)
        else:
            words.append([i])
        open_word = True
    return words


def bpe_row(rng: random.Random) -> list[int]:
    """<s> A </s></s> B </s>, each segment starting mid-word now and then (a piece without Ġ)."""

    def segment():
        out = [rng.choice(REST)] if rng.random() < 0.3 else []
        for _ in range(rng.randint(1, 12)):
            out += [rng.choice(STARTS)] + [rng.choice(REST) for _ in range(rng.choice([0, 0, 1, 2, 3]))]
        return out

    return [BOS, *segment(), EOS, EOS, *segment(), EOS]


def test_roberta_vocabulary_masks_whole_words_marked_by_their_word_start():
    assert BPE_VOCAB.special.layout == "roberta" and BPE_VOCAB.special.separators == 2
    assert (BPE_VOCAB.special.cls, BPE_VOCAB.special.sep, BPE_VOCAB.special.pad, BPE_VOCAB.special.mask) == (
        BOS,
        EOS,
        BPE_PAD,
        BPE_MASK,
    )
    continues = {BPE_TOKENS[i] for i in np.flatnonzero(BPE_VOCAB.is_continuation)}
    assert continues == {t for t in BPE_TOKENS if t[0] in "p.,"}  # specials and Ġ pieces start words
    assert not set(BPE_VOCAB.replacement_ids.tolist()) & {BOS, BPE_PAD, EOS, 3, BPE_MASK}
    config = MaskConfig(vocab=BPE_VOCAB, masked_lm_prob=0.3, max_predictions_per_seq=40, whole_word_mask=True)
    rng = random.Random(7)
    rows = [bpe_row(rng) for _ in range(300)]
    multi_piece = 0
    # static (one sequence, and a block at once) and dynamic masking follow the same words
    flat = np.asarray([t for row in rows for t in row])
    offsets = np.cumsum([0, *map(len, rows)])
    block = mask_sequences(flat, offsets, MaskDraws.draw(np.random.default_rng(3), len(flat), BPE_VOCAB), config)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), BPE_PAD)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row)
    never = torch.isin(ids, torch.tensor([BOS, EOS, BPE_PAD, BPE_MASK]))
    cont = torch.from_numpy(BPE_VOCAB.is_continuation[ids.numpy()]) & (ids != BPE_PAD)
    _, labels = mask_batch(ids, never, cont, torch.Generator().manual_seed(4), config)
    at = 0
    for b, row in enumerate(rows):
        n = int(block.counts[b])
        masked = {
            "static": mask_tokens(
                row, BPE_VOCAB.is_continuation[np.asarray(row)].tolist(), random.Random(b), config
            ).masked_positions,
            "block": block.positions[at : at + n].tolist(),
            "dynamic": torch.nonzero(labels[b] != -100).flatten().tolist(),
        }
        at += n
        for how, positions in masked.items():
            chosen = set(positions)
            assert chosen and not {row[p] for p in chosen} & {BOS, EOS, BPE_PAD}, how
            assert len(chosen) <= num_to_predict(len(row), config), how
            for word in bpe_words(row):
                assert set(word) <= chosen or not set(word) & chosen, (how, word, positions)
                multi_piece += len(word) > 1 and set(word) <= chosen
    assert multi_piece > 100  # words of several pieces were masked whole
    out = mask_tokens(rows[0], BPE_VOCAB.is_continuation[np.asarray(rows[0])].tolist(), random.Random(0), config)
    assert all(out.input_ids[p] == BPE_MASK for p, k in zip(out.masked_positions, out.kinds) if k == MASKED)
