"""Training sequences from documents: NSP pairs (BERT), SOP pairs (ALBERT) and packed
sentences (RoBERTa FULL-SENTENCES / DOC-SENTENCES).

A document is a sequence of segments (sentences), each already tokenized to ids: a
`list[list[int]]`, or a `FlatDocument` (segments back to back in one array, as the examples
stage reads them from its token shards). Everything here is pure; randomness enters as a
`random.Random`.

`objective: bert` follows Google's create_pretraining_data.py step for step. Deliberate
differences, all rare:
- Empty segments are ignored (Google never produces them: it drops lines that tokenize to
  nothing).
- A random B needs "another document": like Google we try up to 10 uniform draws of a
  document index that differs from the current one. Google then uses whatever the last draw
  was, even the current document, and still labels the pair random. When all 10 draws hit
  the current document (probability n**-10 for a corpus of n documents), bertpipe draws
  uniformly among the other documents instead; only a one-document corpus takes its random
  B from the current document (counted as `same_document_negative`). An empty random
  document counts as a failed draw.
- Google draws negatives from the documents of the input files its one process reads (a
  shard of the corpus, as it is run in practice; LDDL: the same partition). bertpipe draws
  them from a corpus shard's own documents and those of a keyed sample of other shards of
  its split (`random_next_shards`), via `RandomDocs` (the caller backs it with an index over
  those shards), so the bytes a task reads are bounded by the sample, not by the corpus.
`objective: sop` (ALBERT): A and B are always consecutive text of the same document; label 1
means the two were swapped. A chunk of a single segment (ALBERT takes a random B there) is
split inside the segment at a uniform token boundary instead, so SOP never sees text from
another document; a one-token chunk yields no pair.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from typing import Literal, Protocol

import numpy as np

Document = Sequence[list[int]]
"""A document's segments (sentences) as token ids: a list of lists or a `FlatDocument`."""

RANDOM_NEXT_TRIES = 10
"""Draws of a document index that avoid the current document (Google's constant)."""


class RandomDocs(Protocol):
    """Access by index to the documents random B segments are drawn from."""

    @property
    def num_documents(self) -> int: ...

    def get(self, index: int) -> Document: ...


class InMemoryDocs:
    """`RandomDocs` over a list of documents (tests, small corpora)."""

    def __init__(self, documents: Sequence[Document]):
        self.documents = documents

    @property
    def num_documents(self) -> int:
        return len(self.documents)

    def get(self, index: int) -> Document:
        return self.documents[index]


def random_next_shards(own: int, shards: int, others: int, rng: random.Random) -> list[int]:
    """The shards whose documents a shard's random next sentences come from, in shard order:
    `own` and `others` of the other `shards - 1` drawn without replacement (all of them when
    there are no more than `others`). Google's script draws from the files one process
    reads; this is that set, chosen by a keyed generator instead of by how the corpus was
    split among processes."""
    if not 0 <= own < shards:
        raise ValueError(f"shard {own} is not among {shards} shards")
    if others >= shards - 1:
        return list(range(shards))
    picked = [s + (s >= own) for s in rng.sample(range(shards - 1), others)]
    return sorted([own, *picked])


