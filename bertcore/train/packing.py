"""Padding-free batches: records packed back to back up to a token budget, with their
boundaries kept, for a family whose model reads packed batches (bertcore/model/modernbert.py).

`pack_batches` cuts an epoch's records into batches of at most `token_budget` tokens;
`PackedCollator` turns one batch's gathered records (`Rows`, bertcore/train/records.py) into
the tensors the model reads, with the call signature of the loader's `Collator`:

    input_ids     (1, N) long   every record's ids back to back (N = the batch's tokens; with
                                pad_to_multiple_of > 1, [PAD]s after the last record up to a
                                multiple, outside every sequence)
    cu_seqlens    (S+1,) int32  where each of the S records starts, then N without the padding
    position_ids  (1, N) long   0 at each record's first token: positions restart per record
    max_seqlen    ()     long   the longest record
    labels        (1, N) long   original id at masked positions, -100 elsewhere
    next_sentence_label (S,) long  -100 where a record has no NSP label

No token attends across a boundary (the model's attention is per sequence) and nothing is
padded, so the padding share of a packed batch is 0 (or the tail, with
pad_to_multiple_of). Masks: static ones are read from the records; dynamic ones are drawn
per batch with `mask_batch` from a generator keyed by (seed, epoch, batch index), as the
padded Collator draws them, at the MaskConfig's rate (30% for the modern family's recipes,
15% for a held-out score comparable with BERT's).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch

from bertcore.examples.masking import MaskConfig, mask_batch
from bertcore.model.config import IGNORE_INDEX
from bertcore.rng import keyed_seed
from bertcore.train.records import Rows


def pack_batches(lengths: np.ndarray, token_budget: int, rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """Record positions (indexes into `lengths`) in batches of at most `token_budget`
    tokens each. The records are shuffled with `rng` first (None: kept in the given
    order, e.g. already shuffled by the caller), then taken in turn: a record joins the
    current batch when it fits, else it starts the next one (greedy, next fit: each batch
    leaves less room unused than the longest record). Every record lands in exactly one
    batch; a record longer than the budget is a ValueError naming the budget."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if token_budget < 1:
        raise ValueError(f"token_budget must be at least 1, got {token_budget}")
    if lengths.size and int(lengths.max()) > token_budget:
        longest = int(lengths.max())
        raise ValueError(
            f"a record of {longest} tokens is longer than the token budget of {token_budget} per micro-batch; "
            "raise the phase's token_budget (it is split over workers and accumulation steps) to at least that"
        )
    order = rng.permutation(len(lengths)) if rng is not None else np.arange(len(lengths))
    if not len(order):
        return []
    # where each batch starts: walk the running total, cutting where it would pass the budget
    starts, used = [0], 0
    ordered = lengths[order].tolist()
    for i, length in enumerate(ordered):
        if used + length > token_budget:
            starts.append(i)
            used = 0
        used += length
    bounds = starts + [len(order)]
    return [order[a:b] for a, b in zip(bounds, bounds[1:])]


