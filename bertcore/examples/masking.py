"""Masked-LM targets: which positions to predict and what the model sees there.

`mask_tokens` masks one sequence with a `random.Random` exactly as Google's
create_masked_lm_predictions does (static masking, written into the examples shards);
`mask_batch` applies the same rules to a padded batch with a `torch.Generator` (dynamic
masking, drawn by the data loader each epoch).

The rules (Google's create_masked_lm_predictions):
- candidates are all positions except [CLS]/[SEP] (and [PAD]/[MASK]); with whole-word
  masking a `##` piece joins the word before it;
- in a byte-level BPE vocabulary (RoBERTa's `<s> </s> <pad> <mask>` in the roles of [CLS]
  [SEP] [PAD] [MASK]) a piece that begins with `Ġ` (a space) starts a word and any other
  piece continues the word before it, so whole-word masking joins `Ġun` `believ` `able`;
- num_to_predict = min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob))),
  len counting the specials, `round` halving to even like Python's;
- candidate words in random order; a word that would overflow the quota is skipped;
- per token 80% [MASK], 10% kept, 10% a random id; positions are reported sorted.

Differences from Google, on purpose:
- random replacements come from the non-special vocabulary only (never [PAD], [UNK],
  [CLS], [SEP], [MASK] or [unused*]); Google draws from the whole vocabulary;
- a `##` piece right after a special token starts a new word (Google would join it to the
  last word before the [SEP]).

SpanBERT (`span=True`): spans of whole words whose length in words follows the geometric
distribution p=0.2 truncated to 1..10 words and renormalised, as SpanBERT's code does (mean
3.8 words); the anchor is a uniform not-yet-masked word; a span stops early at a special
token, an already masked word or the quota. 80/10/10 is decided once per span, as in
SpanBERT. The quota is the same num_to_predict.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from bertcore.examples.vocab_tables import VocabTables

MASKED, KEPT, RANDOM = 0, 1, 2
"""Replacement kinds of a masked position: [MASK], original token kept, random token."""


@dataclass(frozen=True, eq=False)
class MaskConfig:
    vocab: VocabTables
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word_mask: bool = False
    span: bool = False
    """SpanBERT spans of whole words (implies whole-word masking)."""
    span_p: float = 0.2
    span_max_words: int = 10
    _span_cdf: tuple[float, ...] = field(init=False, repr=False)

    def __post_init__(self):
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError("masked_lm_prob must be in (0, 1)")
        if self.max_predictions_per_seq < 1:
            raise ValueError("max_predictions_per_seq must be at least 1")
        weights = [self.span_p * (1 - self.span_p) ** (k - 1) for k in range(1, self.span_max_words + 1)]
        total = sum(weights)
        object.__setattr__(self, "_span_cdf", tuple(np.cumsum(weights) / total))

    @property
    def mask_token_id(self) -> int:
        return self.vocab.special.mask

    @property
    def vocab_size(self) -> int:
        return self.vocab.vocab_size

    @property
    def never_masked(self) -> frozenset[int]:
        return self.vocab.special.never_masked

    @property
    def joins_words(self) -> bool:
        return self.whole_word_mask or self.span

    @cached_property
    def _replacement_tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.vocab.replacement_ids)

    def draw_span_words(self, rng: random.Random) -> int:
        """A span length in words: geometric(p) truncated to 1..span_max_words."""
        return min(bisect.bisect_right(self._span_cdf, rng.random()) + 1, self.span_max_words)


@dataclass(frozen=True)
class MaskedExample:
    input_ids: list[int]
    """The sequence as the model sees it."""
    masked_positions: list[int]
    """Sorted positions to predict."""
    masked_ids: list[int]
    """Original ids at masked_positions."""
    kinds: list[int]
    """MASKED / KEPT / RANDOM per masked position (for statistics)."""


def num_to_predict(length: int, cfg: MaskConfig) -> int:
    """Google's quota: length counts [CLS]/[SEP]; Python's round (half to even)."""
    return min(cfg.max_predictions_per_seq, max(1, int(round(length * cfg.masked_lm_prob))))


def _words(
    tokens: Sequence[int], candidate: Sequence[bool], is_continuation: Sequence[bool], joins: bool
) -> list[list[int]]:
    """Candidate positions grouped into words (text order); a word never spans a special."""
    words: list[list[int]] = []
    previous_is_candidate = False
    for i in range(len(tokens)):
        if not candidate[i]:
            previous_is_candidate = False
            continue
        if joins and previous_is_candidate and is_continuation[i]:
            words[-1].append(i)
        else:
            words.append([i])
        previous_is_candidate = True
    return words


def _replacement(kind_draw: float, second_draw: float) -> int:
    if kind_draw < 0.8:
        return MASKED
    return KEPT if second_draw < 0.5 else RANDOM


def mask_tokens(
    tokens: Sequence[int], is_continuation: Sequence[bool], rng: random.Random, cfg: MaskConfig
) -> MaskedExample:
    """Mask one sequence ([CLS] ... [SEP] included) as Google does; see the module docstring."""
    never = cfg.never_masked
    candidate = [t not in never for t in tokens]
    return _mask_one(list(tokens), candidate, is_continuation, rng, cfg)


def _mask_one(tokens: list[int], candidate, is_continuation, rng: random.Random, cfg: MaskConfig) -> MaskedExample:
    words = _words(tokens, candidate, is_continuation, cfg.joins_words)
    quota = num_to_predict(len(tokens), cfg)
    chosen = _spans(words, quota, rng, cfg) if cfg.span else _google_words(words, quota, rng, cfg)
    output = list(tokens)
    replacements = cfg.vocab.replacement_ids
    for position, kind in chosen:
        if kind == MASKED:
            output[position] = cfg.mask_token_id
        elif kind == RANDOM:
            output[position] = int(replacements[rng.randint(0, len(replacements) - 1)])
    chosen.sort()
    return MaskedExample(
        input_ids=output,
        masked_positions=[p for p, _ in chosen],
        masked_ids=[tokens[p] for p, _ in chosen],
        kinds=[k for _, k in chosen],
    )


def _google_words(words: list[list[int]], quota: int, rng: random.Random, cfg: MaskConfig) -> list[tuple[int, int]]:
    rng.shuffle(words)
    chosen: list[tuple[int, int]] = []
    for word in words:
        if len(chosen) >= quota:
            break
        if len(chosen) + len(word) > quota:
            continue  # a whole word that would overflow the quota is skipped
        for position in word:
            first = rng.random()
            second = rng.random() if first >= 0.8 else 0.0
            chosen.append((position, _replacement(first, second)))
    return chosen


def _spans(words: list[list[int]], quota: int, rng: random.Random, cfg: MaskConfig) -> list[tuple[int, int]]:
    # Words i and i+1 are adjacent in the text when no special token lies between them.
    adjacent = [words[i][-1] + 1 == words[i + 1][0] for i in range(len(words) - 1)]
    masked = [False] * len(words)
    alive = list(range(len(words)))  # possible anchors
    chosen: list[tuple[int, int]] = []
    while len(chosen) < quota and alive:
        span_words = cfg.draw_span_words(rng)
        anchor = alive[rng.randint(0, len(alive) - 1)]
        room = quota - len(chosen)
        if len(words[anchor]) > room:
            alive.remove(anchor)  # can never fit: the room only shrinks
            continue
        span = [anchor]
        used = len(words[anchor])
        k = anchor + 1
        while (
            len(span) < span_words
            and k < len(words)
            and adjacent[k - 1]
            and not masked[k]
            and used + len(words[k]) <= room
        ):
            span.append(k)
            used += len(words[k])
            k += 1
        first = rng.random()
        kind = _replacement(first, rng.random() if first >= 0.8 else 0.0)
        for w in span:
            masked[w] = True
            alive.remove(w)
            chosen.extend((position, kind) for position in words[w])
    return chosen


def greedy_words(lengths: np.ndarray, n_words: np.ndarray, quota: np.ndarray) -> np.ndarray:
    """Google's walk over each row's words in their (random) order: a word is taken when it
    fits the room left under the quota, skipped otherwise. lengths: (B, W) word lengths in
    walk order, a row's first n_words[b] entries being its words; returns (B, W) bool.

    Every word before a row's first overflow is taken (the running total stays within the
    quota), so only the words after that one are walked one by one, and only in rows with
    room left: a few scalar steps per row instead of W steps over the batch."""
    B, W = lengths.shape
    inside = np.arange(W) < np.asarray(n_words)[:, None]
    running = np.cumsum(np.where(inside, lengths, 0), axis=1)
    quota = np.asarray(quota)
    take = inside & (running <= quota[:, None])
    over = inside & ~take  # from the first word that did not fit on
    for b in np.flatnonzero(over.any(axis=1)).tolist():
        k = int(over[b].argmax())
        room = int(quota[b]) - (int(running[b, k - 1]) if k else 0)
        if room <= 0:
            continue
        for r, length in enumerate(lengths[b, k + 1 : int(n_words[b])].tolist(), k + 1):
            if length <= room:
                take[b, r] = True
                room -= length
                if not room:
                    break
    return take


def mask_batch(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor,
    continuation_mask: torch.Tensor,
    generator: torch.Generator,
    cfg: MaskConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic masking of a padded batch: (masked input_ids, labels with -100 elsewhere).

    input_ids, special_mask, continuation_mask: (B, T); special_mask is True at positions
    that must never be masked (specials and padding). Sequence lengths for the quota are the
    non-[PAD] counts. Same rules as `mask_tokens` per sequence: quota formula, whole words
    skipped when they overflow, 80/10/10 per token. The draws differ (torch instead of
    Python's random), so a sequence gets a different but equally distributed mask. SpanBERT
    spans are drawn per sequence with `mask_tokens`' code (seeded from `generator`).
    """
    B, T = input_ids.shape
    lengths = (input_ids != cfg.vocab.special.pad).sum(1)  # (B,)
    quota = torch.clamp(torch.round(lengths.double() * cfg.masked_lm_prob), min=1).long()
    quota = torch.clamp(quota, max=cfg.max_predictions_per_seq)  # (B,)
    candidate = ~special_mask
    if cfg.span:
        return _mask_batch_spans(input_ids, candidate, continuation_mask, lengths, generator, cfg)

    # Words: a candidate starts a word unless it is a `##` piece right after a candidate.
    previous = torch.zeros_like(candidate)
    previous[:, 1:] = candidate[:, :-1]
    starts = candidate & ~(continuation_mask & previous) if cfg.joins_words else candidate  # (B, T)
    word_of = torch.cumsum(starts.long(), 1) - 1  # (B, T) word index of each token
    word_of = torch.where(candidate, word_of, torch.full_like(word_of, T))  # non-candidates -> bin T
    word_len = torch.zeros(B, T + 1, dtype=torch.long).scatter_add_(1, word_of, torch.ones_like(word_of))
    n_words = starts.sum(1)  # (B,)

    # A uniform random order of each sequence's words: sort random keys.
    keys = torch.rand(B, T, generator=generator)
    word_keys = torch.full((B, T + 1), 2.0).scatter_(1, torch.where(starts, word_of, T), keys)[:, :T]
    order = torch.argsort(word_keys, dim=1)  # (B, T) word indices in random order
    ordered_len = torch.gather(word_len, 1, order)  # (B, T)
    rank = torch.arange(T).expand(B, T)
    valid = rank < n_words[:, None]

    if not cfg.joins_words:
        take = valid & (rank < quota[:, None])  # every word is one token
    else:
        # Greedy as in Google: walk words in random order, skip the ones that overflow.
        take = torch.from_numpy(greedy_words(ordered_len.numpy(), n_words.numpy(), quota.numpy()))
    word_taken = torch.zeros(B, T + 1, dtype=torch.bool).scatter_(1, order, take)
    selected = torch.gather(word_taken, 1, word_of) & candidate  # (B, T)

    draw = torch.rand(B, T, generator=generator)
    random_ids = cfg._replacement_tensor[torch.randint(0, len(cfg.vocab.replacement_ids), (B, T), generator=generator)]
    out = input_ids.clone()
    out = torch.where(selected & (draw < 0.8), torch.full_like(out, cfg.mask_token_id), out)
    out = torch.where(selected & (draw >= 0.9), random_ids.to(out.dtype), out)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
    return out, labels


