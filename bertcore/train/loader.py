"""Training data loader over examples shards (Arrow IPC files, memory-mapped), streamed a
window of shards at a time.

Per epoch, one global order that does not depend on the number of ranks: the shards in a
keyed order, cut into windows of `window_shards`; inside a window, records are grouped by
length bin (or by file when no bins are given), shuffled, cut into batches, and the
batches shuffled, all keyed by (seed, epoch, window). Data-parallel rank r takes global
batches r, r + W, r + 2W, ... Every rank therefore sees each record of its batches once,
the ranks together see every record once per epoch (but the last incomplete round of W
batches), and a batch mixes length bins only where a window's bins leave records over.

Only the current window is in memory (its scalar columns, about 11 bytes per record of
the window) and on local disk (with the next, fetched in the background) when the shards
come through a `ShardCache` (bertcore/train/shard_cache.py): memory and disk grow with the
window, not with the data set.

A batch is a dict of tensors:
    input_ids           (B, T) long   padded with [PAD] to a multiple of 8
    token_type_ids      (B, T) long   0 before segment_b_start, 1 from there to the end
                                      (all 0 with token_types=False: RoBERTa has one type)
    attention_mask      (B, T) long   1 on real tokens
    labels              (B, T) long   original id at masked positions, -100 elsewhere
    next_sentence_label (B,)   long   0/1; -100 where the record has no NSP label (-1 stored)
Static masking reads the stored masks; dynamic masking draws one with `mask_batch`, keyed by
(seed, epoch, global batch index), so each epoch gets a new mask and a rerun the same one.

`state_dict()` records (epoch, batches consumed); a loader restored from it yields exactly
the remaining batches of the uninterrupted epoch, then continues with the next epochs. The
window of the next batch follows from the shards' row counts, so a resume reads nothing
that came before it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import torch
from torch.utils.data import DataLoader

from bertcore.examples.config import length_bin
from bertcore.examples.masking import MaskConfig, mask_batch
from bertcore.rng import keyed_numpy, keyed_seed
from bertcore.train.records import ExamplesDataset, Rows
from bertcore.train.shard_cache import LocalFiles, ShardCache, ShardRef

IGNORE_INDEX = -100


class Collator:
    """Gathered records -> padded tensors (see the module docstring), numpy for the whole
    batch at once."""

    def __init__(
        self,
        *,
        seed: int,
        masking: Literal["static", "dynamic"] = "static",
        mask_config: MaskConfig | None = None,
        pad_id: int | None = None,
        pad_to_multiple_of: int = 8,
        max_length: int | None = None,
        token_types: bool = True,
    ):
        if masking == "dynamic" and mask_config is None:
            raise ValueError("dynamic masking needs a mask_config")
        if pad_id is None:
            if mask_config is None:
                raise ValueError("give pad_id or a mask_config (which knows [PAD])")
            pad_id = mask_config.vocab.special.pad
        self.seed, self.masking, self.mask_config = seed, masking, mask_config
        self.pad_id, self.multiple, self.max_length = pad_id, pad_to_multiple_of, max_length
        self.token_types = token_types
        if mask_config is not None:
            self._never = np.zeros(mask_config.vocab_size, dtype=bool)  # (V,) never a target
            self._never[sorted(mask_config.never_masked)] = True

    def __call__(self, rows: Rows, epoch: int, batch_index: int) -> dict[str, torch.Tensor]:
        lengths = rows.lengths  # (B,)
        longest = int(lengths.max())
        T = math.ceil(longest / self.multiple) * self.multiple
        if self.max_length is not None:
            T = max(longest, min(T, self.max_length))
        B = len(lengths)
        position = np.arange(T)
        real = position < lengths[:, None]  # (B, T) real tokens, in row-major order as rows.ids
        input_ids = np.full((B, T), self.pad_id, dtype=np.int64)
        input_ids[real] = rows.ids
        labels = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
        if self.masking == "static":
            if not rows.mask_counts.any():
                # Static records always have at least one target (the quota is >= 1).
                raise ValueError(
                    "these examples carry no stored masks (written with dynamic masking): use masking='dynamic'"
                )
            labels[np.repeat(np.arange(B), rows.mask_counts), rows.positions] = rows.masked_ids
        token_type_ids = (position >= rows.segment_b_start[:, None]) & real & self.token_types
        nsp = rows.next_sentence_label.astype(np.int64)
        nsp[nsp < 0] = IGNORE_INDEX
        out = {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy(token_type_ids.astype(np.int64)),
            "attention_mask": torch.from_numpy(real.astype(np.int64)),
            "labels": torch.from_numpy(labels),
            "next_sentence_label": torch.from_numpy(nsp),
        }
        if self.masking == "dynamic":
            cfg = self.mask_config
            special_mask = torch.from_numpy(self._never[input_ids] | ~real)
            continuation = torch.from_numpy(cfg.vocab.is_continuation[input_ids] & real)
            generator = torch.Generator().manual_seed(keyed_seed(self.seed, "dynamic-mask", epoch, batch_index) >> 1)
            out["input_ids"], out["labels"] = mask_batch(out["input_ids"], special_mask, continuation, generator, cfg)
        return out


class Batching:
    """How the records of one window become batches of `size`: each group (a length bin, or
    a file when no bins are given) is shuffled and cut into full batches; what the groups
    leave over is batched together, shortest first, so a batch mixes groups only there and a
    window of n records gives exactly n // size batches (ceil with drop_last=False, the last
    one short). The window's batches are then shuffled."""

    def __init__(self, size: int, *, drop_last: bool, shuffle: bool):
        if size < 1:
            raise ValueError("batch_size must be at least 1")
        self.size, self.drop_last, self.shuffle = size, drop_last, shuffle

    def count(self, rows: int) -> int | None:
        """Batches of a window of `rows` records, known before it is read (a batching whose
        count needs the records themselves, packing to a token budget, returns None)."""
        return rows // self.size if self.drop_last else math.ceil(rows / self.size)

    def __call__(self, lengths: np.ndarray, groups: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
        size, batches, leftovers = self.size, [], []
        for group in np.unique(groups):
            members = np.flatnonzero(groups == group)
            if self.shuffle:
                members = rng.permutation(members)
            full = len(members) // size * size
            batches += np.split(members[:full], full // size) if full else []
            leftovers.append(members[full:])
        rest = np.concatenate(leftovers) if leftovers else np.zeros(0, dtype=np.int64)
        rest = rest[np.argsort(lengths[rest], kind="stable")]
        for start in range(0, len(rest), size):
            if len(rest) - start >= size or not self.drop_last:
                batches.append(rest[start : start + size])
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches


@dataclass
class _Window:
    """The records of one window's shards and their batches (record numbers of `records`)."""

    records: ExamplesDataset
    batches: list[np.ndarray]


class _Windows:
    """The shards' windows, opened through the cache: what both the training process and
    DataLoader worker processes read batches from (picklable; a process keeps the last two
    windows it opened)."""

    def __init__(self, loader: ExamplesLoader):
        self.shards, self.cache, self.vocab_size = loader.shards, loader.cache, loader.vocab_size
        self.seed, self.window_shards, self.shuffle = loader.seed, loader.window_shards, loader.shuffle
        self.local_rank = loader.local_rank
        self.length_bins, self.batching, self.collator = loader.length_bins, loader.batching, loader.collator
        self._open: dict[tuple[int, int], _Window] = {}

    def order(self, epoch: int) -> list[np.ndarray]:
        """The epoch's windows: shard numbers, in a keyed order, `window_shards` at a time."""
        n = len(self.shards)
        order = keyed_numpy(self.seed, "loader", epoch, "shards").permutation(n) if self.shuffle else np.arange(n)
        return [order[i : i + self.window_shards] for i in range(0, n, self.window_shards)]

    def refs(self, epoch: int, window: int) -> list[ShardRef]:
        windows = self.order(epoch)
        return [self.shards[i] for i in windows[window]] if window < len(windows) else []

    def open(self, epoch: int, window: int) -> _Window:
        key = (epoch, window)
        if key not in self._open:
            refs = self.refs(epoch, window)
            records = ExamplesDataset(
                self.cache.local_many(refs, start=self.local_rank), self.vocab_size, names=[ref.uri for ref in refs]
            )
            groups = records.file_of if self.length_bins is None else length_bin(records.lengths, self.length_bins)
            rng = keyed_numpy(self.seed, "loader", epoch, "window", window)
            while len(self._open) >= 2:  # the previous window: its maps close with it
                self._open.pop(next(iter(self._open)))
            self._open[key] = _Window(records, self.batching(records.lengths, groups, rng))
        return self._open[key]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": {}}

    def __len__(self) -> int:  # a DataLoader's dataset
        return sum(ref.rows for ref in self.shards)

    def __getitem__(self, key: tuple[int, int, int, int]) -> dict[str, torch.Tensor]:
        """Key (epoch, global batch index, window, batch of the window) -> the collated batch."""
        epoch, batch_index, window, offset = key
        opened = self.open(epoch, window)
        rows = opened.records.rows(opened.batches[offset], masks=self.collator.masking == "static")
        return self.collator(rows, epoch, batch_index)


class ExamplesLoader:
    """Batches of examples shards for one data-parallel rank; streams the shards a window
    at a time; resumable mid-epoch in O(1).

    One global order per epoch, the same for every world size: the shards in a keyed order,
    cut into windows of `window_shards`; each window's records batched (`Batching`) and its
    batches shuffled, all keyed by (seed, epoch, window). Global batch g belongs to rank
    g mod W: rank r takes batches r, r + W, r + 2W, ... Only the current window is read
    (its scalar columns in memory: about 11 bytes per record of the window, none for the
    other windows), and the next one is fetched in the background.

    shards: ShardRefs (bertcore.train.shard_cache; sizes and hashes from the manifest) or
    local file paths. cache: where the shards are read from (a ShardCache; default: the
    local paths as given). window_shards: shards per window (default: all of them, one
    window). length_bins: batch within these length bins (None: within each file, which the
    examples stage already groups by bin). even_batches: every rank gets the same number of
    batches per epoch (the epoch's last, incomplete round of W batches is left out), which
    collective training steps need; False gives each record exactly once per epoch.
    num_workers > 0 reads and collates in DataLoader worker processes. prefetch: fetch the
    next window in the background (local_rank: where on the window this rank starts, so the
    ranks of a machine fetch different shards first). token_budget: packed, padding-free
    batches of at most this many tokens (bertcore/train/packing.py: `TokenBatching` and
    `PackedCollator`; batch_size is then unused), for a model that reads them. The other
    keyword arguments (masking, mask_config, pad_id, pad_to_multiple_of, max_length,
    token_types) are the Collator's, which turns the records into tensors.
    """

    def __init__(
        self,
        shards: Sequence[ShardRef | str | PathLike],
        batch_size: int,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        length_bins: Sequence[int] | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        even_batches: bool = True,
        num_workers: int = 0,
        vocab_size: int | None = None,
        cache: ShardCache | LocalFiles | None = None,
        window_shards: int | None = None,
        local_rank: int = 0,
        prefetch: bool = True,
        token_budget: int | None = None,
        **collate: Any,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.shards = [s if isinstance(s, ShardRef) else local_ref(s) for s in shards]
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.token_budget = token_budget
        if token_budget is None:
            self.batching: Any = Batching(batch_size, drop_last=drop_last, shuffle=shuffle)
            self.collator: Any = Collator(seed=seed, **collate)
        else:  # packed, padding-free batches (bertcore/train/packing.py)
            from bertcore.train.packing import PackedCollator, TokenBatching

            self.batching = TokenBatching(token_budget, shuffle=shuffle)
            packed = {k: collate[k] for k in ("masking", "mask_config", "pad_id") if k in collate}
            self.collator = PackedCollator(seed=seed, **{"masking": "static", **packed})
        self.shuffle, self.drop_last, self.even_batches = shuffle, drop_last, even_batches
        self.num_workers, self.vocab_size, self.local_rank = num_workers, vocab_size, local_rank
        self.prefetch = prefetch
        self.length_bins = None if length_bins is None else list(length_bins)
        self.cache = cache if cache is not None else LocalFiles()
        self.window_shards = max(1, window_shards or len(self.shards) or 1)
        self.windows = _Windows(self)
        self.num_records = sum(ref.rows for ref in self.shards)
        self.epoch = 0
        self._consumed = 0  # batches of self.epoch already yielded
        self._index: _EpochIndex | None = None
        self._anchor: tuple[int, tuple[int, int]] | None = None  # (epoch, (window, first batch)) of a resume

    # -- the global order ----------------------------------------------------------------
    def _epoch_index(self, epoch: int) -> _EpochIndex:
        if self._index is None or self._index.epoch != epoch:
            anchor = self._anchor[1] if self._anchor is not None and self._anchor[0] == epoch else None
            self._index = _EpochIndex(self.windows, epoch, anchor)
        return self._index

    def _global_index(self, epoch: int, k: int) -> int | None:
        """The global batch of this rank's k-th batch of `epoch`, None past its last."""
        index, W = self._epoch_index(epoch), self.world_size
        if not self.even_batches:
            g = self.rank + k * W
            return g if index.locate(g) is not None else None
        if index.locate((k + 1) * W - 1) is not None:  # the whole round is there
            return self.rank + k * W
        if k == 0 and (total := index.total()):  # fewer batches than ranks: one each, wrapped
            return self.rank % total
        return None

    def __len__(self) -> int:
        """Batches this rank yields per epoch (a batching whose counts need the records,
        packing to a token budget, reads every window's lengths for it)."""
        total, W = self._epoch_index(self.epoch).total(), self.world_size
        if not self.even_batches:
            return len(range(self.rank, total, W))
        return total // W if total >= W else int(total > 0)

    def _keys(self, epoch: int, start: int) -> Iterator[tuple[int, int, int, int]]:
        """(epoch, global batch, window, batch of the window) of this rank's batches from its
        `start`-th on; entering a window declares it and the next one to the cache and
        fetches the next in the background."""
        k, entered = start, None
        while (g := self._global_index(epoch, k)) is not None:
            window, offset = self._epoch_index(epoch).locate(g)
            if window != entered:
                self._enter(epoch, window)
                entered = window
            yield epoch, g, window, offset
            k += 1

    def _enter(self, epoch: int, window: int) -> None:
        following = (epoch, window + 1) if window + 1 < self._epoch_index(epoch).windows else (epoch + 1, 0)
        upcoming = self.windows.refs(*following) if self.prefetch else []
        self.cache.need(self.windows.refs(epoch, window) + upcoming)
        self.windows.open(epoch, window)  # downloads what the prefetch has not fetched yet
        if self.prefetch:
            self.cache.prefetch(upcoming, start=self.local_rank)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """The rest of the current epoch; afterwards the loader moves to the next epoch."""
        epoch, start = self.epoch, self._consumed
        keys = self._keys(epoch, start)
        if self.num_workers > 0:
            stream = iter(DataLoader(self.windows, sampler=keys, batch_size=None, num_workers=self.num_workers))
        else:
            stream = (self.windows[key] for key in keys)
        for k, batch in enumerate(stream):
            self._consumed = start + k + 1  # counted before handing over: state_dict is exact
            yield batch
        self.epoch, self._consumed = epoch + 1, 0

    def close(self) -> None:
        """Withdraw from the cache (stop prefetching, let its files go)."""
        self.cache.close()

    # -- resume --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        epoch, consumed = self.epoch, self._consumed
        if self._global_index(epoch, consumed) is None:
            epoch, consumed = epoch + 1, 0
        # the window of the next round's first batch, where a resume (on any world size) starts
        anchor = None if consumed == 0 else self._epoch_index(epoch).window_of(consumed * self.world_size)
        return {
            "epoch": epoch,
            "batches_consumed": consumed,
            "anchor": anchor,
            "seed": self.seed,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "num_records": self.num_records,
            "window_shards": self.window_shards,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume where `state` stopped, without reading what came before (the window of the
        next batch follows from the manifest's row counts); a state of another world size
        resumes too when the batches the ranks consumed together split evenly over this
        one's ranks (global batches go round-robin, so W ranks after k batches each have
        consumed the first W x k batches of the epoch)."""
        mine = {
            "seed": self.seed,
            "batch_size": self.batch_size,
            "num_records": self.num_records,
            "window_shards": self.window_shards,
        }
        for key, value in mine.items():
            if state.get(key) != value:
                raise ValueError(
                    f"loader state has {key}={state.get(key)} but this loader has {value}; "
                    "resume with the same shards, seed, batch size and window"
                )
        consumed = state["batches_consumed"]
        if state["world_size"] != self.world_size:
            together = consumed * state["world_size"]
            if together % self.world_size:
                raise ValueError(
                    f"loader state of {state['world_size']} ranks at {consumed} batches each does not split "
                    f"over {self.world_size} ranks"
                )
            consumed = together // self.world_size
        self.epoch, self._consumed = state["epoch"], consumed
        anchor = state.get("anchor")
        self._anchor = None if anchor is None else (state["epoch"], (int(anchor[0]), int(anchor[1])))
        self._index = None


class _EpochIndex:
    """Where each window's batches begin in one epoch's global order. Known up front when a
    window's batch count follows from its rows (`Batching.count`: batches of a fixed number
    of records); otherwise learnt window by window as the windows are opened (a batching
    that packs to a token budget needs the lengths), starting from the window a resumed
    state names, so a resume reads nothing before it."""

    def __init__(self, windows: _Windows, epoch: int, anchor: tuple[int, int] | None = None):
        self.source, self.epoch = windows, epoch
        order = windows.order(epoch)
        self.windows = len(order)
        self.starts: dict[int, int] = {0: 0}
        if anchor is not None:
            self.starts[anchor[0]] = anchor[1]
        counts = [windows.batching.count(sum(windows.shards[i].rows for i in w)) for w in order]
        if all(c is not None for c in counts):
            self.starts = dict(enumerate(np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).tolist()))
        self._counts = counts

    def _count(self, window: int) -> int:
        count = self._counts[window]
        return count if count is not None else len(self.source.open(self.epoch, window).batches)

    def start(self, window: int) -> int:
        """The global number of `window`'s first batch (`windows`: the epoch's total)."""
        if window not in self.starts:
            base = max(w for w in self.starts if w < window)
            first = self.starts[base]
            for w in range(base, window):
                first += self._count(w)
                self.starts[w + 1] = first
        return self.starts[window]

    def locate(self, g: int) -> tuple[int, int] | None:
        """(window, batch of the window) of global batch g; None past the epoch's end."""
        known = [w for w, first in self.starts.items() if first <= g and w < self.windows]
        window = max(known) if known and g >= 0 else None
        while window is not None and window < self.windows:
            if g < self.start(window + 1):
                return window, g - self.start(window)
            window += 1
        return None

    def window_of(self, g: int) -> list[int] | None:
        """[window, its first batch] of global batch g (a resume's anchor), None past the end."""
        found = self.locate(g)
        return None if found is None else [found[0], self.start(found[0])]

    def total(self) -> int:
        return self.start(self.windows)


def local_ref(path: str | PathLike) -> ShardRef:
    """A ShardRef for a local file given by its path: its rows from the file's footer and
    record batch headers (nothing else read); the bytes are not checked."""
    path = str(path)
    try:
        with pa.memory_map(path) as source:
            reader = ipc.open_file(source)
            rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
    except (OSError, pa.ArrowInvalid) as exc:
        raise ValueError(f"{path}: not a readable examples shard ({exc})") from None
    return ShardRef(uri=path, rows=rows, bytes=os.path.getsize(path))