class TokenBatching:
    """The loader's batching (bertcore/train/loader.py `Batching`'s interface) for packed
    batches: a window's records, shuffled (keyed by the window), packed to `budget` tokens
    each (`pack_batches`). How many batches a window gives is known only once its lengths
    are read, so `count` is None and the loader learns the epoch's order window by window."""

    def __init__(self, budget: int, *, shuffle: bool):
        if budget < 1:
            raise ValueError(f"token_budget must be at least 1, got {budget}")
        self.budget, self.shuffle = budget, shuffle

    def count(self, rows: int) -> None:
        return None

    def __call__(self, lengths: np.ndarray, groups: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        return pack_batches(lengths, self.budget, rng if self.shuffle else None)


def padding_share(lengths: np.ndarray, batches: list[np.ndarray], multiple: int = 8) -> float:
    """The share of padded positions if `batches` (positions into `lengths`) were padded
    to their longest record, rounded up to `multiple`: what length-binned padded batches
    cost, for comparison with packed ones (0)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    real = slots = 0
    for batch in batches:
        part = lengths[batch]
        real += int(part.sum())
        slots += len(part) * math.ceil(int(part.max()) / multiple) * multiple
    return 1.0 - real / slots if slots else 0.0


class PackedCollator:
    """Gathered records -> one packed batch (see the module docstring); the loader calls
    it as it calls `Collator`: collator(rows, epoch, batch_index)."""

    def __init__(
        self,
        *,
        seed: int,
        masking: Literal["static", "dynamic"] = "dynamic",
        mask_config: MaskConfig | None = None,
        pad_id: int | None = None,
        pad_to_multiple_of: int = 1,
    ):
        if masking == "dynamic" and mask_config is None:
            raise ValueError("dynamic masking needs a mask_config")
        if pad_id is None:
            if mask_config is None:
                raise ValueError("give pad_id or a mask_config (which knows [PAD])")
            pad_id = mask_config.vocab.special.pad
        self.seed, self.masking, self.mask_config = seed, masking, mask_config
        self.pad_id, self.multiple = pad_id, pad_to_multiple_of
        if mask_config is not None:
            self._never = np.zeros(mask_config.vocab_size, dtype=bool)  # (V,) never a target
            self._never[sorted(mask_config.never_masked)] = True

    def __call__(self, rows: Rows, epoch: int, batch_index: int) -> dict[str, torch.Tensor]:
        lengths = np.asarray(rows.lengths, dtype=np.int64)  # (S,)
        starts = np.concatenate([[0], np.cumsum(lengths)])  # (S+1,)
        n = int(starts[-1])
        ids = np.asarray(rows.ids, dtype=np.int64)
        if len(ids) != n:
            raise ValueError(f"the records hold {len(ids)} ids but their lengths add up to {n}")
        positions = np.arange(n) - np.repeat(starts[:-1], lengths)  # (N,) restart per record
        labels = np.full(n, IGNORE_INDEX, dtype=np.int64)
        if self.masking == "static":
            if rows.mask_counts is None or not rows.mask_counts.any():
                raise ValueError(
                    "these examples carry no stored masks (written with dynamic masking): use masking='dynamic'"
                )
            owner = np.repeat(np.arange(len(lengths)), rows.mask_counts)
            labels[starts[owner] + rows.positions] = rows.masked_ids
        else:
            ids, labels = self._dynamic(ids, lengths, epoch, batch_index)
        total = math.ceil(n / self.multiple) * self.multiple if n else 0
        tail = total - n
        if tail:  # padding after the last record, in no sequence: cu_seqlens ends at n
            ids = np.concatenate([ids, np.full(tail, self.pad_id, dtype=np.int64)])
            labels = np.concatenate([labels, np.full(tail, IGNORE_INDEX, dtype=np.int64)])
            positions = np.concatenate([positions, np.zeros(tail, dtype=np.int64)])
        nsp = rows.next_sentence_label.astype(np.int64)
        nsp[nsp < 0] = IGNORE_INDEX
        return {
            "input_ids": torch.from_numpy(ids)[None],
            "cu_seqlens": torch.from_numpy(starts.astype(np.int32)),
            "position_ids": torch.from_numpy(positions)[None],
            "max_seqlen": torch.tensor(int(lengths.max()) if len(lengths) else 0),
            "labels": torch.from_numpy(labels)[None],
            "next_sentence_label": torch.from_numpy(nsp),
        }

    def _dynamic(self, ids, lengths, epoch: int, batch_index: int) -> tuple[np.ndarray, np.ndarray]:
        """`mask_batch`'s masks (the padded Collator's rules and keyed draws), on a padded
        view of the records, back in packed order."""
        cfg = self.mask_config
        longest = int(lengths.max())
        real = np.arange(longest) < lengths[:, None]  # (S, L), row-major as the packed ids
        padded = np.full(real.shape, self.pad_id, dtype=np.int64)
        padded[real] = ids
        special = torch.from_numpy(self._never[padded] | ~real)
        continuation = torch.from_numpy(cfg.vocab.is_continuation[padded] & real)
        generator = torch.Generator().manual_seed(keyed_seed(self.seed, "dynamic-mask", epoch, batch_index) >> 1)
        masked, labels = mask_batch(torch.from_numpy(padded), special, continuation, generator, cfg)
        return masked.numpy()[real], labels.numpy()[real]