def _mask_batch_spans(input_ids, candidate, continuation_mask, lengths, generator, cfg):
    out = input_ids.clone()
    labels = torch.full_like(input_ids, -100)
    for b in range(input_ids.shape[0]):
        n = int(lengths[b])
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        tokens = input_ids[b, :n].tolist()
        example = _mask_one(
            tokens, candidate[b, :n].tolist(), continuation_mask[b, :n].tolist(), random.Random(seed), cfg
        )
        out[b, :n] = torch.tensor(example.input_ids, dtype=out.dtype)
        labels[b, example.masked_positions] = torch.tensor(example.masked_ids, dtype=labels.dtype)
    return out, labels


# -- static masking of many sequences at once ----------------------------------------------------


@dataclass(frozen=True)
class MaskDraws:
    """The random numbers that mask a run of sequences, one of each per token, so that a
    block of sequences can be masked at once while every document keeps its own generator.

    order: the sort key of the token (of its word's first token with whole words);
    kind: [MASK] below 0.8, kept below 0.9, else random; replacement: index into
    `VocabTables.replacement_ids` used when the kind is random.
    """

    order: np.ndarray
    kind: np.ndarray
    replacement: np.ndarray

    @classmethod
    def draw(cls, generator: np.random.Generator, tokens: int, vocab: VocabTables) -> MaskDraws:
        uniform = generator.random((2, tokens))
        replacement = generator.integers(0, len(vocab.replacement_ids), tokens)
        return cls(uniform[0], uniform[1], replacement)

    @classmethod
    def concatenate(cls, parts: Sequence[MaskDraws]) -> MaskDraws:
        return cls(*(np.concatenate([getattr(p, name) for p in parts]) for name in ("order", "kind", "replacement")))