@dataclass(frozen=True)
class PairConfig:
    """How sequences are built from documents (derived from the examples section and a phase)."""

    max_seq_length: int
    """Tokens per sequence including [CLS]/[SEP]."""
    short_seq_prob: float = 0.1
    """Probability that a document (per pass) gets a shorter random target length."""
    objective: Literal["bert", "sop", "roberta"] = "bert"
    doc_sentences: bool = False
    """roberta only: True = DOC-SENTENCES (never cross a document boundary)."""
    separators: int = 1
    """Separator tokens between A and B: 1 ([SEP]), or 2 (RoBERTa's </s></s>)."""

    def __post_init__(self):
        least = 3 if self.objective == "roberta" else 4 + self.separators
        if self.max_seq_length < least:
            # [CLS] A [SEP] B [SEP] needs one token each for A and B.
            raise ValueError(f"max_seq_length must be at least {least} for objective {self.objective}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError("short_seq_prob must be in [0, 1]")
        if self.doc_sentences and self.objective != "roberta":
            raise ValueError("doc_sentences applies to objective roberta only")

    @property
    def max_num_tokens(self) -> int:
        """Tokens of A and B together: [CLS] A [SEP] B [SEP] (or <s> A </s></s> B </s>) fits max_seq_length."""
        return self.max_seq_length - 2 - self.separators


@dataclass(frozen=True)
class Pair:
    """Segments A and B of one training sequence, before [CLS]/[SEP] are added."""

    tokens_a: list[int]
    tokens_b: list[int]
    is_random_next: bool
    """bert: B is from another document (label 1); sop: A and B were swapped (label 1)."""
    target_was_short: bool
    """The document's target length this pass was drawn short (short_seq_prob)."""
    truncated: bool
    """truncate_seq_pair removed tokens."""
    single_segment_chunk: bool
    """The chunk held one segment, so bert had to take a random B (sop: split the segment)."""
    same_document_negative: bool = False
    """bert: the random B came from the current document (one-document corpus only)."""


def truncate_seq_pair(
    tokens_a: Sequence[int], tokens_b: Sequence[int], max_num_tokens: int, rng: random.Random
) -> tuple[list[int], list[int]]:
    """Trim A and B until len(A) + len(B) <= max_num_tokens; returns new lists.

    As in Google's code: each step trims the longer side (B on a tie) by one token, from the
    front or the back with probability 0.5 each. Trimming both ends keeps the kept text from
    always being a prefix, which would bias the model toward sentence starts.

    The steps are not walked one by one: which side each step trims depends only on the
    lengths, so the number of tokens cut from each side is known up front, and the number
    cut from its front is the count of heads in that many fair coins (one random bit each).
    Same distribution as Google's loop, one draw per side instead of one per token.
    """
    len_a, len_b = len(tokens_a), len(tokens_b)
    cut_a, cut_b = trim_counts(len_a, len_b, max_num_tokens)
    front_a, front_b = _heads(rng, cut_a), _heads(rng, cut_b)
    return list(tokens_a[front_a : len_a - cut_a + front_a]), list(tokens_b[front_b : len_b - cut_b + front_b])


def trim_counts(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """Tokens Google's loop cuts from A and from B: the longer side until both are equal,
    then B and A in turn (B first, as a tie trims B)."""
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0
    gap = abs(len_a - len_b)
    if excess <= gap:
        return (excess, 0) if len_a > len_b else (0, excess)
    rest = excess - gap
    return (gap if len_a > len_b else 0) + rest // 2, (gap if len_b > len_a else 0) + rest - rest // 2


def _heads(rng: random.Random, coins: int) -> int:
    return rng.getrandbits(coins).bit_count() if coins else 0


def draw_target_length(max_num_tokens: int, short_seq_prob: float, rng: random.Random) -> tuple[int, bool]:
    """(target length, was it drawn short): Google's target_seq_length rule.

    Most sequences fill max_num_tokens; a few are shorter so that pretraining also sees the
    short inputs of fine-tuning.
    """
    if rng.random() < short_seq_prob:
        return rng.randint(2, max_num_tokens), True
    return max_num_tokens, False


class FlatDocument(Sequence[list[int]]):
    """A document's segments stored back to back: `values[bounds[i]:bounds[i + 1]]` is
    segment i. Segments are turned into lists only when read, so drawing a random B from a
    long document costs the few segments used, not the whole document."""

    __slots__ = ("bounds", "nonempty_known", "values")

    def __init__(self, values: np.ndarray, bounds: np.ndarray, nonempty_known: bool = False):
        self.values = values
        self.bounds = bounds
        self.nonempty_known = nonempty_known
        """The caller guarantees there is no empty segment (skips the check)."""

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise ValueError("FlatDocument slices must be contiguous")
            return FlatDocument(self.values, self.bounds[start : max(start, stop) + 1], self.nonempty_known)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.values[self.bounds[index] : self.bounds[index + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        for start, end in zip(self.bounds[:-1].tolist(), self.bounds[1:].tolist()):
            yield self.values[start:end].tolist()

    def nonempty(self) -> FlatDocument:
        """Itself without empty segments."""
        if self.nonempty_known or len(self) == 0 or (np.diff(self.bounds) > 0).all():
            return self
        return FlatDocument(self.values, np.unique(self.bounds), True)

    def flat(self) -> tuple[list[int], list[int]]:
        """(all tokens, where each segment starts in them, then the end) as lists."""
        first = int(self.bounds[0])
        return self.values[first : int(self.bounds[-1])].tolist(), (self.bounds - first).tolist()


def _nonempty(doc: Document) -> Document:
    if isinstance(doc, FlatDocument):
        return doc.nonempty()
    return [segment for segment in doc if segment]


def _random_document(
    docs: RandomDocs | Callable[[random.Random], Document], doc_index: int | None, rng: random.Random
) -> tuple[Document, bool]:
    """(segments of a random other document, whether they came from the current document)."""
    if callable(docs) and not hasattr(docs, "get"):
        other = _nonempty(docs(rng))
        if not other:
            raise ValueError("random_docs returned an empty document; it must return one with tokens")
        return other, False
    n = docs.num_documents
    for _ in range(RANDOM_NEXT_TRIES):
        index = rng.randint(0, n - 1)
        if index != doc_index:
            other = _nonempty(docs.get(index))
            if other:
                return other, False
    # All draws failed (see the module docstring): one uniform draw among the other
    # documents, then, only if that one is empty, the next non-empty one after it.
    others = n - (1 if doc_index is not None and 0 <= doc_index < n else 0)
    if others > 0:
        first = rng.randint(0, others - 1)
        for step in range(others):
            index = (first + step) % others
            if doc_index is not None and index >= doc_index:
                index += 1
            other = _nonempty(docs.get(index))
            if other:
                return other, False
    if doc_index is None:
        raise ValueError("no non-empty document to draw a random B segment from")
    return _nonempty(docs.get(doc_index)), True


def build_pairs(
    doc: Document,
    rng: random.Random,
    cfg: PairConfig,
    random_docs: RandomDocs | Callable[[random.Random], Document],
    doc_index: int | None = None,
) -> list[Pair]:
    """All pairs of one document for one pass (objectives bert and sop).

    `random_docs` supplies B segments for random-next pairs (bert): either a `RandomDocs`
    (with `doc_index` = this document's index in it, so the 10-tries rule can avoid it) or a
    callable `rng -> document` that already returns another document.
    """
    if cfg.objective == "roberta":
        raise ValueError("objective roberta packs sentences: use pack_sentences")
    tokens, starts = _flat(_nonempty(doc))
    n = len(starts) - 1
    if n == 0:
        return []
    max_num_tokens = cfg.max_num_tokens
    target, short = draw_target_length(max_num_tokens, cfg.short_seq_prob, rng)
    pairs: list[Pair] = []
    first = 0  # the chunk is segments first..i
    i = 0
    while i < n:
        if i == n - 1 or starts[i + 1] - starts[first] >= target:
            pair, unused = _pair_from_chunk(
                tokens, starts, first, i + 1, target, short, rng, cfg, random_docs, doc_index
            )
            if pair is not None:
                pairs.append(pair)
            i -= unused  # put unused segments back: the walk rewinds
            first = i + 1
        i += 1
    return pairs


def _flat(doc: Document) -> tuple[list[int], list[int]]:
    """(all tokens, where each segment starts, then the end): segments are then slices."""
    if isinstance(doc, FlatDocument):
        return doc.flat()
    return list(chain.from_iterable(doc)), [0, *accumulate(map(len, doc))]


def _pair_from_chunk(
    tokens, starts, first, end, target, short, rng, cfg, random_docs, doc_index
) -> tuple[Pair | None, int]:
    """The pair made of segments first..end-1 (Google's chunk) and how many of them go back."""
    max_num_tokens = cfg.max_num_tokens
    segments = end - first
    a_end = first + (rng.randint(1, segments - 1) if segments >= 2 else 1)
    single = segments == 1
    tokens_a = tokens[starts[first] : starts[a_end]]
    unused = 0
    same_doc = False
    if cfg.objective == "sop":
        if single:
            # Split the one segment inside itself so B still follows A in the text.
            if len(tokens_a) < 2:
                return None, 0
            cut = rng.randint(1, len(tokens_a) - 1)
            tokens_a, tokens_b = tokens_a[:cut], tokens_a[cut:]
        else:
            tokens_b = tokens[starts[a_end] : starts[end]]
        swapped = rng.random() < 0.5
        if swapped:
            tokens_a, tokens_b = tokens_b, tokens_a
        label = swapped
    elif single or rng.random() < 0.5:
        label = True
        target_b = target - len(tokens_a)
        other, same_doc = _random_document(random_docs, doc_index, rng)
        tokens_b = _segments_from(other, rng.randint(0, len(other) - 1), target_b)
        unused = end - a_end
    else:
        label = False
        tokens_b = tokens[starts[a_end] : starts[end]]
    before = len(tokens_a) + len(tokens_b)
    tokens_a, tokens_b = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
    pair = Pair(
        tokens_a=tokens_a,
        tokens_b=tokens_b,
        is_random_next=label,
        target_was_short=short,
        truncated=len(tokens_a) + len(tokens_b) < before,
        single_segment_chunk=single,
        same_document_negative=same_doc,
    )
    return pair, unused


def _segments_from(doc: Document, start: int, least: int) -> list[int]:
    """Tokens of whole segments from `start` on, until there are at least `least` (or the
    document ends): Google's random B."""
    if isinstance(doc, FlatDocument):
        bounds = doc.bounds
        stop = int(np.searchsorted(bounds, bounds[start] + max(least, 1), side="left"))
        return doc.values[bounds[start] : bounds[min(stop, len(bounds) - 1)]].tolist()
    out: list[int] = []
    for segment in doc[start:]:
        out.extend(segment)
        if len(out) >= least:
            break
    return out


def pack_sentences(docs: Iterable[Document], rng: random.Random, cfg: PairConfig, sep_id: int) -> Iterator[list[int]]:
    """RoBERTa FULL-SENTENCES (cfg.doc_sentences False) or DOC-SENTENCES (True).

    Yields the body of each sequence (without the outer [CLS] ... [SEP]): whole sentences,
    contiguous in the documents' order, up to max_seq_length - 2 tokens. FULL-SENTENCES
    crosses document boundaries and puts `sep_id` between documents; DOC-SENTENCES ends a
    sequence at each document's end, so those sequences may be shorter.

    A sentence longer than max_seq_length - 2 is cut into pieces of that size. With
    short_seq_prob > 0 a sequence's target length is drawn as in Google's code (RoBERTa
    itself always fills; its recipe uses short_seq_prob 0). A sequence ends once it reaches
    the target or when the next sentence would overflow the maximum.
    """
    if cfg.objective != "roberta":
        raise ValueError("pack_sentences is for objective roberta")
    max_tokens = cfg.max_seq_length - 2
    current: list[int] = []
    boundary = False  # a document ended since the last sentence of `current`
    target, _ = draw_target_length(max_tokens, cfg.short_seq_prob, rng)
    for doc in docs:
        for sentence in doc:
            for start in range(0, len(sentence), max_tokens):
                piece = sentence[start : start + max_tokens]
                need = len(piece) + (1 if boundary and current else 0)
                if current and len(current) + need > max_tokens:
                    yield current
                    current = []
                    target, _ = draw_target_length(max_tokens, cfg.short_seq_prob, rng)
                if boundary and current:
                    current.append(sep_id)
                boundary = False
                current.extend(piece)
                if len(current) >= target:
                    yield current
                    current = []
                    target, _ = draw_target_length(max_tokens, cfg.short_seq_prob, rng)
        if cfg.doc_sentences:
            if current:
                yield current
                current = []
                target, _ = draw_target_length(max_tokens, cfg.short_seq_prob, rng)
        else:
            boundary = True
    if current:
        yield current
