"""Inputs longer than the model's window (`long_inputs: windows`): each is read as
overlapping windows of max_seq_length tokens, laid out by the tokenizer itself as
`[CLS] piece [SEP]` (for a pair, `[CLS] text_a [SEP] piece of text_b [SEP]`, text_a cut to
at most half the window), `stride` text tokens apart, as QA reads a long context
(bertcore/eval/kinds/qa.py). A head reads one vector per window; `pool_windows` makes one per
input of them (mean, element-wise max, or the first window's), so the same head scores a
short input and a long one.

`long_input_counts` says how many inputs a task or the embedding check met that were
longer than the window, whichever mode reads them, and how many windows left text unread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bertcore.eval.settings import WindowPool

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Windowing:
    """How long inputs are cut into windows (the `long_inputs: windows` settings)."""

    max_seq_length: int
    stride: int | None
    """Text tokens between the starts of consecutive windows; None: half a window's text."""
    pool: WindowPool
    max_windows: int

    @classmethod
    def of(cls, cfg) -> Windowing | None:
        """The windowing a TaskConfig or EmbeddingsConfig asks for; None when it truncates."""
        if cfg.long_inputs != "windows":
            return None
        return cls(cfg.max_seq_length, cfg.window_stride, cfg.window_pool, cfg.max_windows)


@dataclass(frozen=True)
class Windows:
    """The windows of one input, each a model input (not padded)."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    cut: bool
    """Text past the last window was left unread (more than max_windows were needed)."""


def split_windows(tokenizer, text_a: str, text_b: str | None, spec: Windowing) -> Windows:
    """The windows of one text (or pair: text_b is windowed, text_a repeats in each).
    `tokenizer` is a transformers fast tokenizer."""
    pair = text_b is not None
    specials = tokenizer.num_special_tokens_to_add(pair=pair)
    first, room = text_a, spec.max_seq_length - specials  # room: text tokens per window
    if pair:
        first = _cut(text_a, tokenizer, room // 2)
        room -= len(tokenizer(first, add_special_tokens=False)["input_ids"])
    stride = min(spec.stride or max(1, room // 2), room)
    encoded = tokenizer(
        first,
        text_b,
        truncation="only_second" if pair else True,
        max_length=spec.max_seq_length,
        stride=room - stride,  # Hugging Face's `stride` is the overlap, ours the step
        return_overflowing_tokens=True,
        return_token_type_ids=True,
    )
    ids, types = encoded["input_ids"], encoded["token_type_ids"]
    return Windows(
        [list(w) for w in ids[: spec.max_windows]],
        [list(t) for t in types[: spec.max_windows]],
        cut=len(ids) > spec.max_windows,
    )


def _cut(text: str, tokenizer, tokens: int) -> str:
    """`text` cut after its first `tokens` tokens (at a character offset, so it stays text)."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return text if len(offsets) <= tokens else text[: offsets[max(0, tokens - 1)][1]]


def long_input_counts(tokenizer, texts_a: Sequence[str], texts_b: Sequence[str | None] | None, cfg) -> dict[str, int]:
    """{"inputs", "longer" (than max_seq_length tokens with the special tokens), "cut"
    (with windows: more text than max_windows windows read)} for the texts `cfg` (a
    TaskConfig or EmbeddingsConfig) reads."""
    pairs = texts_b if texts_b is not None and any(b is not None for b in texts_b) else None
    # verbose=False: no "longer than the model's maximum" warning, measuring that is the point
    encoded = tokenizer(list(texts_a), list(pairs) if pairs is not None else None, truncation=False, verbose=False)
    longer = [i for i, ids in enumerate(encoded["input_ids"]) if len(ids) > cfg.max_seq_length]
    spec = Windowing.of(cfg)
    cut = 0
    if spec is not None:
        cut = sum(
            split_windows(tokenizer, texts_a[i], pairs[i] if pairs is not None else None, spec).cut for i in longer
        )
    return {"inputs": len(texts_a), "longer": len(longer), "cut": cut}


def pool_windows(vectors: torch.Tensor, owner: torch.Tensor, how: WindowPool) -> torch.Tensor:
    """(B, F) from the (W, F) vectors of the windows of B inputs; `owner` (W,) gives each
    window's input, 0..B-1, every input's windows together and in order."""
    import torch

    count = int(owner[-1]) + 1
    if how == "first":
        starts = torch.ones_like(owner, dtype=torch.bool)
        starts[1:] = owner[1:] != owner[:-1]
        return vectors[starts]
    if how == "max":
        empty = vectors.new_full((count, vectors.shape[-1]), float("-inf"))
        return empty.scatter_reduce(0, owner[:, None].expand_as(vectors), vectors, reduce="amax", include_self=False)
    sums = vectors.new_zeros((count, vectors.shape[-1])).index_add(0, owner, vectors)
    windows = torch.bincount(owner, minlength=count).clamp(min=1).to(vectors.dtype)
    return sums / windows[:, None]