@dataclass(frozen=True)
class MaskedSequences:
    """Static masks of sequences stored back to back (the flat form the shards use)."""

    input_ids: np.ndarray
    """(N,) every sequence as the model sees it, concatenated."""
    counts: np.ndarray
    """(B,) masked positions per sequence."""
    positions: np.ndarray
    """(M,) positions within their sequence, ascending within each sequence."""
    masked_ids: np.ndarray
    """(M,) original ids at those positions."""
    kinds: np.ndarray
    """(M,) MASKED / KEPT / RANDOM."""


def mask_sequences(ids: np.ndarray, offsets: np.ndarray, draws: MaskDraws, cfg: MaskConfig) -> MaskedSequences:
    """`mask_tokens`' rules applied to B sequences at once with numpy (not SpanBERT spans).

    ids: (N,) the sequences back to back; offsets: (B+1,) where each starts, then N;
    draws: one set per token. A sequence's candidate words are ordered by their draws
    (a uniform random order), then taken greedily as in Google's loop: a whole word that
    would overflow the quota is skipped. Same distribution as `mask_tokens`, different
    draws.
    """
    if cfg.span:
        raise ValueError("SpanBERT spans are drawn per sequence: use mask_tokens")
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    B = len(lengths)
    special = cfg.vocab.special
    if B == 0 or len(ids) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return MaskedSequences(np.asarray(ids).copy(), np.zeros(B, dtype=np.int64), empty, empty.copy(), empty.copy())
    ids = np.asarray(ids, dtype=np.int64)
    T = int(lengths.max())
    pos = np.arange(T)
    valid = pos < lengths[:, None]  # (B, T)
    flat_index = np.minimum(offsets[:-1, None] + pos, len(ids) - 1)  # (B, T) -> position in ids
    never = np.zeros(cfg.vocab_size, dtype=bool)
    never[list(cfg.never_masked)] = True
    candidate = valid & ~never[ids][flat_index]
    quota = np.minimum(cfg.max_predictions_per_seq, np.maximum(1, np.rint(lengths * cfg.masked_lm_prob))).astype(
        np.int64
    )
    keys = np.where(candidate, draws.order[flat_index], 2.0)

    if not cfg.joins_words:
        # Every word is one token: the `quota` smallest keys of each row.
        ranked = np.sort(keys, axis=1)
        threshold = ranked[np.arange(B), np.minimum(quota, T) - 1]
        selected = candidate & (keys <= threshold[:, None])
    else:
        previous = np.zeros_like(candidate)
        previous[:, 1:] = candidate[:, :-1]
        starts = candidate & ~(cfg.vocab.is_continuation[ids][flat_index] & previous)
        word = np.where(candidate, np.cumsum(starts, axis=1) - 1, T)  # (B, T), T = no word
        rows = np.repeat(np.arange(B), T)
        word_len = np.bincount(rows * (T + 1) + word.ravel(), minlength=B * (T + 1)).reshape(B, T + 1)
        word_key = np.full((B, T + 1), 2.0)
        r, c = np.nonzero(starts)
        word_key[r, word[r, c]] = keys[r, c]
        order = np.argsort(word_key[:, :T], axis=1, kind="stable")  # words in random order
        ordered_len = np.take_along_axis(word_len, order, axis=1)
        take = greedy_words(ordered_len, starts.sum(axis=1), quota)
        taken = np.zeros((B, T + 1), dtype=bool)
        np.put_along_axis(taken, order, take, axis=1)
        selected = candidate & np.take_along_axis(taken, word, axis=1)

    # only the selected positions need a kind and a replacement: work on them in `ids` order
    _, cols = np.nonzero(selected)
    at = flat_index[selected]  # (M,) positions in ids, sequence by sequence, ascending
    kind_draw = draws.kind[at]
    kinds = np.where(kind_draw < 0.8, MASKED, np.where(kind_draw < 0.9, KEPT, RANDOM))
    out = ids.copy()
    out[at[kinds == MASKED]] = special.mask
    randomised = at[kinds == RANDOM]
    out[randomised] = cfg.vocab.replacement_ids[draws.replacement[randomised]]
    return MaskedSequences(
        input_ids=out,
        counts=selected.sum(axis=1),
        positions=cols,
        masked_ids=ids[at],
        kinds=kinds,
    )
